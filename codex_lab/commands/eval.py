"""codex-lab eval humaneval: pass@k on HumanEval with the course's engine and sandbox.
codex-lab eval codebench: pass@k per family and split on the course's own executable benchmark (codebench 2's
  iid / length / compose splits by program structure, or the first codebench with --split legacy).
codex-lab eval heldout: checkpoints compared on the held-out corpus (loss on every token, syntax validity)."""

from __future__ import annotations

import argparse
import json
import sys
import time

NAME = "eval"
HELP = ("score a checkpoint: humaneval or codebench (pass@k, executed in the sandbox) or heldout "
        "(loss, syntax validity)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    h = sub.add_parser("humaneval", help="HumanEval (164 problems, Chen et al. 2021): pass@k",
                       description="Complete each HumanEval prompt with the engine, run its tests in the "
                                   "sandbox and print the unbiased pass@k.")
    src = h.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", default=None, help="course checkpoint folder (default: the shipped tiny model)")
    src.add_argument("--hf", default=None, metavar="DIR",
                     help="Hugging Face save_pretrained folder (Llama, Qwen2, Mixtral), converted offline")
    src.add_argument("--canonical", action="store_true",
                     help="oracle: score the reference solutions through the same execution path (must be 1.0)")
    h.add_argument("--n-samples", type=int, default=1, help="completions per problem (pass@k needs n >= k)")
    h.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (use > 0 with --n-samples > 1)")
    h.add_argument("--top-p", type=float, default=0.95)
    h.add_argument("--max-new-tokens", type=int, default=384)
    h.add_argument("--batch-size", type=int, default=16, help="requests the engine runs at once")
    h.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N problems")
    h.add_argument("--workers", type=int, default=None, help="sandbox runs at once (default: CPU count, at most 8)")
    h.add_argument("--timeout", type=float, default=10.0, help="seconds per program")
    h.add_argument("--seed", type=int, default=0)
    h.add_argument("--device", default=None)
    h.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="with --hf")
    h.add_argument("--json", action="store_true", help="print a JSON list of flat records")
    h.add_argument("--out", default=None, help="also write the per-sample results (JSON lines) here")
    h.add_argument("--no-progress", action="store_true", help="no tqdm bar")

    c = sub.add_parser("codebench", help="codebench 2 (held-out program structure; completion, bugfix, testgen, "
                                         "translate, fim) or the first codebench (--split legacy): pass@k",
                       description="Answer each held-out codebench problem with the engine (or take the canonical "
                                   "answers), run its hidden tests (Python in the sandbox, JavaScript under node) and "
                                   "print pass@k per family with a 95% bootstrap interval over problems and the "
                                   "near-duplicate audit. --split iid|length|compose: codebench 2 (ExeDec-style "
                                   "splits by program structure); --split legacy: the first codebench.")
    csrc = c.add_mutually_exclusive_group()
    csrc.add_argument("--checkpoint", default=None, help="course checkpoint folder (default: the shipped tiny model)")
    csrc.add_argument("--canonical", action="store_true",
                      help="oracle: score the reference answers through the same execution path (must be 1.0)")
    c.add_argument("--split", default="legacy", choices=["iid", "length", "compose", "legacy"],
                   help="benchmark split: codebench 2's iid / length / compose, or legacy = the first codebench "
                        "(default legacy, the first codebench's behaviour)")
    c.add_argument("--family", action="append", default=None,
                   choices=["completion", "bugfix", "testgen", "translate", "fim", "all"],
                   help="only this family (repeat for several; default all: five, four for legacy)")
    c.add_argument("--n", "--per-family", dest="per_family", type=int, default=None, metavar="N",
                   help="draw N problems per family with --seed (default: all held-out problems)")
    c.add_argument("--part", default="test", choices=["test", "val", "train"],
                   help="which part of the split to score (test = the held-out problems)")
    c.add_argument("--n-samples", type=int, default=1, help="answers per problem (pass@k needs n >= k)")
    c.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (use > 0 with --n-samples > 1)")
    c.add_argument("--top-p", type=float, default=0.95)
    c.add_argument("--max-new-tokens", type=int, default=None,
                   help="default 48 for legacy, 192 for codebench 2 (its longest canonical answer, a JavaScript "
                        "function, is ~160 tokens of the shipped tokenizer)")
    c.add_argument("--batch-size", type=int, default=32, help="requests the engine runs at once")
    c.add_argument("--workers", type=int, default=None,
                   help="sandbox runs at once (legacy; default: CPU count, at most 8)")
    c.add_argument("--timeout", type=float, default=5.0, help="seconds per program")
    c.add_argument("--seed", type=int, default=0,
                   help="which problems --n draws and the bootstrap's seed; sample j uses seed + j")
    c.add_argument("--device", default=None)
    c.add_argument("--json", action="store_true", help="print a JSON list of flat records")
    c.add_argument("--no-progress", action="store_true", help="no tqdm bar")

    v = sub.add_parser("heldout", help="held-out corpus: loss on every validation token, bits/char, syntax validity",
                       description="Score one or more checkpoints on the same held-out text: mean loss over every "
                                   "validation token (nats/token; comparable when tokenizers are equal), bits per "
                                   "character (comparable across tokenizers) and the share of greedy function "
                                   "bodies that parse.")
    v.add_argument("--checkpoint", action="append", default=None, metavar="DIR",
                   help="checkpoint folder; repeat to compare several ('shipped' = the shipped tiny model, the default)")
    v.add_argument("--corpus", default=None, help="folder of code (default: the Python standard library)")
    v.add_argument("--seq-len", type=int, default=256)
    v.add_argument("--batch-size", type=int, default=32)
    v.add_argument("--prompts", type=int, default=32, help="function prompts for syntax validity (0: skip)")
    v.add_argument("--max-new-tokens", type=int, default=96)
    v.add_argument("--device", default=None)
    v.add_argument("--json", action="store_true", help="print a JSON list of flat records")


