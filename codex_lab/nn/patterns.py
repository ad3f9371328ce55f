"""Attention patterns: which keys each query may attend to.

A pattern answers ``allowed(q_pos, k_pos)`` for broadcastable integer position tensors;
causality is always part of the answer (``k_pos <= q_pos``). Working from positions (not
from a fixed N x N mask) lets the same pattern serve training, a KV cache whose keys sit
at arbitrary positions, and a rolling window buffer.

Patterns (spec strings in brackets, so per-layer schedules fit in a JSON config):

- dense causal (``"dense"``);
- local window of ``w`` keys (``"window:128"``);
- token-strided, Child et al. 2019: ``(i - j) mod s == 0`` (``"strided:32"``);
- fixed, Child et al. 2019: same block of ``l`` tokens, plus the last ``c`` "summary"
  positions of every earlier block (``"fixed:128:8"``);
- global tokens: the first ``g`` positions are visible to every query (``"global:4"``);
- block-granular strided: whole ``b``-token key blocks whose distance in blocks from the
  query's block is a multiple of ``s`` (``"blockstride:128:16"``), the variant a
  block-sparse kernel can actually skip;
- unions of any of them (``"window:128+blockstride:128:16"``);
- learned, content-based blocks (MoBA, Lu et al. 2025; ``"moba:64:4"``): its own block plus
  the top-k earlier blocks picked by q . mean(K of block), so no position-only ``allowed``
  exists (:class:`MoBA`; computed by :mod:`codex_lab.nn.moba`); no unions with it.

Every pattern gives its (N, N) mask, its exact count of attended pairs, its density (the
fraction of the N(N+1)/2 causal pairs it keeps), the tiles it touches, and the cost the
source article's arithmetic predicts: N * (keys one query can reach), i.e. N * (w + N/s)
for a window plus a stride.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


def causal_pairs(n: int) -> int:
    """Number of (query, key) pairs of dense causal attention over n tokens: n(n+1)/2."""
    # sum_{i=0}^{n-1} (i + 1) = n (n + 1) / 2
    return n * (n + 1) // 2


@dataclass(frozen=True)
class AttentionPattern:
    """Base class: the dense causal pattern."""

    @property
    def spec(self) -> str:
        """The string that :func:`parse_pattern` turns back into this pattern."""
        return "dense"

    @property
    def is_dense(self) -> bool:
        """True when the pattern is plain causal attention."""
        return True

    def allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Boolean tensor: may the query at ``q_pos`` attend to the key at ``k_pos``?"""
        return k_pos <= q_pos

    def mask(self, n: int, device: torch.device | str | None = None) -> Tensor:
        """The (n, n) boolean mask for a sequence of length n starting at position 0."""
        pos = torch.arange(n, device=device)
        return self.allowed(pos[:, None], pos[None, :])

    def reach(self, n: int) -> int:
        """Upper bound on the keys one query can see in a length-n sequence (the article's
        "w + N/s"); the basis of :meth:`predicted_cost`."""
        return n

    def predicted_cost(self, n: int) -> int:
        """Predicted attended pairs, N * reach(N): for window w + stride s, N * (w + N/s).

        An upper bound: it charges every query the reach of the last one, so it overcounts
        the strided part about 2x against :meth:`pairs` (a query at i reaches i/s keys).
        """
        # cost = N * (w + N / s)
        return n * self.reach(n)

    def pairs(self, n: int, chunk: int = 1024) -> int:
        """Exact number of allowed (query, key) pairs for length n (computed in row chunks,
        so memory stays O(chunk * n))."""
        _check_len(n)
        total = 0
        for start in range(0, n, chunk):
            end = min(n, start + chunk)
            q = torch.arange(start, end, dtype=torch.int32)
            k = torch.arange(end, dtype=torch.int32)  # causal: no key after the chunk's last query
            total += int(self.allowed(q[:, None], k[None, :]).sum())
        return total

    def density(self, n: int) -> float:
        """Fraction of the n(n+1)/2 causal pairs the pattern keeps (1.0 = dense)."""
        # d = pairs / (n (n + 1) / 2)
        return self.pairs(n) / causal_pairs(n)

    def tiles(self, n: int, block: int = 128) -> Tensor:
        """(nb, nb) boolean: does tile (query block i, key block j) hold any allowed pair?

        ``nb = ceil(n / block)``; positions past n are ignored. A block-sparse kernel
        computes exactly these tiles and skips the rest.
        """
        _check_len(n)
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        nb = -(-n // block)
        out = torch.zeros(nb, nb, dtype=torch.bool)
        for i in range(nb):
            q = torch.arange(i * block, min(n, (i + 1) * block), dtype=torch.int32)
            # causal: only key blocks 0..i can hold an allowed pair
            k = torch.arange((i + 1) * block, dtype=torch.int32)
            m = self.allowed(q[:, None], k[None, :]) & (k < n)[None, :]  # (block, (i+1)*block)
            out[i, : i + 1] = m.view(len(q), i + 1, block).any(dim=2).any(dim=0)
        return out

    def __add__(self, other: "AttentionPattern") -> "AttentionPattern":
        """``a + b`` is the union of two patterns."""
        return union(self, other)


Dense = AttentionPattern


def _check_len(n: int) -> None:
    if n < 1:
        raise ValueError(f"sequence length must be >= 1, got {n}")


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class LocalWindow(AttentionPattern):
    """Sliding window: each query sees itself and the ``window - 1`` keys before it."""

    window: int

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")

    @property
    def spec(self) -> str:
        return f"window:{self.window}"

    @property
    def is_dense(self) -> bool:
        return False

    def allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        # causal and within the window: 0 <= q - k < w
        return (k_pos <= q_pos) & (q_pos - k_pos < self.window)

    def reach(self, n: int) -> int:
        return min(self.window, n)


@dataclass(frozen=True)
class Strided(AttentionPattern):
    """Token-strided (Child et al. 2019, the "column" half): keys at distances 0, s, 2s, ..."""

    stride: int

    def __post_init__(self) -> None:
        _positive("stride", self.stride)

    @property
    def spec(self) -> str:
        return f"strided:{self.stride}"

    @property
    def is_dense(self) -> bool:
        return self.stride == 1

    def allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        # causal and (i - j) mod s == 0
        return (k_pos <= q_pos) & (torch.remainder(q_pos - k_pos, self.stride) == 0)

    def reach(self, n: int) -> int:
        # the last query sees ceil(N / s) keys
        return -(-n // self.stride)


@dataclass(frozen=True)
class Fixed(AttentionPattern):
    """Fixed pattern (Child et al. 2019): the query's own block of ``block`` tokens, plus the
    last ``summary`` positions of every earlier block (which carry its summary)."""

    block: int
    summary: int

    def __post_init__(self) -> None:
        _positive("block", self.block)
        _positive("summary", self.summary)
        if self.summary > self.block:
            raise ValueError(f"summary={self.summary} cannot exceed block={self.block}")

    @property
    def spec(self) -> str:
        return f"fixed:{self.block}:{self.summary}"

    @property
    def is_dense(self) -> bool:
        return self.summary == self.block

    def allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        # causal and (floor(j / l) == floor(i / l)  or  j mod l >= l - c)
        same_block = torch.div(k_pos, self.block, rounding_mode="floor") == torch.div(q_pos, self.block, rounding_mode="floor")
        summary = torch.remainder(k_pos, self.block) >= self.block - self.summary
        return (k_pos <= q_pos) & (same_block | summary)

    def reach(self, n: int) -> int:
        # own block + c summary keys of each of the N / l blocks
        return min(n, self.block + self.summary * (-(-n // self.block)))


@dataclass(frozen=True)
class GlobalTokens(AttentionPattern):
    """The first ``n_global`` positions (e.g. a file header) are visible to every query.

    Causally, a global *query* (position < g) already sees all earlier keys, so this is
    ``k < g`` on top of causality.
    """

    n_global: int

    def __post_init__(self) -> None:
        _positive("n_global", self.n_global)

    @property
    def spec(self) -> str:
        return f"global:{self.n_global}"

    @property
    def is_dense(self) -> bool:
        return False

    def allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        # causal and j < g
        return (k_pos <= q_pos) & (k_pos < self.n_global)

    def reach(self, n: int) -> int:
        return min(self.n_global, n)


@dataclass(frozen=True)
class BlockStrided(AttentionPattern):
    """Block-granular strided: whole key blocks of ``block`` tokens whose block distance to
    the query's block is a multiple of ``stride`` (0, s, 2s, ... blocks back).

    The token-strided pattern touches every tile a kernel could skip (one key every s
    tokens lands in each 128-token tile when s <= 128); this one keeps whole tiles, so a
    block-sparse kernel computes ~1/s of them.
    """

    block: int
    stride: int

    def __post_init__(self) -> None:
        _positive("block", self.block)
        _positive("stride", self.stride)

    @property
    def spec(self) -> str:
        return f"blockstride:{self.block}:{self.stride}"

    @property
    def is_dense(self) -> bool:
        return self.stride == 1

    def allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        qb = torch.div(q_pos, self.block, rounding_mode="floor")
        kb = torch.div(k_pos, self.block, rounding_mode="floor")
        # causal and (floor(i / b) - floor(j / b)) mod s == 0
        return (k_pos <= q_pos) & (torch.remainder(qb - kb, self.stride) == 0)

    def reach(self, n: int) -> int:
        # b keys in each of ceil(N / (b s)) blocks
        return min(n, self.block * -(-n // (self.block * self.stride)))


@dataclass(frozen=True)
class Union(AttentionPattern):
    """A key is allowed when any part allows it (e.g. local window + strided)."""

    parts: tuple[AttentionPattern, ...]

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("a union needs at least one pattern")

    @property
    def spec(self) -> str:
        return "+".join(p.spec for p in self.parts)

    @property
    def is_dense(self) -> bool:
        return any(p.is_dense for p in self.parts)

    def allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        out = self.parts[0].allowed(q_pos, k_pos)
        for p in self.parts[1:]:
            out = out | p.allowed(q_pos, k_pos)
        return out

    def reach(self, n: int) -> int:
        # w + N/s: the parts' reaches add (overlaps counted twice, as the article does)
        return min(n, sum(p.reach(n) for p in self.parts))


@dataclass(frozen=True)
class MoBA(AttentionPattern):
    """Learned block sparsity (MoBA): each query sees its own ``block`` of tokens causally plus
    the ``top_k`` earlier blocks whose mean-pooled keys score highest against it.

    Which keys are kept depends on q and k, so :meth:`allowed` (positions only) refuses; the
    counts are exact anyway: every query keeps min(top_k, blocks before its own) whole blocks.
    """

    block: int
    top_k: int

    def __post_init__(self) -> None:
        _positive("block", self.block)
        _positive("top_k", self.top_k)

    @property
    def spec(self) -> str:
        return f"moba:{self.block}:{self.top_k}"

    @property
    def is_dense(self) -> bool:
        return False

    def allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        raise TypeError(f"{self.spec} is content-based: which keys a query sees depends on q and k, not on "
                        "positions alone; use codex_lab.nn.moba.moba_mask(q, k, pattern) or moba_attention")

    def reach(self, n: int) -> int:
        return min(n, self.block * (self.top_k + 1))

    def pairs(self, n: int, chunk: int = 1024) -> int:
        _check_len(n)
        b, k = self.block, self.top_k
        # per block i (r queries): own block causally r (r + 1) / 2, plus b keys in each of
        # min(k, i) earlier blocks; in closed form over the F = n // b full blocks
        # (sum_{i<F} min(k, i) = m (m - 1) / 2 + k max(0, F - k), m = min(k, F)) and the tail
        f, r = divmod(n, b)
        m = min(k, f)
        total = f * b * (b + 1) // 2 + b * b * (m * (m - 1) // 2 + k * max(0, f - k))
        return total + r * (r + 1) // 2 + r * b * min(k, f)


def union(*patterns: AttentionPattern) -> AttentionPattern:
    """Union of patterns, flattened; a union containing the dense pattern is dense."""
    parts: list[AttentionPattern] = []
    for p in patterns:
        parts.extend(p.parts if isinstance(p, Union) else (p,))
    if len(parts) > 1 and any(isinstance(p, MoBA) for p in parts):
        raise ValueError("a content-based 'moba' pattern cannot join a union; give it a layer of its own")
    if any(type(p) is AttentionPattern for p in parts):
        return AttentionPattern()
    return parts[0] if len(parts) == 1 else Union(tuple(parts))


_KINDS: dict[str, tuple[type[AttentionPattern], int]] = {
    "window": (LocalWindow, 1),
    "strided": (Strided, 1),
    "fixed": (Fixed, 2),
    "global": (GlobalTokens, 1),
    "blockstride": (BlockStrided, 2),
    "moba": (MoBA, 2),
}
_HELP = ("'dense', 'window:W', 'strided:S', 'fixed:L:C', 'global:G', 'blockstride:B:S', "
         "'moba:B:K', or a union joined by '+', e.g. 'window:128+blockstride:128:16'")


def parse_pattern(spec: str | AttentionPattern) -> AttentionPattern:
    """Turn a spec string into a pattern object (see the module docstring for the forms)."""
    if isinstance(spec, AttentionPattern):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"a pattern spec is a string or AttentionPattern, got {type(spec).__name__}")
    s = spec.strip().lower()
    if "+" in s:
        return union(*(parse_pattern(part) for part in s.split("+")))
    if s in ("dense", "causal", "full"):
        return AttentionPattern()
    kind, *args = s.split(":")
    if kind not in _KINDS:
        raise ValueError(f"unknown attention pattern spec {spec!r}; use {_HELP}")
    cls, n_args = _KINDS[kind]
    if len(args) != n_args or not all(a.strip().isdigit() for a in args):
        raise ValueError(f"pattern spec {spec!r}: '{kind}' takes {n_args} positive integer(s); use {_HELP}")
    return cls(*(int(a) for a in args))


def seed_cost_ratio(n: int, window: int, stride: int) -> dict[str, float]:
    """The article's arithmetic for window w + stride s at length N, as plain numbers.

    Returns ``dense`` = N^2, ``sparse`` = N (w + N/s), ``n_sqrt_n`` = N sqrt(N), and the
    speed-up dense/sparse, which tends to s (not to sqrt(N)) as N grows with s fixed.
    """
    dense = float(n * n)
    # cost = N * (w + N / s)
    sparse = n * (window + n / stride)
    return {"dense": dense, "sparse": sparse, "n_sqrt_n": n * math.sqrt(n), "speedup": dense / sparse}
