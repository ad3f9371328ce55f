"""``python -m codex_lab.evals.codebench2``: print the DSL's size and every split's sizes (programs, structures).

Add ``--example SPLIT`` to print one test problem of each family of that split.
"""

from __future__ import annotations

import argparse
from collections import Counter

from codex_lab.evals.codebench2.dsl import PRIMITIVES
from codex_lab.evals.codebench2.problems import FAMILIES, load_problems, sizes
from codex_lab.evals.codebench2.splits import PARTS, PROGRAM_SPLITS, SPLITS, programs, split_summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m codex_lab.evals.codebench2", description=__doc__)
    ap.add_argument("--example", choices=SPLITS, default=None, help="print one test problem per family of this split")
    args = ap.parse_args(argv)
    by_sig = Counter(f"{p.src}->{p.dst}" for p in PRIMITIVES)
    print(f"DSL: {len(PRIMITIVES)} primitives ({', '.join(f'{k}: {v}' for k, v in sorted(by_sig.items()))})")
    for s in PROGRAM_SPLITS:
        summary = split_summary(s)
        lengths = {part: sorted(Counter(len(p.steps) for p in programs(s, part)).items()) for part in PARTS}
        print(f"{s:<8} " + "; ".join(f"{part} {summary[part]['programs']} programs / {summary[part]['structures']} "
                                      f"structures, steps {dict(lengths[part])}" for part in PARTS))
    distinct = len({p.source() for s in PROGRAM_SPLITS for part in PARTS for p in programs(s, part)})
    print(f"distinct canonical programs over the three DSL splits: {distinct}; problems per program: "
          f"{len(FAMILIES)} ({', '.join(FAMILIES)})")
    legacy = sizes()["legacy"]
    print(f"legacy   the first codebench, per family: " + "; ".join(f"{k} {v}" for k, v in legacy.items()))
    if args.example:
        for p in load_problems(args.example, "all", n=1):
            print(f"\n--- {p.task_id} (prompt, then the canonical answer)\n{p.prompt}\n--- answer\n"
                  f"{p.canonical_solution}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
