"""Learned, content-based block sparsity: MoBA (Lu et al. 2025), the pattern ``"moba:B:K"``.

The keys are cut into blocks of ``B`` positions (block ``j`` = positions jB .. jB+B-1). Each
query token sees

- its own block, causally (keys at or before it), and
- the ``K`` earlier blocks (strictly before its own) that score highest under MoBA's gate
  ``score(t, j) = q_t . mean(K of block j)`` (all earlier blocks when there are at most K).

Choices, as in MoBA's reference code:

- **Per query token and per query head.** A selection shared by a whole query block (pooled
  queries) would let a token's keys depend on the queries *after* it in its block: a leak
  of future tokens into causal training. Per token, the selection at t uses q_t and keys
  at positions < block start only, so it is causal, and decoding with a KV cache selects
  what training selected (up to the float rounding of the scores, which the two compute
  with different products: only a near-exact tie could go the other way).
- **The selection is not differentiable.** Top-k is a hard choice; gradients flow through
  the attention over the chosen blocks only (and through the own block), never into the
  gate's scores. The gate reads q and k themselves: it has no parameters of its own and
  learns through what attention over the chosen blocks teaches q and k.
- Ties between equal scores go to the lower block index; every path uses the same
  :func:`moba_select`, so they agree.

Paths, held equal by tests/test_moba.py: ``"reference"`` (the (B, H, T, S) mask of the
selection and explicit-scores attention: any positions, a KV cache, any device) and
``"fast"`` (:mod:`codex_lab.nn.moba_fast`: the native CPU kernel, forward and backward,
computing only the chosen blocks; positions 0..N-1 in fp32 on a CPU, else the reference).
"""

from __future__ import annotations

import torch
from torch import Tensor

from codex_lab.nn.attention import attention_reference
from codex_lab.nn.patterns import MoBA, parse_pattern

__all__ = ["moba_select", "moba_mask", "moba_attention", "moba_density", "moba_top_k_for_density"]

IMPLS = ("reference", "fast")


def _as_moba(pattern: MoBA | str) -> MoBA:
    pat = parse_pattern(pattern)
    if not isinstance(pat, MoBA):
        raise ValueError(f"expected a 'moba:B:K' pattern, got {pat.spec!r}")
    return pat


def _positions(q: Tensor, k: Tensor, q_pos: Tensor | None, k_pos: Tensor | None) -> tuple[Tensor, Tensor]:
    """Default positions 0..T-1 / 0..S-1 for every batch row: (B, T), (B, S)."""
    B, T, S = q.shape[0], q.shape[2], k.shape[2]
    if q_pos is None:
        q_pos = torch.arange(T, device=q.device).expand(B, T)
    if k_pos is None:
        k_pos = torch.arange(S, device=q.device).expand(B, S)
    if q_pos.shape != (B, T) or k_pos.shape != (B, S):
        raise ValueError(f"q_pos {tuple(q_pos.shape)} / k_pos {tuple(k_pos.shape)} must be (B={B}, T={T}) / (B={B}, S={S})")
    return q_pos, k_pos


