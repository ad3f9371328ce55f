#!/usr/bin/env bash
# The GPU measurements recorded in docs/GPU.md, as one script (one lease of a GPU machine).
#
#   CORPUS=/path/to/python3.11/stdlib OUT=/tmp/gpu_out bash scripts/gpu_session.sh
#
# 1. trains two candidates of the shipped model's exact shape (tiny preset: d=256, 4 layers,
#    4 heads, the shipped tokenizer) on the same corpus as the shipped model (CORPUS: the
#    Python 3.11 standard library, so the train/validation split is the same files);
# 2. scores the shipped model and both candidates on every held-out token and on syntax
#    validity (codex-lab eval heldout) and copies the best candidate's checkpoint to OUT
#    (model.safetensors in two parts: the machine returns files of at most 16 MiB);
# 3. runs the benches on the GPU: decode (HF generate vs FastDecoder, compiled and as a
#    CUDA graph), sparse attention (SDPA, blocks, FlexAttention, fast), MoE dispatch,
#    prompt-lookup on code edits and continuous batching.
# Every stage has its own time limit and a failed stage does not stop the next one.
set -u
OUT=${OUT:-/tmp/gpu_out}
CORPUS=${CORPUS:?set CORPUS to the Python 3.11 standard library folder}
STEPS=${STEPS:-3000}
DEVICE=${DEVICE:-cuda}   # DEVICE=cpu MODE=fast SIZES=512 STEPS=6 CODEX_LAB_FAST=1: a dry run of the mechanics on a CPU
MODE=${MODE:-full}
SIZES=${SIZES:-4096 8192 16384}
mkdir -p "$OUT" /tmp/runs /tmp/bench
export PYTHONUNBUFFERED=1 CODEX_LAB_PROGRESS=0 TOKENIZERS_PARALLELISM=true
export CODEX_LAB_FAST=${CODEX_LAB_FAST:-0}  # the real sizes (a dry run on a CPU sets CODEX_LAB_FAST=1)
CL="python3 -m codex_lab.cli"
LOG=$OUT/log.txt
log() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
merge() {  # every bench's records so far, one JSON list (written after each bench: a kill keeps them)
  python3 -c "import json,glob; print(json.dumps([r for f in sorted(glob.glob('/tmp/bench/*.json')) for r in json.load(open(f))], indent=1))" > "$OUT/bench.json"
}

log "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys,torch,transformers,tokenizers; print(sys.version.split()[0], torch.__version__, transformers.__version__, tokenizers.__version__, torch.cuda.get_device_name())"
  nproc; } 2>&1 | tee -a "$LOG"

log "train A (batch 128 x 256 tokens) and B (batch 64 x 512 tokens), $STEPS steps each, at once"
common="--preset tiny --corpus $CORPUS --tokenizer codex_lab/assets/tiny/tokenizer.json --device $DEVICE --no-progress --steps $STEPS --eval-every $((STEPS / 6))"
timeout 200 $CL train $common --out /tmp/runs/A --batch-size 128 --seq-len 256 > /tmp/runs/A.log 2>&1 &
timeout 200 $CL train $common --out /tmp/runs/B --batch-size 64 --seq-len 512 > /tmp/runs/B.log 2>&1 &
wait
tail -n 3 /tmp/runs/A.log /tmp/runs/B.log | tee -a "$LOG"

log "held-out comparison"
cks=(--checkpoint shipped)
for r in A B; do [ -f /tmp/runs/$r/checkpoint/model.safetensors ] && cks+=(--checkpoint /tmp/runs/$r/checkpoint); done
timeout 90 $CL eval heldout "${cks[@]}" --corpus "$CORPUS" --device $DEVICE --json > "$OUT/heldout.json" 2>> "$LOG"
cat "$OUT/heldout.json" >> "$LOG"
best=$(python3 -c "
import json
rows = [r for r in json.load(open('$OUT/heldout.json')) if r['checkpoint'] != 'shipped']
print(min(rows, key=lambda r: r['loss_nats_per_token'])['checkpoint'] if rows else '')" 2>> "$LOG")
if [ -n "$best" ]; then
  log "best candidate: $best"
  cp "$best/config.json" "$best/meta.json" "$OUT/"
  split -b 9M "$best/model.safetensors" "$OUT/model.safetensors.part."
  sha256sum "$best/model.safetensors" | tee -a "$LOG"
fi

log "bench decode (batch 1, 128 new tokens)"
timeout 120 $CL bench --mode $MODE inference --device $DEVICE --scenarios decode --json --out /tmp/bench/1_decode.json > /dev/null 2>> "$LOG"; merge
log "bench attention: SDPA, blocks, FlexAttention"
timeout 100 $CL bench --mode $MODE attention --device $DEVICE --sizes $SIZES --impls sdpa blocks flex --backward --json --out /tmp/bench/2_attention.json > /dev/null 2>> "$LOG"; merge
log "bench attention: fast"
timeout 40 $CL bench --mode $MODE attention --device $DEVICE --sizes $SIZES --impls sdpa fast --backward --json --out /tmp/bench/3_attention_fast.json > /dev/null 2>> "$LOG"; merge
log "bench moe"
timeout 40 $CL bench --mode $MODE moe --device $DEVICE --json --out /tmp/bench/4_moe.json > /dev/null 2>> "$LOG"; merge
log "bench code_edit and batching"
timeout 50 $CL bench --mode $MODE inference --device $DEVICE --scenarios code_edit,batching --json --out /tmp/bench/5_code_edit.json > /dev/null 2>> "$LOG"; merge
log "done"
