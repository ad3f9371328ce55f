"""Attention kernels and their registry.

Every kernel takes q (B, H, T, D), k/v (B, H_kv, S, D) and a boolean mask (B or 1, 1, T, S)
where True = may attend (None with ``is_causal`` = plain causal). ``"reference"`` builds the
scores and mask explicitly (obviously correct, O(T*S) memory); ``"sdpa"`` calls PyTorch's
fused kernel; tests hold them equal. Block-sparse kernels (lesson 02) register themselves
from :mod:`codex_lab.nn.sparse`, which the model imports.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor




def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool = False, **_: object
) -> Tensor:
    """Explicit-scores attention: repeat K/V per group, score, mask, softmax, weight.

    A fully masked query row returns zeros (never NaN).
    """
    B, H, T, D = q.shape
    S = k.shape[2]
    g = H // k.shape[1]
    k = k.repeat_interleave(g, dim=1)  # (B, H, S, D)
    v = v.repeat_interleave(g, dim=1)  # (B, H, S, D)
    if mask is None and is_causal:
        if T != S:
            raise ValueError(f"is_causal needs as many queries as keys (got T={T}, S={S}); pass an explicit mask")
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril()[None, None]  # (1, 1, T, S)
    # scores = q k^T / sqrt(D)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    # softmax in fp32 at least (bf16/fp16 scores upcast; fp64 stays fp64, never downcast)
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))  # (B, H, T, S)
    if mask is not None:
        probs = torch.where(mask.any(dim=-1, keepdim=True), probs, torch.zeros_like(probs))
    return probs.to(v.dtype) @ v  # (B, H, T, D)


def attention_sdpa(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool = False, **_: object
) -> Tensor:
    """PyTorch's fused attention; grouped K/V heads are broadcast, never copied."""
    grouped = q.shape[1] != k.shape[1]
    if mask is None and is_causal and q.shape[2] != k.shape[2]:
        # SDPA aligns is_causal top-left; the reference would disagree, so refuse instead
        raise ValueError(f"is_causal needs as many queries as keys (got T={q.shape[2]}, S={k.shape[2]}); pass an explicit mask")
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped)
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=grouped)


AttentionFn = Callable[..., Tensor]
_ATTENTION_IMPLS: dict[str, AttentionFn] = {"reference": attention_reference, "sdpa": attention_sdpa}


def one_query_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """Attention of one query per row (or a few: a speculative verify's T), over a cache, in plain
    tensor ops that Inductor fuses into a few loops (ATen's flash attention on a CPU hands each
    head's few-query products to MKL's matrix-vector routine, a call per head and product:
    docs/PROFILE.md).

    q: (B, H, T, D), T small (its (B, H, T, L, D) products are formed in eager mode); k, v:
    (B, Hkv, L, D) with H a multiple of Hkv (grouped-query heads share a K/V head); allowed:
    (T, L) bool, the slots each query may see ((1, L) when T = 1), or (B, 1, T, L), a mask per row
    (the serving engine's paged step, where every row has its own length). Returns (B, H, T, D),
    equal to ``F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)``.
    """
    B, H, T, D = q.shape
    Hkv = k.shape[1]
    if T == 1:  # a decode step: the loops Inductor fuses best, one query per row
        qg = q.reshape(B, Hkv, H // Hkv, 1, D)  # (B, Hkv, G, 1, D): each K/V head's group of query heads
        # s_l = q . k_l / sqrt(D), for every slot l
        s = (qg * k[:, :, None]).sum(-1) * D ** -0.5  # (B, Hkv, G, L)
        s = s.masked_fill(~allowed, float("-inf"))
        p = torch.softmax(s, dim=-1)  # (B, Hkv, G, L)
        # y = sum_l p_l v_l
        y = (p[..., None] * v[:, :, None]).sum(-2)  # (B, Hkv, G, D)
        return y.reshape(B, H, 1, D)
    qg = q.reshape(B, Hkv, H // Hkv, T, 1, D)  # (B, Hkv, G, T, 1, D)
    # s_tl = q_t . k_l / sqrt(D), for every query t and slot l
    s = (qg * k[:, :, None, None]).sum(-1) * D ** -0.5  # (B, Hkv, G, T, L)
    mask = allowed[:, :, None] if allowed.dim() == 4 else allowed  # (B, 1, 1, T, L) or (T, L)
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)  # (B, Hkv, G, T, L)
    # y_t = sum_l p_tl v_l
    y = (p[..., None] * v[:, :, None, None]).sum(-2)  # (B, Hkv, G, T, D)
    return y.reshape(B, H, T, D)


def register_attention_impl(name: str, fn: AttentionFn) -> None:
    """Register a kernel ``fn(q, k, v, mask, is_causal=False, *, pattern, q_pos, k_pos)``.

    Sparse kernels are called with ``mask=None`` and the layer's pattern plus the query
    positions (B, T) and key positions (B, S) (-1 = empty slot), and must return
    (B, H, T, D) equal to :func:`attention_reference` under the same pattern.
    """
    _ATTENTION_IMPLS[name] = fn


def get_attention_impl(name: str) -> AttentionFn:
    """Look up a kernel by name ("reference", "sdpa", and "blocks"/"flex" once
    :mod:`codex_lab.nn.sparse` is imported, which :mod:`codex_lab.nn.model` does)."""
    if name not in _ATTENTION_IMPLS:
        raise ValueError(f"unknown attention impl {name!r}; known: {sorted(_ATTENTION_IMPLS)}")
    return _ATTENTION_IMPLS[name]
