"""Tools the exercise checks share: inputs drawn per grading run, calls that must leave their
arguments alone, and answers taken as plain bool / float whatever numeric type carried them.

Inputs: :func:`rng` gives a ``torch.Generator`` seeded from this process's *run seed*, drawn
from ``secrets`` when the process starts and never printed; two gradings of the same file
see different numbers, so an answer that hard-codes a check's inputs fails. Checks keep a
few hand-made cases too (they name the usual mistakes); the drawn ones are what a lookup
table cannot pass. ``CODEX_LAB_CHECK_SEED`` pins the seed (to replay one run while debugging a check).
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import secrets
from typing import Any, Callable

_RUN_SEED = int(os.environ.get("CODEX_LAB_CHECK_SEED") or secrets.randbits(63))


def _derive(tag: object) -> int:
    return int.from_bytes(hashlib.sha256(f"{_RUN_SEED}:{tag}".encode()).digest()[:8], "big") >> 1


def rng(tag: object) -> Any:
    """A ``torch.Generator`` for ``tag`` (e.g. the exercise name), seeded from the run seed."""
    import torch

    return torch.Generator().manual_seed(_derive(tag))


def pyrng(tag: object) -> random.Random:
    """A ``random.Random`` for ``tag``, seeded from the run seed (plain-number inputs)."""
    return random.Random(_derive(tag))


def _snapshot(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, list):
        return [_snapshot(v) for v in x]
    if isinstance(x, dict):
        return {k: _snapshot(v) for k, v in x.items()}
    return x


def _same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.equal(a.detach().nan_to_num(0.5), b.detach().nan_to_num(0.5))
                and bool((a.detach().isnan() == b.detach().isnan()).all()))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def pure_call(fn: Callable[..., Any], names: tuple[str, ...] | list[str], *args: Any) -> Any:
    """``fn(*args)``, then fail if it changed one of its arguments in place (named by ``names``).

    The caller's tensors are the model's activations or a cache: scaling ``q`` in place or
    writing into ``expert_idx`` corrupts them for everything that runs after."""
    before = [_snapshot(a) for a in args]
    out = fn(*args)
    for name, old, new in zip(names, before, args):
        if not _same(old, new):
            raise AssertionError(f"your function changed its argument `{name}` in place (e.g. `{name} *= ...`, "
                                 f"`{name}[...] = ...` or an in-place method ending in `_`): the caller still needs it; "
                                 f"work on a new tensor (`{name} = {name} * ...`) or a `.clone()`")
    return out


def as_bool(x: Any) -> Any:
    """``x`` as a ``bool`` when it is a bool of any library (``numpy.bool_``, a one-element bool
    tensor); anything else unchanged (the check then says what type it got)."""
    if isinstance(x, bool):
        return x
    np = _numpy()
    return bool(x) if np is not None and isinstance(x, np.bool_) else x


def as_float(x: Any) -> Any:
    """``x`` as a ``float`` when it is a float of any library (``numpy.float32/64``); else unchanged."""
    if type(x) is float:
        return x
    np = _numpy()
    return float(x) if np is not None and isinstance(x, np.floating) else x


def as_int(x: Any) -> Any:
    """``x`` as an ``int`` when it is an integer of any library (``numpy.int64``); else unchanged."""
    if type(x) is int:
        return x
    np = _numpy()
    return int(x) if np is not None and isinstance(x, np.integer) else x


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover
        return None
    return numpy


def overflow(got: Any, want: Any) -> bool:
    """True when ``got`` has NaN or inf where ``want`` is finite: a softmax that did not
    subtract the row max before ``exp`` (exp(x) overflows float32 for x > 88.7)."""
    import torch

    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) or got.shape != want.shape:
        return False
    bad = ~torch.isfinite(got.detach().float())
    return bool((bad & torch.isfinite(want.float())).any())


OVERFLOW = ("large scores give inf / NaN: exp(x) overflows float32 for x > 88.7; subtract each row's max before exp "
            "(softmax(x) = softmax(x - max(x))), or use torch.softmax")
