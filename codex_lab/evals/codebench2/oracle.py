"""Wrong-answer oracle and hidden tests of codebench 2, decided by execution at build time.

A **mutant** is a program one edit away from the canonical one (the bugs a model makes):

- ``constant``: an off-by-one constant (``c - 1``, ``c + 1``) or the next character / separator;
- ``operator``: a primitive swapped for one with the same signature (``>`` for ``<``,
  ``>=`` for ``>``, ``take`` for ``drop``, ``sum`` for ``len``; :attr:`Primitive.swaps`);
- ``order``: two adjacent steps swapped (where the types still compose);
- ``drop``: one step missing, a partial program (where the types still compose).

A mutant counts only when it is a *different* program: its outputs differ from the
canonical program's on the probe pool (:func:`~.inputs.probe_pool`, edge cases + 40 seeded
inputs); equivalent rewrites (``reverse`` then ``map`` = ``map`` then ``reverse``) are not
wrong answers and are dropped.

**Well-formed programs** (:func:`well_formed`): the output is not constant over the pool,
and every step matters (dropping any one step, where the types allow it, changes an
output). So a "partial program" is always a wrong answer.

**Hidden tests** (:func:`hidden_tests`): the fixed and seeded inputs of
:func:`~.inputs.hidden_inputs`; then, for every mutant that none of them kills, the first
pool input that does is added. So every hidden test set distinguishes the canonical
program from every mutant by construction (tests check it again by running the programs).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

from codex_lab.evals.codebench2.dsl import DOMAINS, Program, Step, check_types
from codex_lab.evals.codebench2.inputs import hidden_inputs, probe_pool

MAX_ABS = 2 ** 31  # outputs stay well inside JavaScript's exact integers (2**53) and JSON
KINDS: tuple[str, ...] = ("constant", "operator", "order", "drop")


@dataclass(frozen=True)
class Mutant:
    """A wrong program: ``kind`` (one of :data:`KINDS`), a short description and the program."""

    kind: str
    what: str
    program: Program


def outputs(program: Program, xs: Sequence[Any]) -> tuple[Any, ...]:
    """The program's output on each input (an exception is recorded as ``("!", its type name)``)."""
    fn = program.function()
    out: list[Any] = []
    for x in xs:
        try:
            out.append(fn(list(x) if isinstance(x, list) else x))
        except Exception as exc:  # a mutant may fail (e.g. a dropped step leaves a wrong type)
            out.append(("!", type(exc).__name__))
    return tuple(out)


def first_difference(program: Program, xs: Sequence[Any], ys: Sequence[Any]) -> int | None:
    """Index of the first input of ``xs`` where ``program``'s output is not ``ys``'s (None: none; stops early)."""
    fn = program.function()
    for j, (x, y) in enumerate(zip(xs, ys)):
        try:
            got = fn(list(x) if isinstance(x, list) else x)
        except Exception as exc:
            got = ("!", type(exc).__name__)
        if got != y:
            return j
    return None


@lru_cache(maxsize=16_384)
def _pool(program: Program) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(probe pool, the canonical outputs on it), computed once per program."""
    pool = tuple(probe_pool(program))
    return pool, outputs(program, pool)


def _sane(ys: tuple[Any, ...]) -> bool:
    """Every output is an int, a str, or a list of them, within :data:`MAX_ABS` (so JSON and JS agree)."""
    for y in ys:
        for item in (y if isinstance(y, list) else [y]):
            if isinstance(item, bool) or not isinstance(item, (int, str)):
                return False
            if isinstance(item, int) and abs(item) > MAX_ABS:
                return False
    return True


def _composes(program: Program, steps: tuple[Step, ...]) -> bool:
    try:
        check_types(program.input_type, steps)
    except TypeError:
        return False
    return True


def _with(program: Program, steps: tuple[Step, ...]) -> Program:
    return Program(program.input_type, steps, arg=program.arg, name=program.name)


def well_formed(program: Program) -> bool:
    """True when the outputs are sane, not constant over the pool, and no step can be dropped."""
    pool, ys = _pool(program)
    if not _sane(ys) or len({repr(y) for y in ys}) < 2:
        return False
    for j in range(len(program.steps)):
        rest = program.steps[:j] + program.steps[j + 1:]
        if _composes(program, rest) and first_difference(_with(program, rest), pool, ys) is None:
            return False  # step j is dead: the program equals its partial version
    return True


def _next(values: tuple[Any, ...], v: Any) -> Any:
    return values[(values.index(v) + 1) % len(values)]


def candidates(program: Program) -> list[Mutant]:
    """Every one-edit program of the four kinds, type-checked (not yet tested for difference)."""
    out: list[Mutant] = []
    steps = program.steps
    for j, s in enumerate(steps):
        for a, (kind, v) in enumerate(zip(s.prim.params, s.args)):
            if isinstance(v, int):
                news = [v - 1, v + 1]
            else:
                news = [_next(DOMAINS[kind], v)]
            for nv in news:
                args = s.args[:a] + (nv,) + s.args[a + 1:]
                out.append(Mutant("constant", f"step {j + 1}: {s.key} constant {v!r} -> {nv!r}",
                                  _with(program, steps[:j] + (Step(s.key, args),) + steps[j + 1:])))
        for key in s.prim.swaps:
            new = steps[:j] + (Step(key, s.args),) + steps[j + 1:]
            if _composes(program, new):
                out.append(Mutant("operator", f"step {j + 1}: {s.key} -> {key}", _with(program, new)))
    for j in range(len(steps) - 1):
        new = steps[:j] + (steps[j + 1], steps[j]) + steps[j + 2:]
        if _composes(program, new):
            out.append(Mutant("order", f"steps {j + 1} and {j + 2} swapped", _with(program, new)))
    for j in range(len(steps)):
        new = steps[:j] + steps[j + 1:]
        if _composes(program, new):
            out.append(Mutant("drop", f"step {j + 1} ({steps[j].key}) missing", _with(program, new)))
    return out


@lru_cache(maxsize=16_384)
def mutants(program: Program) -> tuple[Mutant, ...]:
    """The wrong-answer oracle: one-edit programs that differ from ``program`` on the probe pool.

    Deduplicated by source, in the order of :func:`candidates` (constant, operator, order, drop).
    """
    pool, ys = _pool(program)
    seen = {program.source()}
    out = []
    for m in candidates(program):
        src = m.program.source()
        if src in seen:
            continue
        seen.add(src)
        if first_difference(m.program, pool, ys) is not None:
            out.append(m)
    return tuple(out)


@lru_cache(maxsize=16_384)
def hidden_tests(program: Program) -> tuple[tuple[Any, Any], ...]:
    """(input, expected output) pairs: the base inputs, plus a killing input for every surviving mutant.

    Expected outputs come from running the canonical program (its Python rendering) here.
    """
    xs = hidden_inputs(program)
    pool, ys = _pool(program)
    base = outputs(program, xs)
    for m in mutants(program):
        if first_difference(m.program, xs, base) is not None:
            continue
        killer = pool[first_difference(m.program, pool, ys)]  # not None: a mutant differs on the pool
        xs.append(killer)
        base = base + outputs(program, [killer])
    return tuple((x, program.run(x)) for x in xs)


def killing_input(program: Program, mutant: Program) -> Any:
    """The first hidden-test input on which ``mutant`` and ``program`` differ (the canonical testgen probe)."""
    xs = [x for x, _ in hidden_tests(program)]
    j = first_difference(mutant, xs, outputs(program, xs))
    if j is not None:
        return xs[j]
    raise ValueError(f"no hidden test input tells {mutant.uid} from {program.uid}")
