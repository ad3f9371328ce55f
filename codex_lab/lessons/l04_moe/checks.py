"""Lesson 04 exercises: top-k routing, the load-balancing loss, capacity-limited dispatch.

Each check compares the learner's function with codex_lab.nn.moe on random inputs and on a
small hand-made case that catches the usual mistake.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from codex_lab.course.checks import exercise


@exercise("04", "top_k_route")
def check_top_k_route(fn: Callable[..., Any]) -> None:
    """fn(logits (N, E), k) -> (expert_idx (N, k) int64, weights (N, k) float), weights renormalised."""
    from codex_lab.nn.moe import route

    logits = torch.randn(12, 6, generator=torch.Generator().manual_seed(0))
    for k in (1, 2, 4):
        out = fn(logits.clone(), k)
        assert isinstance(out, tuple) and len(out) == 2, "return a tuple (expert_idx, weights)"
        idx, w = out
        ref = route(logits, k)
        assert tuple(idx.shape) == (12, k), f"expert_idx must be (N, k) = (12, {k}), got {tuple(idx.shape)}"
        assert torch.equal(torch.sort(idx, -1).values, torch.sort(ref.expert_idx, -1).values), (
            f"k={k}: wrong experts chosen; take the k largest softmax probabilities per token (torch.topk)"
        )
        assert torch.allclose(w.float().sum(-1), torch.ones(12), atol=1e-5), (
            f"k={k}: the k weights of a token must sum to 1: divide the chosen probabilities by their sum"
        )
        # match weights expert by expert (order of the k columns may differ)
        got = torch.zeros(12, 6).scatter(1, idx, w.float())
        want = torch.zeros(12, 6).scatter(1, ref.expert_idx, ref.weights)
        assert torch.allclose(got, want, atol=1e-5), (
            f"k={k}: weights differ from the renormalised softmax probabilities p_e / sum_(chosen) p"
        )


@exercise("04", "balancing_loss")
def check_balancing_loss(fn: Callable[..., Any]) -> None:
    """fn(probs (N, E), expert_idx (N, k)) -> scalar E * sum_e f_e * P_e (f over N*k assignments)."""
    from codex_lab.nn.moe import load_balancing_loss

    E = 4
    uniform = torch.full((8, E), 1 / E)
    balanced = torch.arange(16).view(8, 2) % E
    got = float(fn(uniform, balanced))
    assert abs(got - 1.0) < 1e-5, f"perfect balance must give 1.0, got {got:.4f}: multiply by E and share f over N*k"
    collapsed = torch.zeros(8, E)
    collapsed[:, 0] = 1.0
    got = float(fn(collapsed, torch.zeros(8, 1, dtype=torch.long)))
    assert abs(got - E) < 1e-5, f"everything on one expert must give E = {E}, got {got:.4f}"
    logits = torch.randn(20, 5, generator=torch.Generator().manual_seed(1), requires_grad=True)
    probs = torch.softmax(logits, -1)
    idx = probs.topk(2, -1).indices
    loss = fn(probs, idx)
    assert isinstance(loss, torch.Tensor) and loss.requires_grad, (
        "return a tensor that keeps the graph through P (the mean probabilities), so the router learns"
    )
    want = load_balancing_loss(probs, idx)
    got, expected = float(loss.detach()), float(want.detach())
    assert abs(got - expected) < 1e-5, f"got {got:.5f}, expected {expected:.5f}"


@exercise("04", "capacity_mask")
def check_capacity_mask(fn: Callable[..., Any]) -> None:
    """fn(expert_idx (N, k), n_experts, capacity) -> bool (N, k): first choices served first."""
    from codex_lab.nn.moe import capacity_keep_mask

    idx = torch.tensor([[0, 1], [1, 0]])
    keep = fn(idx, 2, 1)
    assert keep.dtype == torch.bool and tuple(keep.shape) == (2, 2), "return a bool tensor of shape (N, k)"
    want = torch.tensor([[True, False], [True, False]])
    assert torch.equal(keep, want), (
        f"got {keep.tolist()}, expected {want.tolist()}: serve every token's first choice before any "
        "second choice (slot by slot, tokens in order within a slot)"
    )
    g = torch.Generator().manual_seed(2)
    for cap in (1, 3, 5):
        idx = torch.stack([torch.randperm(6, generator=g)[:2] for _ in range(15)])  # (15, 2) distinct per token
        got = fn(idx, 6, cap)
        ref = capacity_keep_mask(idx, 6, cap)
        assert torch.equal(got, ref), f"capacity {cap}: {int((got != ref).sum())} assignments differ from the expected mask"
        counts = torch.bincount(idx[got], minlength=6)
        assert int(counts.max()) <= cap, f"capacity {cap}: an expert kept {int(counts.max())} assignments"
