"""Inputs of codebench 2's hidden tests: fixed edge cases built from a program's constants, plus seeded ones.

For a ``list`` program the edge cases are: the empty list, a one-element list, for every
int constant ``c`` the boundary values ``[c - 1, c, c + 1]`` and a list mixing ``c + 1``,
``-c``, ``c`` (twice) and ``c - 1`` (duplicates and a negative number around every
threshold, amount and count), a list of negatives around zero and a list with duplicates.
For a ``str`` program: the empty string, one character, padded text with two spaces inside,
for every character constant a text full of it (in both cases), and for every int constant
words of ``c - 1``, ``c`` and ``c + 1`` letters (the boundaries of slices and word lengths).

Seeded inputs come from ``random.Random("inputs:" + uid)``: the same program gets the same
inputs on every machine. :func:`probe_pool` is a larger pool (edge + 40 random inputs) used
at build time to decide which mutants are really different programs (see :mod:`.oracle`).
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

from codex_lab.evals.codebench2.dsl import Program, char_constants, int_constants

WORDS: tuple[str, ...] = ("apple", "Bob", "sea", "lo", "a", "tree", "ELSE", "Oslo", "is", "salsa", "eel", "go")
N_RANDOM_TESTS = 3   # seeded inputs in every hidden test set
N_RANDOM_PROBES = 40  # seeded inputs in the build-time probe pool


def _random_list(rng: random.Random) -> list[int]:
    return [rng.randint(-5, 12) for _ in range(rng.randint(0, 8))]


def _random_text(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(0, 5))]
    text = "".join(w + " " * rng.choice((1, 1, 2)) for w in words).rstrip(" ")
    return " " * rng.choice((0, 0, 1)) + text + " " * rng.choice((0, 0, 2))


def edge_inputs(program: Program) -> list[Any]:
    """The fixed edge cases for ``program`` (deduplicated, in a fixed order)."""
    ints = list(dict.fromkeys(int_constants(program)))
    if program.input_type == "list":
        out: list[Any] = [[], [ints[0] if ints else 5]]
        for c in ints:
            out += [[c - 1, c, c + 1], [c + 1, -c, c, c, c - 1]]
        out += [[-3, 4, -1, 0, 2], [2, 7, 2, 5, 5, 1]]
    else:
        out = ["", "a", "  Hello World  ", "the quick  brown fox"]
        for ch in dict.fromkeys(char_constants(program)):
            out.append(f"{ch}b{ch}{ch} c{ch} {ch.upper()}x")
        for c in ints:
            out.append(" ".join("abcdefgh"[:n] for n in (max(c - 1, 1), c, c + 1)))
    seen: list[Any] = []
    for x in out:
        if x not in seen:
            seen.append(x)
    return seen


def random_inputs(program: Program, n: int, *, salt: str = "tests") -> list[Any]:
    """``n`` seeded inputs of the program's input type (``salt`` separates independent streams)."""
    rng = random.Random(f"inputs:{salt}:{program.uid}")
    make = _random_list if program.input_type == "list" else _random_text
    return [make(rng) for _ in range(n)]


def hidden_inputs(program: Program) -> list[Any]:
    """The hidden tests' base inputs: edge cases + :data:`N_RANDOM_TESTS` seeded inputs."""
    out = edge_inputs(program)
    for x in random_inputs(program, N_RANDOM_TESTS):
        if x not in out:
            out.append(x)
    return out


def example_inputs(program: Program) -> list[Any]:
    """Two inputs for the docstring's ``>>>`` examples (a separate seeded stream, non-empty)."""
    rng = random.Random(f"inputs:examples:{program.uid}")
    make = _random_list if program.input_type == "list" else _random_text
    out: list[Any] = []
    while len(out) < 2:
        x = make(rng)
        if x and x not in out and len(x) <= 24:
            out.append(x)
    return out


@lru_cache(maxsize=16_384)
def probe_pool(program: Program) -> tuple[Any, ...]:
    """Edge cases + :data:`N_RANDOM_PROBES` seeded inputs: where programs are told apart at build time."""
    out = hidden_inputs(program)
    for x in random_inputs(program, N_RANDOM_PROBES, salt="probes"):
        if x not in out:
            out.append(x)
    return tuple(out)