@torch.no_grad()
def moba_select(q: Tensor, k: Tensor, pattern: MoBA | str, q_pos: Tensor | None = None,
                k_pos: Tensor | None = None) -> Tensor:
    """The gate's choice: (B, H, T, K') int64 earlier key blocks per query (K' = min(K, blocks)),
    -1 in the slots of a query with fewer than K earlier blocks.

    q (B, H, T, D), k (B, H_kv, S, D) (H_kv divides H); positions (B, T) / (B, S), default
    0..T-1 / 0..S-1; key slots with position -1 are empty. Not differentiable (no_grad).
    """
    pat = _as_moba(pattern)
    B, H, T, D = q.shape
    Hkv, g, bs = k.shape[1], q.shape[1] // k.shape[1], pat.block
    q_pos, k_pos = _positions(q, k, q_pos, k_pos)
    if T == 0 or k.shape[2] == 0:  # no queries or no keys: nothing to choose
        return torch.empty(B, H, T, 0, dtype=torch.int64, device=q.device)
    valid = k_pos >= 0  # (B, S)
    n_blocks = max(int(q_pos.max()), int(k_pos.max())) // bs + 1
    kb = torch.div(k_pos.clamp(min=0), bs, rounding_mode="floor")  # (B, S) key block ids
    S = k.shape[2]
    plain = bool((k_pos == torch.arange(S, device=k.device)).all())
    if plain:
        # keys at 0..S-1 (training, a prefill): block sums by a reshape, the last block apart
        full = S // bs
        sums = k.float()[:, :, : full * bs].reshape(B, Hkv, full, bs, D).sum(3)  # (B, Hkv, S // bs, D)
        if full < n_blocks:
            tail = k.float()[:, :, full * bs :].sum(2, keepdim=True) if full * bs < S else k.new_zeros(B, Hkv, 1, D)
            sums = torch.cat([sums, tail, sums.new_zeros(B, Hkv, n_blocks - full - 1, D)], 2)  # (B, Hkv, nb, D)
        counts = (S - torch.arange(n_blocks, device=k.device) * bs).clamp(0, bs).float().expand(B, n_blocks)
    else:  # any positions (a KV cache): sums by scatter, empty slots left out
        kf = k.float() * valid[:, None, :, None]  # (B, Hkv, S, D), empty slots zeroed
        sums = kf.new_zeros(B, Hkv, n_blocks, D).scatter_add_(2, kb[:, None, :, None].expand(B, Hkv, -1, D), kf)
        counts = kf.new_zeros(B, n_blocks).scatter_add_(1, kb, valid.float())  # (B, nb) keys per block
    # kbar_j = mean of the keys of block j
    kbar = sums / counts.clamp(min=1)[:, None, :, None]  # (B, Hkv, nb, D)
    qb = torch.div(q_pos, bs, rounding_mode="floor")  # (B, T)
    kk = min(pat.top_k, n_blocks)
    from codex_lab.nn.moba_fast import moba_gate, moba_topk

    if plain and T == S and bool((q_pos == k_pos).all()):
        # training / a prefill: the native gate scores each query against earlier blocks only
        native = moba_gate(q.float(), kbar, bs, kk)
        if native is not None:
            return native
    # score(t, j) = q_t . kbar_j, the g query heads of a group (rows of one product) against
    # their K/V head's means
    scores = (q.float().reshape(B, Hkv, g * T, D) @ kbar.transpose(-2, -1)).view(B, H, T, n_blocks)
    blk = torch.arange(n_blocks, device=q.device)
    # candidates: blocks strictly before the query's own block that hold a key
    cand = (blk[None, None, :] < qb[:, :, None]) & (counts > 0)[:, None, :]  # (B, T, nb)
    scores = scores.masked_fill(~cand[:, None], float("-inf"))
    native = moba_topk(scores, kk)  # the same choice, in one pass (CPU, fp32)
    if native is not None:
        return native
    # top-k as K rounds of argmax (the first maximum: ties go to the lower block, on every
    # path and device); for K << blocks faster than torch.topk on a CPU
    picks = []
    for _ in range(kk):
        idx = scores.argmax(-1, keepdim=True)  # (B, H, T, 1)
        picks.append(torch.where(scores.gather(-1, idx) > float("-inf"), idx, -1))
        scores.scatter_(-1, idx, float("-inf"))
    return torch.cat(picks, -1)  # (B, H, T, K')


