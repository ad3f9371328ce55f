#!/usr/bin/env bash
# The decode and serving benchmarks against llama.cpp, run one after another and each recorded into
# codex_lab/assets/bench_records.json (scripts/update_figures.py --bench), with the command and the
# conditions. Run it on a quiet machine (nothing else running: no training, no tests, no helper)
# after `bash scripts/build_llama_cpp.sh` (llama-bench, llama-server from source) and
# `bash scripts/get_llama_cpp.sh` (node-llama-cpp, the in-process peer). Takes about an hour on
# 2 cores. Every command keeps all its rounds in its rows; the record says the load at its start.
#
#   bash scripts/record_benches.sh                 # every key below
#   bash scripts/record_benches.sh restart decode_1thread   # only these keys
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$HOME/.cache/codex_lab/bench_runs}"
mkdir -p "$OUT"
declare -A CMD=(
  [llama_cpp]="codex-lab bench inference --peer llama.cpp --threads 1 --json"
  [llama_cpp_2threads]="codex-lab bench inference --peer llama.cpp --threads 2 --json"
  [llama_cpp_q8_0]="codex-lab bench inference --peer llama.cpp --peer-precision q8_0 --threads 1 --json"
  [llama_cpp_q8_0_2threads]="codex-lab bench inference --peer llama.cpp --peer-precision q8_0 --threads 2 --json"
  [serving_llama_cpp]="codex-lab bench --mode full serving --compiled --concurrency 1,8 --max-tokens 128 --peer llama.cpp --json"
  [serving_llama_cpp_process]="codex-lab bench --mode full serving --compiled --engine-process --concurrency 1,8 --max-tokens 128 --peer llama.cpp --json"
  [single_stream]="codex-lab bench inference --scenarios single_stream --threads 1 --json"
  [decode_1thread]="codex-lab bench --mode full inference --scenarios decode --threads 1 --json"
  [code_edit]="codex-lab bench --mode full inference --scenarios code_edit --json"
  [restart]="python scripts/restart_time.py --json"
  [native_profile]="codex-lab bench inference --scenarios native_profile --threads 1 --json"
)
ORDER=(restart decode_1thread llama_cpp llama_cpp_2threads llama_cpp_q8_0 llama_cpp_q8_0_2threads single_stream
       serving_llama_cpp serving_llama_cpp_process code_edit native_profile)
keys=("$@")
[ ${#keys[@]} -gt 0 ] || keys=("${ORDER[@]}")
for key in "${keys[@]}"; do
  cmd="${CMD[$key]:-}"
  [ -n "$cmd" ] || { echo "record_benches: no key '$key'; choose from: ${ORDER[*]}" >&2; exit 2; }
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "== $key: $cmd (load $load at the start)" >&2
  start=$(date +%s)
  $cmd > "$OUT/$key.json"
  echo "   $(( $(date +%s) - start )) s" >&2
  python scripts/update_figures.py --bench "$key" "$OUT/$key.json" --command "$cmd" \
    --conditions "${CONDITIONS:-quiet machine} (load average $load at the start), one run, $(nproc) cores"
done
