"""codex-lab generate: continue a code prompt with a checkpoint."""

from __future__ import annotations

import argparse

NAME = "generate"
HELP = "continue a prompt (greedy, temperature, top-k, top-p) with the shipped or a given checkpoint"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help='code to continue, e.g. "def fibonacci(n):"')
    p.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the shipped tiny model)")
    p.add_argument("--hf", default=None, metavar="DIR",
                   help="Hugging Face save_pretrained folder (Llama, Qwen2, Mixtral), converted offline")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0, help="keep tokens with p >= MIN_P x the top token's (0 = off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="vLLM's: logits of tokens already in prompt or output divided (> 0) or multiplied (< 0) by it")
    p.add_argument("--keep-special-tokens", action="store_true",
                   help="print special tokens (FIM sentinels, task tags) in the text; by default they are left out "
                        "as vLLM and llama.cpp do, and a FIM sentinel generated outside a FIM prompt ends the answer")
    p.add_argument("--aot", action="store_true",
                   help="decode with the step compiled ahead of time (AOTInductor, a CPU): the first run for a model "
                        "builds its package (tens of seconds) and keeps it in the compile cache; later runs load it")
    p.add_argument("--device", default=None)


def main(args: argparse.Namespace) -> int:
    from codex_lab.errors import InputError
    from codex_lab.infer.generate import generate
    from codex_lab.infer.sampling import SamplingParams
    from codex_lab.runtime import get_device
    from codex_lab.training.checkpoint import load_checkpoint, load_pretrained

    params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, min_p=args.min_p,
                            repetition_penalty=args.repetition_penalty,
                            skip_special_tokens=not args.keep_special_tokens)
    try:
        params.validate()
    except ValueError as exc:  # the field names map to the flags: max_tokens is --max-new-tokens
        raise InputError(f"{exc} (flags --max-new-tokens, --temperature, --top-k, --top-p, --min-p, --repetition-penalty)") from exc
    from codex_lab.runtime import compute_threads
    import torch

    # the course's thread policy (1 math thread on <= 2 cores, else all but one; CODEX_LAB_THREADS=N):
    # torch's default of every core made 64 tokens 2.4x slower on a busy 2-core machine
    torch.set_num_threads(compute_threads())
    device = get_device(args.device)
    if args.hf and args.checkpoint:
        raise InputError("give --checkpoint or --hf, not both")
    if args.hf:
        from codex_lab.hf.folder import load_hf_folder

        ck = load_hf_folder(args.hf, device)
    else:
        ck = load_checkpoint(args.checkpoint, device) if args.checkpoint else load_pretrained(device)
    if args.aot and device.type != "cpu":
        raise InputError(f"--aot builds a CPU package; drop it on {device.type} (or pass --device cpu)")
    g = generate(ck.model, ck.tokenizer, args.prompt, params, cache="aot" if args.aot else "static")
    print(args.prompt + g.text)
    print(f"\n[{len(g.ids)} tokens, finish_reason={g.finish_reason}]")
    return 0