def _progress(total: int, desc: str, off: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=off, file=sys.stderr, leave=False)


def _heldout(args: argparse.Namespace) -> int:
    from codex_lab.data.corpus import load_corpus
    from codex_lab.errors import InputError
    from codex_lab.evals.heldout import paired_verdicts, score_checkpoint
    from codex_lab.runtime import get_device
    from codex_lab.training.checkpoint import load_checkpoint, load_pretrained

    if args.seq_len < 2 or args.batch_size < 1 or args.prompts < 0 or args.max_new_tokens < 1:
        raise InputError("--seq-len must be >= 2, --batch-size >= 1, --prompts >= 0, --max-new-tokens >= 1")
    device = get_device(args.device)
    corpus = load_corpus(args.corpus)
    rows = []
    for name in args.checkpoint or ["shipped"]:
        ck = load_pretrained(device) if name == "shipped" else load_checkpoint(name, device)
        rows.append(score_checkpoint(ck, corpus, name, seq_len=args.seq_len, batch_size=args.batch_size,
                                     prompts=args.prompts, max_new_tokens=args.max_new_tokens))
    pairs = [paired_verdicts(rows[0], r) for r in rows[1:]]  # each later checkpoint against the first
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    if args.json:
        print(json.dumps(public + [{"comparison": p} for p in pairs], indent=2))
        return 0
    for r in public:
        syn = f"{r['syntax_validity']:.3f}" if r["syntax_validity"] is not None else "not scored"
        print(f"{r['checkpoint']}: {r['loss_nats_per_token']:.4f} nats/token over {r['tokens_scored']:,} held-out "
              f"tokens, {r['bits_per_char']:.4f} bits/char, syntax validity {syn} "
              f"({r['syntax_prompts']} prompts) [{r['loss_s'] + r['syntax_s']:.0f} s on {r['device']}]")
    for p in pairs:
        line = f"{p['new']} vs {p['base']}: "
        if "bits_per_char_diff" in p:
            line += (f"bits/char {p['bits_per_char_diff']:+.4f} (95% CI [{p['bits_per_char_lo']:+.4f}, "
                     f"{p['bits_per_char_hi']:+.4f}] over {p['windows']} paired windows; lower is better) -> "
                     f"{p['bits_per_char_verdict']}; ")
        else:
            line += f"bits/char {p['bits_per_char_verdict']}; "
        if "syntax_diff" in p:
            line += (f"syntax validity {p['syntax_diff']:+.3f} (95% CI [{p['syntax_lo']:+.3f}, {p['syntax_hi']:+.3f}] "
                     f"over {p['prompts']} paired prompts) -> {p['syntax_verdict']}")
        else:
            line += f"syntax validity {p['syntax_verdict']}"
        print(line)
    return 0


