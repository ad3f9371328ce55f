"""Checks for graded exercises: each lesson's ``codex_lab/lessons/lNN_topic/checks.py``.

A check receives the learner's function and raises ``AssertionError`` with a helpful
message when it is wrong; ``NotImplementedError`` from the function means "not yet done".
Register a check with ``@exercise("NN", "function_name")``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from codex_lab.course.plugins import lesson_modules

CheckFn = Callable[[Callable[..., Any]], None]


@dataclass(frozen=True)
class Exercise:
    """One graded exercise: the lesson number ("00"), the function name and its check."""

    lesson: str
    name: str
    check: CheckFn
    points: int = 1


REGISTRY: dict[tuple[str, str], Exercise] = {}


def exercise(lesson: str, name: str, points: int = 1) -> Callable[[CheckFn], CheckFn]:
    """Decorator registering ``check`` for the function ``name`` of lesson ``lesson``."""

    def deco(check: CheckFn) -> CheckFn:
        REGISTRY[(lesson, name)] = Exercise(lesson, name, check, points)
        return check

    return deco


def load_all() -> dict[tuple[str, str], Exercise]:
    """Import every check module of this package; return the registry."""
    lesson_modules("checks")  # importing a checks module registers its exercises
    return REGISTRY


def exercises_for(lesson: str) -> list[Exercise]:
    """The exercises of one lesson, in registration order."""
    return [e for (les, _), e in load_all().items() if les == lesson]
