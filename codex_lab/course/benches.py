"""Benchmarks behind ``codex-lab bench NAME [--json]``: each lesson's ``bench.py``.

Each bench module (``codex_lab/lessons/lNN_topic/bench.py``) defines ``NAME: str``, ``HELP: str``, ``add_arguments(parser)`` and
``run(args) -> list[dict]``: flat records (one per measured case) that the CLI prints as
a table or, with ``--json``, as a JSON list. Ratios are always taken within one run.
"""

from __future__ import annotations

from types import ModuleType

from codex_lab.course.plugins import lesson_modules


def discover() -> dict[str, ModuleType]:
    """Benchmark modules by their NAME."""
    mods = lesson_modules("bench")
    return {m.NAME: m for m in mods if hasattr(m, "NAME")}



def run_bench(name: str, argv: list[str]) -> list[dict]:
    """Run bench ``name`` in-process with command-line arguments ``argv`` (as after
    ``codex-lab bench NAME``) and return its records: the report measures the performance
    goals through exactly the command a learner reruns."""
    import argparse

    mod = discover()[name]
    p = argparse.ArgumentParser(prog=f"codex-lab bench {name}")
    mod.add_arguments(p)
    known = {a.dest for a in p._actions}
    if "mode" not in known:  # the global --mode of `codex-lab bench` (fast/full from runtime otherwise)
        p.add_argument("--mode", default=None)
    for opt, default in (("json", False), ("out", None), ("hf", None)):
        if opt not in known:
            p.set_defaults(**{opt: default})
    return mod.run(p.parse_args(argv))
