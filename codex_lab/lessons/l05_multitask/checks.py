"""Lesson 05 exercises: valid-token masked loss, per-task token-mean balancing, convergence weights."""

from __future__ import annotations

from typing import Any, Callable

import torch

from codex_lab.course.checks import exercise

# float32 sums of at most a few hundred terms of size ~10: rounding stays below 1e-5
TOL = 1e-5


def _close(got: Any, want: torch.Tensor, what: str) -> None:
    assert isinstance(got, torch.Tensor), f"{what}: return a tensor, got {type(got).__name__}"
    assert got.shape == want.shape, f"{what}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}"
    assert torch.allclose(got.float(), want.float(), atol=TOL), f"{what}: expected {want.tolist()}, got {got.tolist()}"


@exercise("05", "masked_token_loss")
def check_masked_token_loss(fn: Callable[..., Any]) -> None:
    """fn(logits (B, T, V), targets (B, T)) -> mean cross-entropy over targets != -100."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 6, 11, generator=g)
    targets = torch.randint(0, 11, (3, 6), generator=g)
    targets[0, :4] = -100
    targets[2, 1:] = -100
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1), ignore_index=-100)
    got = fn(logits, targets)
    assert isinstance(got, torch.Tensor) and got.dim() == 0, "return a scalar tensor"
    all_tokens = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), targets.clamp(min=0).reshape(-1))
    assert not torch.allclose(got, all_tokens, atol=TOL), "masked tokens (-100) must carry no loss and must not count in the mean"
    _close(got, want, "masked_token_loss")


@exercise("05", "task_token_mean_loss")
def check_task_token_mean_loss(fn: Callable[..., Any]) -> None:
    """fn(token_loss (B, T), targets (B, T), task (B,), n_tasks) -> mean over present tasks of each task's valid-token mean."""
    loss = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [2.0, 2.0, 9.0, 9.0]])
    targets = torch.tensor([[5, 5, 5, -100], [5, -100, -100, -100], [5, 5, -100, -100]])
    task = torch.tensor([0, 1, 0])
    got = fn(loss, targets, task, 3)
    assert isinstance(got, torch.Tensor) and got.dim() == 0, "return a scalar tensor"
    assert abs(float(got) - 14 / 6) > 1e-3, "that is the pooled token mean: average each task over its own tokens first"
    assert abs(float(got) - 8 / 3) > 1e-3, "that is the mean of per-sample means: pool each task's tokens instead"
    assert abs(float(got) - 2.0) > 1e-3, "task 2 has no example in the batch: average over the tasks present only"
    _close(got, torch.tensor(3.0), "task 0 mean (1+2+3+2+2)/5 = 2, task 1 mean 4 -> (2 + 4) / 2")
    from codex_lab.training.balancing import TaskTokenMean

    g = torch.Generator().manual_seed(1)
    tl = torch.rand(6, 7, generator=g) * 5
    tg = torch.randint(0, 9, (6, 7), generator=g)
    tg[torch.rand(6, 7, generator=g) < 0.4] = -100
    tg[:, 0] = 3  # every row has at least one valid token
    tk = torch.tensor([0, 2, 2, 0, 3, 2])
    want, _ = TaskTokenMean(4)(tl, tg, tk)
    _close(fn(tl, tg, tk, 4), want, "random batch")


@exercise("05", "convergence_weights")
def check_convergence_weights(fn: Callable[..., Any]) -> None:
    """fn(history (W, K), floor) -> CoBa-style weights (K,) from normalised validation-loss slopes."""
    from codex_lab.training.balancing import coba_weights, slopes

    h = torch.tensor([[4.0, 2.0, 1.0], [3.2, 1.96, 1.02], [2.4, 1.92, 1.04]])  # task 2 diverges
    got = fn(h, 0.05)
    want = coba_weights(slopes(h / h[0]), floor=0.05)
    assert isinstance(got, torch.Tensor) and got.shape == (3,), "return a (K,) tensor"
    assert abs(float(got.sum()) - 1.0) < TOL, f"weights must sum to 1, got {float(got.sum()):.4f}"
    assert abs(float(got[2]) - 0.05) < TOL, "a task whose validation loss rises (slope > 0) gets only the floor"
    assert got[1] > got[0], "the slow task (flatter curve) must get more weight than the fast one"
    raw = coba_weights(slopes(h), floor=0.05)
    assert not torch.allclose(got, raw, atol=1e-3) or torch.allclose(want, raw, atol=1e-3), "normalise each task's history by its first loss before fitting slopes"
    _close(got, want, "convergence_weights")
    h4 = torch.tensor([[5.0, 3.0, 2.0, 1.0], [4.0, 2.9, 1.5, 0.99], [3.5, 2.8, 1.2, 0.98], [3.2, 2.7, 1.0, 0.97]])
    _close(fn(h4, 0.1), coba_weights(slopes(h4 / h4[0]), floor=0.1), "four tasks, window 4, floor 0.1")
