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

