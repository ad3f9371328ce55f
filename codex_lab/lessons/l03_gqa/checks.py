"""Lesson 03 exercises: grouped attention forward, the KV-cache bytes formula, mean-pool conversion.

Each check compares the learner's function with codex_lab's reference on cases chosen so
that the usual mistakes (wrong head grouping, a missing factor, pooling the wrong axis)
give a different answer, and says which mistake the numbers point to.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from codex_lab.course.checks import exercise

# fp32 attention outputs of O(1); learner code may sum in another order: 1e-5 (CONTRIBUTING.md)
ATOL = 1e-5


@exercise("03", "grouped_attention")
def check_grouped_attention(fn: Callable[..., Any]) -> None:
    """fn(q, k, v) with q (B, H, T, D), k/v (B, H_kv, T, D) -> causal GQA output (B, H, T, D)."""
    from codex_lab.nn.model import attention_reference

    gen = torch.Generator().manual_seed(3)
    for h, h_kv in [(4, 4), (4, 2), (6, 3), (8, 1)]:
        q = torch.randn(2, h, 5, 8, generator=gen)
        k = torch.randn(2, h_kv, 5, 8, generator=gen)
        v = torch.randn(2, h_kv, 5, 8, generator=gen)
        want = attention_reference(q, k, v, None, is_causal=True)  # (B, H, T, D)
        got = fn(q, k, v)
        assert isinstance(got, torch.Tensor), f"return a tensor, got {type(got).__name__}"
        assert got.shape == want.shape, f"H={h}, H_kv={h_kv}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}"
        if torch.allclose(got, want, atol=ATOL, rtol=0):
            continue
        g = h // h_kv
        tiled = attention_reference(q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1), None, is_causal=True)
        if g > 1 and torch.allclose(got, tiled, atol=ATOL, rtol=0):
            raise AssertionError(
                f"H={h}, H_kv={h_kv}: query head h must read K/V head h // g (heads 0..g-1 share K/V head 0); "
                "you paired them as h % H_kv (torch.repeat / tile instead of repeat_interleave)"
            )
        nomask = attention_reference(q, k, v, torch.ones(1, 1, 5, 5, dtype=torch.bool))
        if torch.allclose(got, nomask, atol=ATOL, rtol=0):
            raise AssertionError("the output ignores the causal mask: position t must not see keys after t")
        raise AssertionError(
            f"H={h}, H_kv={h_kv}: max difference {float((got - want).abs().max()):.3g} from the reference; "
            "check the 1/sqrt(D) scale, the causal mask and the softmax axis (keys)"
        )


@exercise("03", "kv_cache_bytes")
def check_kv_cache_bytes(fn: Callable[..., Any]) -> None:
    """fn(n_layer, n_kv_head, head_dim, seq_len, batch, bytes_per_elem) -> int bytes."""
    cases = [(6, 3, 64, 1000, 5, 4), (4, 4, 64, 1024, 1, 4), (24, 2, 64, 32768, 1, 2), (28, 4, 128, 32768, 8, 2), (1, 1, 2, 3, 5, 1)]
    for n_layer, n_kv, hd, seq, batch, nb in cases:
        # 2 (K and V) * layers * kv_heads * head_dim * seq_len * batch * bytes
        want = 2 * n_layer * n_kv * hd * seq * batch * nb
        got = fn(n_layer, n_kv, hd, seq, batch, nb)
        assert isinstance(got, int), f"return an int (bytes), got {type(got).__name__}"
        if got == want // 2:
            raise AssertionError(f"{got:,} is half the answer: the cache holds keys *and* values (factor 2)")
        if nb > 1 and got == want // nb:
            raise AssertionError(f"{got:,}: that counts elements; multiply by bytes_per_elem={nb}")
        if n_layer > 1 and got == want // n_layer:
            raise AssertionError(f"{got:,}: every one of the {n_layer} layers has its own cache")
        assert got == want, (
            f"layers={n_layer}, kv_heads={n_kv}, head_dim={hd}, seq={seq}, batch={batch}, bytes={nb}: "
            f"expected {want:,}, got {got:,}"
        )


@exercise("03", "mean_pool_kv")
def check_mean_pool_kv(fn: Callable[..., Any]) -> None:
    """fn(w, n_heads, n_groups) -> (n_groups*head_dim, d_in): head j = mean of heads j*g..j*g+g-1."""
    from codex_lab.lessons.l03_gqa.experiments import mean_pool_heads

    w = torch.arange(8 * 3 * 5, dtype=torch.float32).reshape(8 * 3, 5)  # 8 heads of width 3, d_in 5
    for n_groups in (8, 4, 2, 1):
        want = mean_pool_heads(w, 8, n_groups)
        got = fn(w.clone(), 8, n_groups)
        assert isinstance(got, torch.Tensor), f"return a tensor, got {type(got).__name__}"
        assert got.shape == want.shape, f"n_groups={n_groups}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}"
        if torch.allclose(got, want):
            continue
        g = 8 // n_groups
        strided = w.reshape(g, n_groups, 3, 5).mean(0).reshape(n_groups * 3, 5)
        if torch.allclose(got, strided):
            raise AssertionError(
                f"n_groups={n_groups}: you averaged heads j, j+{n_groups}, ...; a group is g={g} *consecutive* "
                "heads (query head h reads K/V head h // g)"
            )
        if torch.allclose(got, w.reshape(n_groups, g, 3, 5).sum(1).reshape(n_groups * 3, 5)):
            raise AssertionError(f"n_groups={n_groups}: that is the sum of the group's heads; divide by g={g}")
        if torch.allclose(got, w.reshape(n_groups, g, 3, 5)[:, 0].reshape(n_groups * 3, 5)):
            raise AssertionError(f"n_groups={n_groups}: that keeps the first head of each group; take the mean")
        raise AssertionError(f"n_groups={n_groups}: max difference {float((got - want).abs().max()):.3g} from the mean-pooled rows")
