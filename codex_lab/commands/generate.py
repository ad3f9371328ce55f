"""codex-lab generate: continue a code prompt with a checkpoint."""

from __future__ import annotations

import argparse

NAME = "generate"
HELP = "continue a prompt (greedy, temperature, top-k, top-p) with the shipped or a given checkpoint"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help='code to continue, e.g. "def fibonacci(n):"')
    p.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the shipped tiny model)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None)


def main(args: argparse.Namespace) -> int:
    from codex_lab.training.checkpoint import load_checkpoint, load_pretrained
    from codex_lab.infer.generate import generate
    from codex_lab.runtime import get_device

    device = get_device(args.device)
    ck = load_checkpoint(args.checkpoint, device) if args.checkpoint else load_pretrained(device)
    g = generate(ck.model, ck.tokenizer, args.prompt, max_new_tokens=args.max_new_tokens,
                 temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    print(args.prompt + g.text)
    print(f"\n[{len(g.ids)} tokens, finish_reason={g.finish_reason}]")
    return 0
