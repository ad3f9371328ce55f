"""Find what each lesson plugs into the course: its bench, report section and checks.

A lesson's own code lives in one folder, ``codex_lab/lessons/lNN_topic/``. The course finds
its parts by name: ``bench.py`` (``codex-lab bench``), ``report.py`` (``codex-lab report``)
and ``checks.py`` (exercise checks for ``codex-lab grade`` and the notebooks' ``check()``).
Adding a lesson means adding that folder; nothing here changes.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from types import ModuleType

from codex_lab import lessons

KINDS = ("bench", "report", "checks")


def lesson_packages() -> list[str]:
    """Dotted names of the lesson packages, in lesson order (``codex_lab.lessons.l00_tour``, ...)."""
    return sorted(f"{lessons.__name__}.{m.name}" for m in pkgutil.iter_modules(lessons.__path__) if m.ispkg)


def lesson_modules(kind: str) -> list[ModuleType]:
    """The ``kind`` module ("bench", "report" or "checks") of every lesson that has one."""
    if kind not in KINDS:
        raise ValueError(f"unknown lesson module kind {kind!r}; choose one of {KINDS}")
    found = []
    for pkg in lesson_packages():
        name = f"{pkg}.{kind}"
        if importlib.util.find_spec(name) is not None:
            found.append(importlib.import_module(name))
    return found
