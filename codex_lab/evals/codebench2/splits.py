"""The splits of codebench 2, ExeDec style: every test set is held out by program STRUCTURE.

ExeDec (Shi et al. 2023, arXiv 2307.13883) measures compositional generalisation on the
DeepCoder DSL with train/test splits that differ in *how operations are composed*, never in
constants alone. Here (one benchmark split = one ``train`` / ``val`` / ``test`` triple):

- ``iid``: programs of 1-4 steps from one distribution; the part of a program is a stable
  hash of its structure signature (primitive names in order, constants masked): 20% of
  structures test, 5% val, the rest train. A test structure never occurs in training with
  any constants.
- ``length``: train (and val) on 1-2 steps, test on 3-4 steps (ExeDec's length
  generalisation). Val structures are held out from train by hash, like ``iid``.
- ``compose``: a stable hash puts 25% of the type-valid adjacent pairs of primitives
  ("bigrams") aside. Training and val programs use none of them; a test program (2-4 steps)
  is built only from them, and only from primitives that occur in the training programs.
  So no two operations adjacent in a test program are adjacent in any training program,
  while every primitive of the test set is seen in training.
- ``legacy``: the first codebench (:mod:`codex_lab.evals.codebench`), kept importable and
  scorable; its test set is held out by (template, constant) only, which the near-duplicate
  audit shows (:mod:`.audit`).

Sizes (programs per part): :data:`SIZES`; everything is deterministic (``random.Random``
seeded by the split and part names), so the same programs come out on every machine.
"""

from __future__ import annotations

import hashlib
import random
from functools import lru_cache
from typing import Callable, Sequence

from codex_lab.evals.codebench2.dsl import (
    ARG_NAMES, FUNC_NAMES, Program, Step, random_args, successors,
)
from codex_lab.evals.codebench2.oracle import well_formed

SPLITS: tuple[str, ...] = ("iid", "length", "compose", "legacy")
PROGRAM_SPLITS: tuple[str, ...] = ("iid", "length", "compose")  # the ones built from the DSL
PARTS: tuple[str, ...] = ("train", "val", "test")
SIZES: dict[str, int] = {"train": 1200, "val": 48, "test": 200}
# shares of structures (iid) or of bigrams (compose), in basis points of a sha1 bucket
TEST_BP, VAL_BP, HELD_BIGRAM_BP = 2_000, 500, 2_500
LENGTHS: dict[str, dict[str, tuple[int, ...]]] = {  # allowed numbers of steps per split and part
    "iid": {"train": (1, 2, 3, 4), "val": (1, 2, 3, 4), "test": (1, 2, 3, 4)},
    "length": {"train": (1, 2), "val": (1, 2), "test": (3, 4)},
    "compose": {"train": (1, 2, 3, 4), "val": (1, 2, 3, 4), "test": (2, 3, 4)},
}
LENGTH_WEIGHTS: dict[int, int] = {1: 1, 2: 2, 3: 3, 4: 3}  # longer programs are most of the space
LIST_SHARE = 0.65  # share of programs whose input is a list of ints (the rest: a string)
STAY_SHARE = 0.7  # chance that a step keeps the value's type (when another type is reachable)


def bucket(text: str) -> int:
    """A stable bucket in 0..9999 (the same on every machine, unlike ``hash``)."""
    # bucket = int(sha1(text)) mod 10_000
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16) % 10_000


def check_split(split: str, choices: Sequence[str] = SPLITS) -> str:
    """``split`` if known, else a ``ValueError`` naming the choices."""
    if split not in choices:
        raise ValueError(f"unknown split {split!r}; choose from {list(choices)}")
    return split


def held_out_bigram(a: str, b: str) -> bool:
    """``compose``: is the adjacent pair (a then b) reserved for test programs?"""
    return bucket(f"codebench2:bigram:{a}>{b}") < HELD_BIGRAM_BP


def bigrams(signature: Sequence[str]) -> list[tuple[str, str]]:
    """Adjacent pairs of a structure signature."""
    return list(zip(signature, signature[1:]))


