"""Lesson 03 exercises: one grouped-query decode step over a padded KV cache, the KV-cache
bytes formula, and the mean-pool conversion of K/V heads (MHA -> GQA).

Each check computes the expected answer with plain code here, on cases chosen so that the
usual mistakes (wrong head grouping, attending to padding, a missing factor, pooling the
wrong heads) give a different answer, and says which mistake the numbers point to.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from codex_lab.course.check_tools import OVERFLOW, as_int, overflow, pure_call, pyrng, rng
from codex_lab.course.checks import case, exercise
from codex_lab.course.forbid import ATTENTION_BUILTINS

# fp32 attention outputs of O(1); learner code may sum in another order: 1e-5 (CONTRIBUTING.md)
ATOL = 1e-5


def _decode(q: Tensor, k: Tensor, v: Tensor, lengths: Tensor, *, tile: bool = False, pad: bool = False,
            off_by_one: bool = False, scale: float | None = None) -> Tensor:
    """Reference decode step; the keyword options build the usual wrong variants."""
    B, H, D = q.shape
    S, g = k.shape[2], H // k.shape[1]
    # query head h reads K/V head h // g (h % H_kv when `tile`)
    kk = k.repeat(1, g, 1, 1) if tile else k.repeat_interleave(g, dim=1)  # (B, H, S, D)
    vv = v.repeat(1, g, 1, 1) if tile else v.repeat_interleave(g, dim=1)  # (B, H, S, D)
    # score_s = q . k_s / sqrt(D) over the valid cached positions s < lengths[b]
    scores = torch.einsum("bhd,bhsd->bhs", q, kk) * (1 / math.sqrt(D) if scale is None else scale)  # (B, H, S)
    pos = torch.arange(S)
    valid = (pos[None, :] <= lengths[:, None]) if off_by_one else (pos[None, :] < lengths[:, None])  # (B, S)
    if not pad:
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    return torch.einsum("bhs,bhsd->bhd", scores.softmax(-1), vv)  # (B, H, D)


@exercise("03", "grouped_decode_attention", points=3,
          forbid=("codex_lab.attention_reference", "codex_lab.attention_sdpa") + ATTENTION_BUILTINS)
def check_grouped_decode_attention(fn: Callable[..., Any]) -> None:
    """fn(q (B, H, D), k (B, H_kv, S, D), v (B, H_kv, S, D), lengths (B,)) -> (B, H, D)."""
    gen = rng("03.grouped_decode_attention")
    runs = []
    for h, h_kv in [(4, 4), (4, 2), (6, 3), (8, 1)]:
        B, S, D = 3, 7, 8
        q = torch.randn(B, h, D, generator=gen)
        k = torch.randn(B, h_kv, S, D, generator=gen)
        v = torch.randn(B, h_kv, S, D, generator=gen)
        lengths = torch.tensor([S, 4, 1])
        for b, n in enumerate(lengths.tolist()):  # padding slots hold junk, as a reused cache would
            k[b, :, n:] = 5.0
            v[b, :, n:] = 100.0
        runs.append((h, h_kv, q, k, v, lengths, pure_call(fn, ("q", "k", "v", "lengths"), q, k, v, lengths)))
    with case(1, "a (B, H, D) tensor"):
        for h, h_kv, q, k, v, lengths, got in runs:
            assert isinstance(got, Tensor), f"return a tensor, got {type(got).__name__}"
            assert got.shape == q.shape, f"H={h}, H_kv={h_kv}: expected shape {tuple(q.shape)}, got {tuple(got.shape)}"
    with case(2, "attention over each row's valid cache, head h reading K/V head h // g"):
        for h, h_kv, q, k, v, lengths, got in runs:
            want = _decode(q, k, v, lengths)
            if torch.allclose(got, want, atol=ATOL, rtol=0):
                continue
            if h != h_kv and torch.allclose(got, _decode(q, k, v, lengths, tile=True), atol=ATOL, rtol=0):
                raise AssertionError(
                    f"H={h}, H_kv={h_kv}: query head h must read K/V head h // g (heads 0..g-1 share K/V head 0); "
                    "you paired them as h % H_kv (torch.repeat / tile instead of repeat_interleave)")
            if torch.allclose(got, _decode(q, k, v, lengths, off_by_one=True), atol=ATOL, rtol=0):
                raise AssertionError("one padding slot too many: the valid positions are s < lengths[b], not s <= lengths[b]")
            if bool((got.abs() > 20).any()) or torch.allclose(got, _decode(q, k, v, lengths, pad=True), atol=ATOL, rtol=0):
                raise AssertionError("the output reads the padding: row b holds only lengths[b] cached tokens "
                                     "(positions 0 .. lengths[b] - 1); mask the rest with -inf before the softmax")
            if torch.allclose(got, _decode(q, k, v, lengths, scale=1.0), atol=ATOL, rtol=0):
                raise AssertionError("the scores are not scaled: divide q . k by sqrt(D)")
            raise AssertionError(f"H={h}, H_kv={h_kv}: max difference {float((got - want).abs().max()):.3g} from the "
                                 "reference; check the 1/sqrt(D) scale, the length mask and the softmax axis (cached positions)")
        # large scores, as a trained model's can be: a softmax without the row max overflows
        q, k, v = 30 * torch.randn(2, 4, 8, generator=gen), 30 * torch.randn(2, 2, 5, 8, generator=gen), torch.randn(2, 2, 5, 8, generator=gen)
        k[:, :, 0] = q[:, ::2]  # query head 2j reads K/V head j: its score at slot 0 is |q|^2 / sqrt(D), past 88.7
        lengths = torch.tensor([5, 3])
        got, want = fn(q.clone(), k.clone(), v.clone(), lengths.clone()), _decode(q, k, v, lengths)
        assert not overflow(got, want), OVERFLOW
        assert torch.allclose(got, want, atol=1e-4, rtol=0), "with large scores (|q . k| / sqrt(D) in the hundreds) the output differs"


@exercise("03", "kv_cache_bytes",
          forbid=("codex_lab.kv_cache_bytes", "codex_lab.kv_bytes_per_token", "codex_lab.measured_cache_bytes"))
def check_kv_cache_bytes(fn: Callable[..., Any]) -> None:
    """fn(n_layer, n_kv_head, head_dim, seq_len, batch, bytes_per_elem) -> int bytes."""
    cases = [(6, 3, 64, 1000, 5, 4), (4, 4, 64, 1024, 3, 4), (24, 2, 64, 32768, 2, 2), (28, 4, 128, 32768, 8, 2), (1, 1, 2, 3, 5, 1)]
    r = pyrng("03.kv_cache_bytes")  # drawn for this run: a table of the cases above fails
    cases += [(r.randint(1, 48), r.randint(1, 16), r.choice([32, 64, 80, 128]), r.randint(1, 65536), r.randint(1, 32),
               r.choice([1, 2, 4])) for _ in range(3)]
    for n_layer, n_kv, hd, seq, batch, nb in cases:
        # bytes = 2 (K and V) * layers * kv_heads * head_dim * seq_len * batch * bytes_per_elem
        want = 2 * n_layer * n_kv * hd * seq * batch * nb
        got = as_int(fn(n_layer, n_kv, hd, seq, batch, nb))
        if isinstance(got, float) and got == want:
            raise AssertionError(f"{got!r} is a float; bytes are a whole number: return an int (use // or int(), not /)")
        assert isinstance(got, int), f"return an int (bytes), got {type(got).__name__}"
        if got == want:
            continue
        if got == want // 2:
            raise AssertionError(f"{got:,} is half the answer: the cache holds keys *and* values (factor 2)")
        if nb > 1 and got == want // nb:
            raise AssertionError(f"{got:,}: that counts elements; multiply by bytes_per_elem={nb}")
        if n_layer > 1 and got == want // n_layer:
            raise AssertionError(f"{got:,}: every one of the {n_layer} layers has its own cache")
        if batch > 1 and got == want // batch:
            raise AssertionError(f"{got:,}: every one of the {batch} sequences in the batch has its own cache")
        raise AssertionError(f"layers={n_layer}, kv_heads={n_kv}, head_dim={hd}, seq={seq}, batch={batch}, bytes={nb}: "
                             f"expected {want:,}, got {got:,}")


@exercise("03", "mean_pool_kv", points=2, forbid=("codex_lab.mean_pool_heads", "codex_lab.mha_to_gqa"))
def check_mean_pool_kv(fn: Callable[..., Any]) -> None:
    """fn(w, n_heads, n_groups) -> (n_groups*head_dim, d_in): head j = mean of heads j*g..j*g+g-1."""
    w = torch.randn(8 * 3, 5, generator=rng("03.mean_pool_kv"))  # 8 heads of width 3, d_in 5
    heads = w.reshape(8, 3, 5)  # (heads, head_dim, d_in)
    outs = {n_groups: pure_call(fn, ("w", "n_heads", "n_groups"), w, 8, n_groups) for n_groups in (8, 4, 2, 1)}
    with case(1, "shape (n_groups * head_dim, d_in)"):
        for n_groups, got in outs.items():
            assert isinstance(got, Tensor), f"return a tensor, got {type(got).__name__}"
            assert tuple(got.shape) == (n_groups * 3, 5), (
                f"n_groups={n_groups}: expected shape {(n_groups * 3, 5)} (n_groups * head_dim rows, d_in columns), "
                f"got {tuple(got.shape)}")
    with case(1, "each new head is the mean of g consecutive heads"):
        for n_groups, got in outs.items():
            g = 8 // n_groups
            # W'_j = (1/g) sum_{i < g} W_{j*g + i}
            want = heads.reshape(n_groups, g, 3, 5).mean(1).reshape(n_groups * 3, 5)
            if got.shape == want.shape and torch.allclose(got, want, atol=1e-6):
                continue
            assert got.shape == want.shape, f"n_groups={n_groups}: wrong shape {tuple(got.shape)}, so the values cannot match"
            strided = heads.reshape(g, n_groups, 3, 5).mean(0).reshape(n_groups * 3, 5)
            if torch.allclose(got, strided, atol=1e-6):
                raise AssertionError(
                    f"n_groups={n_groups}: you averaged heads j, j+{n_groups}, ...; a group is g={g} *consecutive* "
                    "heads (query head h reads K/V head h // g)")
            if torch.allclose(got, heads.reshape(n_groups, g, 3, 5).sum(1).reshape(n_groups * 3, 5), atol=1e-6):
                raise AssertionError(f"n_groups={n_groups}: that is the sum of the group's heads; divide by g={g}")
            if torch.allclose(got, heads.reshape(n_groups, g, 3, 5)[:, 0].reshape(n_groups * 3, 5), atol=1e-6):
                raise AssertionError(f"n_groups={n_groups}: that keeps the first head of each group; take the mean")
            if torch.allclose(got, w.reshape(n_groups, 3, g, 5).mean(2).reshape(n_groups * 3, 5), atol=1e-6):
                raise AssertionError(f"n_groups={n_groups}: you averaged rows inside the group in the wrong layout; "
                                     "view w as (n_groups, g, head_dim, d_in): head first, then its rows")
            raise AssertionError(f"n_groups={n_groups}: max difference {float((got - want).abs().max()):.3g} from the mean-pooled rows")