def _codebench(args: argparse.Namespace) -> int:
    from codex_lab.errors import InputError
    from codex_lab.evals import codebench_run as cr
    from codex_lab.evals import codebench2 as c2

    if args.per_family is not None and args.per_family < 1:
        raise InputError(f"--n must be >= 1, got {args.per_family}")
    if args.n_samples < 1 or args.temperature < 0 or (args.max_new_tokens is not None and args.max_new_tokens < 1):
        raise InputError("--n-samples and --max-new-tokens must be >= 1 and --temperature >= 0")
    legacy = args.split == "legacy"
    choices = c2.LEGACY_FAMILIES if legacy else c2.FAMILIES
    families = list(dict.fromkeys(args.family or ["all"]))
    families = list(choices) if "all" in families else families
    bad = [f for f in families if f not in choices]
    if bad:
        raise InputError(f"--split {args.split} has no family {', '.join(bad)}; choose from {[*choices, 'all']}")
    problems = c2.load_problems(args.split, families, part=args.part, n=args.per_family, seed=args.seed)
    t0 = time.perf_counter()
    if args.canonical:
        completions, source, temp = c2.canonical_completions(problems), "canonical", None
    else:
        from codex_lab.runtime import get_device
        from codex_lab.training.checkpoint import load_checkpoint, load_pretrained

        device = get_device(args.device)
        ck = load_checkpoint(args.checkpoint, device) if args.checkpoint else load_pretrained(device)
        source, temp = args.checkpoint or "shipped", args.temperature
        max_new = args.max_new_tokens or (48 if legacy else 192)
        with _progress(len(problems) * args.n_samples, "generate", args.no_progress) as bar:
            completions = cr.complete(ck.model, ck.tokenizer, problems, n_samples=args.n_samples,
                                      temperature=args.temperature, top_p=args.top_p, max_new_tokens=max_new,
                                      batch_size=args.batch_size, seed=args.seed, progress=bar.update)
    if legacy:  # the first codebench's path: one sandboxed process per program (HumanEval's runner)
        with _progress(sum(len(c) for c in completions), "execute", args.no_progress) as bar:
            results = cr.execute(problems, completions, workers=args.workers, timeout_s=args.timeout,
                                 progress=lambda: bar.update())
    else:
        results = c2.execute(problems, completions, timeout_s=args.timeout)
    seconds = time.perf_counter() - t0
    audit = c2.split_audit(args.split, problems)
    rows = c2.score_rows(problems, results, split=args.split, ks=(1, 10, 100), seed=args.seed, source=source,
                         seconds=seconds, audit_result=audit)
    if legacy:  # the first codebench's record format (benchmark "codebench"), plus the new fields
        for r in rows:
            r["benchmark"], r["temperature"] = "codebench", temp
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for line in c2.format_rows(rows):
        print(line)
    print(audit.line() + (f"; e.g. {', '.join(audit.examples)}" if audit.examples else ""))
    return 0


def main(args: argparse.Namespace) -> int:
    if getattr(args, "benchmark", None) == "heldout":
        return _heldout(args)
    if getattr(args, "benchmark", None) == "codebench":
        return _codebench(args)
    if getattr(args, "benchmark", None) != "humaneval":
        print("choose a benchmark: humaneval, codebench or heldout", file=sys.stderr)
        return 2
    import torch

    from codex_lab.errors import InputError
    from codex_lab.evals import humaneval as he

    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit must be >= 1, got {args.limit}")
    if args.n_samples < 1:
        raise InputError(f"--n-samples must be >= 1, got {args.n_samples}")
    if args.temperature < 0:
        raise InputError(f"--temperature must be >= 0, got {args.temperature}")
    try:
        problems = he.load_problems(args.limit)
    except ModuleNotFoundError as exc:
        raise InputError(str(exc)) from None
    t0 = time.perf_counter()
    cut = 0
    if args.canonical:
        completions, source, temp = he.canonical_completions(problems), "canonical", None
    else:
        from codex_lab.runtime import get_device

        device = get_device(args.device)
        if args.hf:
            from codex_lab.hf.folder import load_hf_folder

            ck = load_hf_folder(args.hf, device, dtype=getattr(torch, args.dtype))
            source = f"hf:{args.hf}"
        else:
            from codex_lab.training.checkpoint import load_checkpoint, load_pretrained

            ck = load_checkpoint(args.checkpoint, device) if args.checkpoint else load_pretrained(device)
            source = args.checkpoint or "shipped"
        temp = args.temperature
        with _progress(len(problems) * args.n_samples, "generate", args.no_progress) as bar:
            completions, cut = he.complete(ck.model, ck.tokenizer, problems, n_samples=args.n_samples,
                                           temperature=args.temperature, top_p=args.top_p,
                                           max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                           seed=args.seed, progress=bar.update)
    with _progress(sum(len(c) for c in completions), "execute", args.no_progress) as bar:
        rows, results = he.evaluate(problems, completions, source=source, temperature=temp, workers=args.workers,
                                    timeout_s=args.timeout, started=t0, prompts_cut=cut,
                                    progress=lambda: bar.update())
    if args.out:
        from pathlib import Path

        out = Path(args.out)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text("".join(json.dumps({"task_id": r.task_id, "completion": r.completion, "passed": r.passed,
                                           "detail": r.detail}) + "\n" for rs in results for r in rs))
        tmp.replace(out)  # atomic: never a half-written file
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"humaneval {r['source']}: pass@{r['k']} = {r['pass_at_k']:.4f} over {r['problems']} problems "
                  f"({r['samples']} samples each, {r['time_s']:.1f} s)")
        if cut:
            print(f"note: {cut} prompts were longer than the model's context and kept their last tokens")
    return 0