def structure_part(split: str, signature: Sequence[str]) -> str:
    """The part (train / val / test) a structure belongs to in ``split`` ("none" when it belongs nowhere)."""
    b = bucket(f"codebench2:{split}:" + "|".join(signature))
    n = len(signature)
    if split == "iid":
        return "test" if b < TEST_BP else "val" if b < TEST_BP + VAL_BP else "train"
    if split == "length":
        if n >= 3:
            return "test"
        return "val" if b < VAL_BP else "train"
    if split == "compose":
        held = [held_out_bigram(x, y) for x, y in bigrams(signature)]
        if held and all(held):
            return "test"
        if any(held):
            return "none"  # mixes reserved and training bigrams: in no part
        return "val" if b < VAL_BP else "train"
    raise ValueError(f"unknown split {split!r}; choose from {list(PROGRAM_SPLITS)}")


def _walk(rng: random.Random, n: int, allow: Callable[[str | None, str], bool]) -> tuple[str, list[Step]] | None:
    """A random type-correct chain of ``n`` steps whose adjacent pairs satisfy ``allow`` (None: dead end)."""
    t = "list" if rng.random() < LIST_SHARE else "str"
    start, steps, prev = t, [], None
    for j in range(n):
        # int is a sink (only int -> int steps follow it): enter it with at most one step left after it,
        # so that programs are not mostly chains of arithmetic on a reduced value
        options = [p for p in successors(t) if allow(prev, p.key) and not (p.dst == "int" != t and n - j - 1 > 1)]
        if not options:
            return None
        # pick the next type first (stay: STAY_SHARE, change: the rest, split evenly), then a primitive of it,
        # so that rare type changes (split, join, the reducers) are not drowned by the many same-type steps
        stay = [p for p in options if p.dst == t]
        moves = sorted({p.dst for p in options if p.dst != t})
        groups = ([stay] if stay else []) + [[p for p in options if p.dst == d] for d in moves]
        if not moves:
            weights = [1.0]
        else:
            weights = ([STAY_SHARE] if stay else []) + [(1.0 - STAY_SHARE if stay else 1.0) / len(moves)] * len(moves)
        p = rng.choice(rng.choices(groups, weights=weights)[0])
        steps.append(Step(p.key, random_args(p, rng)))
        t, prev = p.dst, p.key
    return start, steps


def sample_program(rng: random.Random, split: str, part: str) -> Program | None:
    """One random well-formed program of ``split``'s ``part``, or None when a draw is rejected."""
    lengths = LENGTHS[split][part]
    n = rng.choices(lengths, weights=[LENGTH_WEIGHTS[k] for k in lengths])[0]
    if split == "compose":
        want_held = part == "test"
        allow = lambda a, b: a is None or held_out_bigram(a, b) == want_held  # noqa: E731
    else:
        allow = lambda a, b: True  # noqa: E731
    walk = _walk(rng, n, allow)
    if walk is None:
        return None
    t, steps = walk
    program = Program(t, tuple(steps), arg=rng.choice(ARG_NAMES[t]), name=rng.choice(FUNC_NAMES))
    if structure_part(split, program.signature) != part:
        return None
    if split == "compose" and part != "train" and not set(program.signature) <= _train_primitives(split):
        return None  # compose: new combinations of known primitives only
    return program if well_formed(program) else None


@lru_cache(maxsize=None)
def programs(split: str, part: str) -> tuple[Program, ...]:
    """The ``part`` programs of ``split`` (distinct canonical sources), :data:`SIZES` [part] of them.

    Raises:
        ValueError: an unknown split or part.
        RuntimeError: the sampler could not find enough programs (a DSL change made a part too small).
    """
    check_split(split, PROGRAM_SPLITS)
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; choose from {list(PARTS)}")
    rng = random.Random(f"codebench2:{split}:{part}")
    out: dict[str, Program] = {}
    tries = 0
    while len(out) < SIZES[part]:
        tries += 1
        if tries > 200 * SIZES[part]:
            raise RuntimeError(f"{split}/{part}: only {len(out)} programs after {tries} draws")
        p = sample_program(rng, split, part)
        if p is not None:
            out.setdefault(p.source(), p)
    return tuple(out.values())


@lru_cache(maxsize=None)
def _train_primitives(split: str) -> frozenset[str]:
    return frozenset(primitives_used(programs(split, "train")))


def primitives_used(progs: Sequence[Program]) -> set[str]:
    """Primitive names occurring in ``progs``."""
    return {k for p in progs for k in p.signature}


def split_summary(split: str) -> dict[str, dict[str, int]]:
    """Programs and distinct structures per part of a DSL split."""
    return {part: {"programs": len(programs(split, part)),
                   "structures": len({p.signature for p in programs(split, part)})} for part in PARTS}

