"""Benchmarks behind ``codex-lab bench NAME [--json]``: each lesson's ``bench.py``.

Each bench module (``codex_lab/lessons/lNN_topic/bench.py``) defines ``NAME: str``, ``HELP: str``, ``add_arguments(parser)`` and
``run(args) -> list[dict]``: flat records (one per measured case) that the CLI prints as
a table or, with ``--json``, as a JSON list. Ratios are always taken within one run.
"""

from __future__ import annotations

import argparse
from types import ModuleType

from codex_lab.course.plugins import lesson_modules
from codex_lab.runtime.mode import Mode


def discover() -> dict[str, ModuleType]:
    """Benchmark modules by their NAME."""
    mods = lesson_modules("bench")
    return {m.NAME: m for m in mods if hasattr(m, "NAME")}




def add_bench_arguments(p: argparse.ArgumentParser, mod: ModuleType) -> None:
    """The options of ``codex-lab bench NAME``: ``--json``, ``--out``, the bench's own and,
    for benches that load one model, ``--hf DIR``."""
    p.add_argument("--json", action="store_true", help="print a JSON list of flat records")
    p.add_argument("--out", default=None, help="also write the JSON records to this file")
    mod.add_arguments(p)
    if hasattr(mod, "load_model_and_tokenizer"):  # benches that load one model can take a HF folder
        p.add_argument("--hf", default=None, metavar="DIR", help="run on a Hugging Face save_pretrained folder")


def run_bench(name: str, argv: list[str], mode: Mode) -> list[dict]:
    """Run bench ``name`` in-process with command-line arguments ``argv`` (as after
    ``codex-lab bench NAME``) in ``mode`` (as ``--mode``) and return its records: the
    report measures the performance goals through exactly the command a learner reruns."""
    mod = discover()[name]
    p = argparse.ArgumentParser(prog=f"codex-lab bench {name}")
    add_bench_arguments(p, mod)
    args = p.parse_args(argv)
    args.mode = mode
    return mod.run(args)
