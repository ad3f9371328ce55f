"""Lesson 06 exercises: attention over a preallocated KV cache, top-p filtering, one
scheduler (admission) step of a continuous-batching engine."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from codex_lab.course.checks import exercise


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # softmax(q k^T / sqrt(D)) v over every key given
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


@exercise("06", "cached_attention")
def check_cached_attention(fn: Callable[..., Any]) -> None:
    """fn(k_buf, v_buf, length, q, k_new, v_new) writes slot ``length`` and attends to 0..length."""
    g = torch.Generator().manual_seed(0)
    B, H, L, D = 2, 3, 10, 8
    k_buf, v_buf = torch.zeros(B, H, L, D), torch.zeros(B, H, L, D)
    keys, values = torch.randn(B, H, 6, D, generator=g), torch.randn(B, H, 6, D, generator=g)
    for t in range(6):  # decode six tokens one at a time
        q = torch.randn(B, H, 1, D, generator=g)
        out = fn(k_buf, v_buf, t, q, keys[:, :, t : t + 1], values[:, :, t : t + 1])
        assert isinstance(out, torch.Tensor) and out.shape == (B, H, 1, D), (
            f"return the attention output of shape (B, H, 1, D) = {(B, H, 1, D)}, got "
            f"{getattr(out, 'shape', type(out).__name__)}")
        assert torch.equal(k_buf[:, :, t], keys[:, :, t]) and torch.equal(v_buf[:, :, t], values[:, :, t]), (
            f"step {t}: write the new key/value into slot {t} of the buffers, in place")
        assert not k_buf[:, :, t + 1 :].any(), "write only slot `length`; later slots must stay empty"
        want = _attention(q, keys[:, :, : t + 1], values[:, :, : t + 1])
        # fp32, outputs O(1): another summation order differs by ~1e-7
        assert torch.allclose(out, want, atol=1e-5), (
            f"step {t}: attend to the cached slots 0..{t} including the new one (and no empty slot), "
            "with scores scaled by 1/sqrt(D)")


@exercise("06", "nucleus_filter")
def check_nucleus_filter(fn: Callable[..., Any]) -> None:
    """fn(logits (B, V), p) keeps the smallest set of most likely tokens with mass >= p."""
    from codex_lab.infer.sampling import top_p_filter

    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0]])  # probs ~ 0.64, 0.09, 0.24, 0.03
    for p, kept in ((0.7, [True, False, True, False]), (0.5, [True, False, False, False]),
                    (0.9, [True, True, True, False]), (1.0, [True] * 4)):
        out = fn(logits.clone(), p)
        assert isinstance(out, torch.Tensor) and out.shape == logits.shape, "return filtered logits of the same shape"
        got = (~torch.isinf(out)).tolist()[0]
        assert got == kept, f"p={p}: expected tokens kept {kept}, got {got} (keep the smallest set whose mass reaches p; the top token always)"
        assert torch.equal(out[~torch.isinf(out)], logits[0][torch.tensor(kept)]), "kept logits must be unchanged"
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 50, generator=g) * 3
    for p in (0.3, 0.8, 0.95):
        want = torch.isinf(top_p_filter(x, p))
        assert torch.equal(torch.isinf(fn(x.clone(), p)), want), f"p={p}: wrong tokens kept on random rows (each row on its own)"


@exercise("06", "schedule_step")
def check_schedule_step(fn: Callable[..., Any]) -> None:
    """fn(waiting, n_running, free_blocks, max_batch, block_size) -> rids admitted this step."""
    # waiting: (rid, prompt tokens + max new tokens) in arrival order
    cases = [
        (([(1, 16), (2, 17), (3, 5)], 0, 10, 8, 16), [1, 2, 3], "everything fits"),
        (([(1, 16), (2, 17), (3, 5)], 0, 3, 8, 16), [1, 2], "17 tokens need ceil(17/16) = 2 blocks"),
        (([(1, 40), (2, 4)], 0, 2, 8, 16), [], "the head of the queue needs 3 blocks: nobody may overtake it"),
        (([(1, 4), (2, 4), (3, 4)], 6, 99, 8, 16), [1, 2], "only max_batch - n_running slots are free"),
        (([], 0, 5, 8, 16), [], "an empty queue admits nobody"),
        (([(7, 33), (8, 1)], 1, 4, 4, 16), [7, 8], "33 tokens = 3 blocks, 1 token = 1 block"),
    ]
    for args, want, why in cases:
        got = fn(list(args[0]), *args[1:])
        assert list(got) == want, f"schedule_step{args} returned {got}, expected {want}: {why}"