def moba_mask(q: Tensor, k: Tensor, pattern: MoBA | str, q_pos: Tensor | None = None, k_pos: Tensor | None = None,
              selected: Tensor | None = None) -> Tensor:
    """(B, H, T, S) bool: may query t of head h attend to key slot s (True = yes)?

    Own block causally, or a block that :func:`moba_select` chose (``selected`` if given);
    empty key slots (position -1) never.
    """
    pat = _as_moba(pattern)
    q_pos, k_pos = _positions(q, k, q_pos, k_pos)
    B, H, T, _ = q.shape
    if T == 0 or k.shape[2] == 0:  # no queries or no keys: no pair allowed
        return torch.zeros(B, H, T, k.shape[2], dtype=torch.bool, device=q.device)
    if selected is None:
        selected = moba_select(q, k, pat, q_pos, k_pos)
    bs = pat.block
    n_blocks = max(int(q_pos.max()), int(k_pos.max())) // bs + 1
    qb = torch.div(q_pos, bs, rounding_mode="floor")  # (B, T)
    kb = torch.div(k_pos.clamp(min=0), bs, rounding_mode="floor")  # (B, S)
    valid = k_pos >= 0
    # chosen[b, h, t, j] = block j was selected for query t
    chosen = torch.zeros(B, H, T, n_blocks + 1, dtype=torch.bool, device=q.device)
    chosen.scatter_(-1, torch.where(selected < 0, n_blocks, selected), True)  # -1 -> a spare column
    sel = chosen[..., :n_blocks].gather(-1, kb[:, None, None, :].expand(B, H, T, -1))  # (B, H, T, S)
    own = (kb[:, None, :] == qb[:, :, None]) & (k_pos[:, None, :] <= q_pos[:, :, None])  # (B, T, S)
    return (sel | own[:, None]) & valid[:, None, None, :]


def moba_attention(q: Tensor, k: Tensor, v: Tensor, pattern: MoBA | str, impl: str = "reference", *,
                   q_pos: Tensor | None = None, k_pos: Tensor | None = None) -> Tensor:
    """Attention under the learned MoBA pattern: (B, H, T, D).

    Args:
        q: queries (B, H, T, D) (after RoPE, as the model passes them).
        k, v: keys and values (B, H_kv, S, D); H_kv divides H (grouped heads).
        pattern: a :class:`~codex_lab.nn.patterns.MoBA` or its spec ``"moba:B:K"``.
        impl: ``"reference"`` or ``"fast"`` (the native kernel for positions 0..N-1, fp32 on
            a CPU, where it is available; the reference otherwise).
        q_pos, k_pos: absolute positions (B, T) / (B, S), -1 = empty key slot; default 0..

    Gradients reach q, k, v through the attention over the chosen blocks; the choice itself
    (top-k of the gate) is not differentiated.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}; choose one of {IMPLS}")
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[1] % k.shape[1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q (B, H, T, D) and k, v (B, H_kv, S, D) with H_kv dividing H; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    pat = _as_moba(pattern)
    if impl == "fast" and q.shape[2] > 0:
        from codex_lab.nn.moba_fast import moba_fast, moba_fast_ok

        if moba_fast_ok(q, k, q_pos, k_pos):
            return moba_fast(q, k, v, pat, moba_select(q, k, pat))
    return attention_reference(q, k, v, moba_mask(q, k, pat, q_pos, k_pos))


def moba_density(n: int, block: int, top_k: int) -> float:
    """Fraction of the n(n+1)/2 causal pairs that ``"moba:block:top_k"`` keeps at length n
    (content-independent: every query keeps min(top_k, earlier blocks) whole blocks)."""
    return MoBA(block, top_k).density(n)


def moba_top_k_for_density(n: int, block: int, density: float) -> int:
    """The top_k whose density at length n is closest to ``density`` (to match a fixed pattern)."""
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density}")
    n_blocks = -(-n // block)
    # density grows strictly with top_k up to n_blocks - 1 (where it is 1): bisect for the first
    # top_k at or past the target, then take the closer of it and the one below (ties: lower)
    lo, hi = 1, max(1, n_blocks - 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if moba_density(n, block, mid) >= density:
            hi = mid
        else:
            lo = mid + 1
    if lo > 1 and abs(moba_density(n, block, lo - 1) - density) <= abs(moba_density(n, block, lo) - density):
        return lo - 1
    return lo

