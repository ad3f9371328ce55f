"""Checks for graded exercises: each lesson's ``codex_lab/lessons/lNN_topic/checks.py``,
plus an instructor's hidden checks (any folder of ``.py`` files, ``codex-lab grade --hidden DIR``).

A check receives the learner's function and raises ``AssertionError`` with a helpful
message when it is wrong; ``NotImplementedError`` from the function means "not yet done".

Register a check::

    @exercise("04", "top_k_route", points=3, forbid=("codex_lab.nn.moe.route",))
    def check_top_k_route(fn):
        with case(1, "shapes and dtypes"):
            ...asserts...
        with case(2, "picks the k largest logits"):
            ...asserts...

* ``points`` (default 1) is the exercise's maximum. Each ``case(points, label)`` block is
  worth its points: a failing assertion (or a crash of the learner's code) inside it costs
  only that case, and the check goes on. Points not given to cases are earned only when
  the whole check finishes with every case passed (so a check without cases is
  all-or-nothing, as before). Case points may not add up to more than ``points``.
* ``forbid``: dotted names of package functions that answer the exercise. While the check
  runs, a call of one of them *from the learner's code* (directly or through other package
  code) raises ``ForbiddenCall`` ("write this one yourself"); the check itself may still
  call them as its oracle. A submitted function that *is* a package function (imported
  instead of written) earns 0 with the same message.
* The plain ``@exercise("NN", "name")`` form still works (1 point, nothing forbidden).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from codex_lab.course.plugins import lesson_modules

CheckFn = Callable[[Callable[..., Any]], None]
PUBLIC, HIDDEN = "public", "hidden"


@dataclass(frozen=True)
class Exercise:
    """One graded exercise: lesson ("00"), function name, check, maximum points, what it
    forbids, and whether it is a public (shipped) or hidden (instructor's) check."""

    lesson: str
    name: str
    check: CheckFn
    points: int = 1
    forbid: tuple[str, ...] = ()
    visibility: str = PUBLIC


REGISTRY: dict[tuple[str, str], Exercise] = {}
_target: list[dict[tuple[str, str], Exercise]] = [REGISTRY]
_visibility: list[str] = [PUBLIC]


def exercise(lesson: str, name: str, points: int = 1, forbid: tuple[str, ...] | list[str] = ()) -> Callable[[CheckFn], CheckFn]:
    """Decorator registering ``check`` for the function ``name`` of lesson ``lesson``.

    ``points``: the maximum (split among ``case`` blocks, see the module docstring);
    ``forbid``: dotted names of package functions blocked for the learner's code while it runs.
    """
    if not isinstance(points, int) or points < 1:
        raise ValueError(f"exercise {lesson} {name}: points must be a positive int, got {points!r}")
    if isinstance(forbid, str):
        raise ValueError(f"exercise {lesson} {name}: forbid takes a tuple of dotted names, got the string {forbid!r}")

    def deco(check: CheckFn) -> CheckFn:
        _target[-1][(lesson, name)] = Exercise(lesson, name, check, points, tuple(forbid), _visibility[-1])
        return check

    return deco


# ---- partial credit ---------------------------------------------------------------------

@dataclass
class CaseLog:
    """What the ``case`` blocks of one running check recorded."""

    declared: int = 0
    earned: int = 0
    failures: list[str] = field(default_factory=list)


_local = threading.local()


@contextlib.contextmanager
def recording() -> Iterator[CaseLog]:
    """Collect the ``case`` outcomes of the check run inside this block (used by the grader)."""
    log = CaseLog()
    prev = getattr(_local, "log", None)
    _local.log = log
    try:
        yield log
    finally:
        _local.log = prev


@contextlib.contextmanager
def case(points: int, label: str = "") -> Iterator[None]:
    """A part of a check worth ``points``: an assertion error or a crash inside it costs only
    these points (recorded with ``label``), and the check continues after the block.
    ``NotImplementedError`` ("not yet done") and ``SystemExit`` pass through.
    Outside the grader (no recording) it is a plain block."""
    log: CaseLog | None = getattr(_local, "log", None)
    if log is None:
        yield
        return
    log.declared += points
    try:
        yield
    except (NotImplementedError, SystemExit, KeyboardInterrupt):
        raise
    except AssertionError as exc:
        log.failures.append(f"[{label or 'case'}: 0/{points}] {exc or 'a check failed'}")
    except Exception as exc:  # the learner's code crashed in this case
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        line = f" (line {tb.tb_lineno})" if tb is not None else ""
        line = str(getattr(exc, "codex_lab_where", line))  # raised in the submission's process: its own line
        log.failures.append(f"[{label or 'case'}: 0/{points}] {type(exc).__name__}: {exc}{line}")
    else:
        log.earned += points


# ---- registries ---------------------------------------------------------------------------

def load_all() -> dict[tuple[str, str], Exercise]:
    """Import every check module of this package; return the (public) registry."""
    lesson_modules("checks")  # importing a checks module registers its exercises
    return REGISTRY


def load_lesson(lesson: str) -> dict[tuple[str, str], Exercise]:
    """Import only lesson ``lesson``'s check module (faster than :func:`load_all`); return the registry."""
    import importlib

    from codex_lab.course.plugins import lesson_packages

    for pkg in lesson_packages():
        if pkg.rsplit(".", 1)[-1].startswith(f"l{lesson}_") and importlib.util.find_spec(f"{pkg}.checks") is not None:
            importlib.import_module(f"{pkg}.checks")
    return REGISTRY


def exercises_for(lesson: str) -> list[Exercise]:
    """The public exercises of one lesson, in registration order."""
    return [e for (les, _), e in load_all().items() if les == lesson]


_HIDDEN_CACHE: dict[str, dict[tuple[str, str], Exercise]] = {}


def load_hidden(folder: str | Path) -> dict[tuple[str, str], Exercise]:
    """Import every ``*.py`` of an instructor's hidden-check folder (same ``@exercise`` API).

    Returns its own registry (the public one is untouched); each exercise is marked hidden.
    """
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"no hidden-check folder at {str(folder)!r}; pass --hidden DIR holding *.py checks")
    if str(folder) in _HIDDEN_CACHE:
        return _HIDDEN_CACHE[str(folder)]
    reg: dict[tuple[str, str], Exercise] = {}
    _target.append(reg)
    _visibility.append(HIDDEN)
    try:
        for i, path in enumerate(sorted(folder.glob("*.py"))):
            name = f"codex_lab_hidden_checks_{abs(hash(str(folder)))}_{i}_{path.stem}"
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    finally:
        _target.pop()
        _visibility.pop()
    if not reg:
        raise ValueError(f"{str(folder)!r} registers no @exercise checks; see docs/INSTRUCTORS.md, hidden checks")
    _HIDDEN_CACHE[str(folder)] = reg
    return reg
