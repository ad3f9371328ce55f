"""Lesson 05 exercises: valid-token masked loss, per-task token-mean balancing (MFTCoder
case 3), convergence (CoBa-style) weights.

Each check computes its own reference here (never the package's answer, which may be
unavailable while a check runs) and, when the answer is wrong, compares it with the
plausible mistakes one by one so the feedback names the bug instead of printing numbers.
tests/test_exercises_05_06.py holds those mistakes and asserts each one fails.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from codex_lab.course.check_tools import pure_call, rng
from codex_lab.course.checks import case, exercise
from codex_lab.course.forbid import LOSS_BUILTINS

_BAL = "codex_lab.training.balancing."

# float32 sums of at most a few hundred terms of size ~10: rounding stays below 1e-5
TOL = 1e-5


def _scalar(got: Any, what: str) -> Tensor:
    assert isinstance(got, Tensor), f"{what}: return a torch tensor (a 0-dim one), got {type(got).__name__}"
    assert got.dim() == 0, f"{what}: return a scalar (0-dim) tensor, got shape {tuple(got.shape)}; reduce to one number"
    return got


def _diagnose(got: Tensor, want: Tensor, mistakes: dict[str, Tensor], what: str) -> None:
    """Pass if got == want; otherwise name the first known mistake got equals, else say what differs."""
    if torch.allclose(got.float(), want.float(), atol=TOL):
        return
    for message, value in mistakes.items():
        if value.shape == got.shape and torch.allclose(got.float(), value.float(), atol=TOL):
            raise AssertionError(f"{what}: {message}")
    raise AssertionError(f"{what}: expected {_fmt(want)}, got {_fmt(got)}; none of the usual mistakes, "
                         "so re-read the formula in the exercise text step by step")


def _fmt(x: Tensor) -> str:
    return f"{float(x):.4f}" if x.dim() == 0 else str([round(v, 4) for v in x.flatten().tolist()])


# ------------------------------------------------------------------ exercise 1
def _nll(logits: Tensor, targets: Tensor) -> Tensor:
    # l_bt = -log softmax(logits_bt)[target_bt]; masked slots read target 0 (multiplied away later)
    logp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    return -logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, T)


@exercise("05", "masked_token_loss", points=3, forbid=tuple(_BAL + n for n in (
    "token_losses", "task_stats", "Balancer.forward", "SampleMean.forward")) + LOSS_BUILTINS)
def check_masked_token_loss(fn: Callable[..., Any]) -> None:
    """fn(logits (B, T, V), targets (B, T)) -> mean cross-entropy over targets != -100."""
    g = rng("05.masked_token_loss")

    def draw() -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
        """One draw of the inputs, the reference and the value of every known mistake."""
        B, T, V = 3, 6, 11
        logits = (torch.randn(B, T, V, generator=g) * 2).requires_grad_(True)
        targets = torch.randint(0, V, (B, T), generator=g)
        targets[0, :4] = -100  # a prompt
        targets[2, 1:] = -100  # padding after one answer token
        # token id 0 is a real token (a tokenizer's first id): two real targets are 0, so an answer
        # that treats 0 as padding (targets > 0) sees a different loss
        targets[1, 2], targets[0, 5] = 0, 0
        valid = (targets != -100).float()  # (B, T)
        nll = _nll(logits.detach(), targets)  # (B, T)
        want = (nll * valid).sum() / valid.sum()
        pos = (targets > 0).float()
        p = torch.softmax(logits.detach(), dim=-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        mistakes = {
            "masked positions (target -100) carry loss: they must be left out of the sum and of the count":
                nll.mean(),
            "you summed the valid-token losses but divided by all B*T positions; divide by the number of valid tokens":
                (nll * valid).sum() / (B * T),
            "that is the mean of per-row means (each sample counts the same); pool all valid tokens of the batch into one mean":
                ((nll * valid).sum(1) / valid.sum(1)).mean(),
            "that is the sum of the valid-token losses; divide it by the number of valid tokens":
                (nll * valid).sum(),
            "the loss must be -log softmax(logits)[target], not -logits[target] (apply log_softmax first)":
                (-logits.detach().gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * valid).sum() / valid.sum(),
            "the loss is -log p(target); you used -p (the probability, not its log)":
                (-p * valid).sum() / valid.sum(),
            "token id 0 is a real token: only -100 marks a masked position (you treated target 0 as padding)":
                (nll * pos).sum() / pos.sum(),
        }
        if T > 1:  # the targets are already the next tokens: shifting again is a bug
            sh = _nll(logits.detach()[:, :-1], targets[:, 1:])
            vs = valid[:, 1:]
            mistakes["targets are already the next tokens (y = x shifted by one): do not shift logits and targets again"] = (sh * vs).sum() / vs.sum()
        return logits, targets, want, mistakes

    # the inputs are drawn until the reference and every mistake differ by more than the tolerance
    # many times over: two values that coincide by chance would name the wrong mistake (a shifted
    # answer was once diagnosed as treating token 0 as padding)
    for _ in range(50):
        logits, targets, want, mistakes = draw()
        values = [want, *mistakes.values()]
        if all(abs(float(a) - float(b)) > 100 * TOL for i, a in enumerate(values) for b in values[i + 1:]):
            break
    B, T, V = logits.shape
    full = torch.randint(0, V, (B, T), generator=g)
    with case(2, "prompt and padding masked"):
        got = _scalar(pure_call(fn, ("logits", "targets"), logits, targets), "masked_token_loss")
        assert got.requires_grad, "masked_token_loss: the loss is detached from the logits (no .item(), .detach() or numpy), so training could not backpropagate through it"
        _diagnose(got.detach(), want, mistakes, "masked_token_loss")
    with case(1, "no masked position"):  # all-valid rows: plain cross-entropy
        want2 = _nll(logits.detach(), full).mean()
        _diagnose(_scalar(fn(logits, full), "masked_token_loss").detach(), want2, {}, "masked_token_loss with no masked token (plain cross-entropy)")


# ------------------------------------------------------------------ exercise 2
@exercise("05", "task_token_mean_loss", points=3, forbid=tuple(_BAL + n for n in (
    "task_stats", "Balancer.forward", "SampleMean.forward", "TaskTokenMean.weights")))
def check_task_token_mean_loss(fn: Callable[..., Any]) -> None:
    """fn(token_loss (B, T), targets (B, T), task (B,), n_tasks) -> mean over present tasks of each task's valid-token mean."""
    # 9.0 sits at masked positions: an answer that forgets the mask picks it up
    loss = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [2.0, 2.0, 9.0, 9.0]])
    targets = torch.tensor([[5, 5, 5, -100], [5, -100, -100, -100], [5, 5, -100, -100]])
    task = torch.tensor([0, 1, 0])
    mistakes = {
        "that is the pooled token mean over the whole batch (the naive loss): average each task over its own valid tokens first, then take the plain mean over tasks":
            torch.tensor(14 / 6),
        "that is the mean of per-sample means: pool each task's valid tokens into one mean per task instead":
            torch.tensor(8 / 3),
        "task 2 has no example in this batch: average over the tasks present only (divide by 2 here, not by n_tasks = 3)":
            torch.tensor(2.0),
        "masked positions (target -100) count in your per-task means: use only the valid tokens in both the sum and the count":
            torch.tensor(((1 + 2 + 3 + 9 + 2 + 2 + 9 + 9) / 8 + (4 + 27) / 4) / 2),
        "you divided each task's loss sum by its number of rows (samples), not by its number of valid tokens":
            torch.tensor((10 / 2 + 4 / 1) / 2),
        "that is a sum over tasks of their means; take the mean over the tasks present":
            torch.tensor(6.0),
    }
    with case(2, "hand-checked batch, one task absent"):
        got = _scalar(pure_call(fn, ("token_loss", "targets", "task", "n_tasks"), loss, targets, task, 3), "task_token_mean_loss")
        _diagnose(got, torch.tensor(3.0), mistakes, "task_token_mean_loss (task 0: (1+2+3+2+2)/5 = 2, task 1: 4, so (2 + 4) / 2 = 3)")

    g = rng("05.task_token_mean_loss")
    tl = torch.rand(6, 7, generator=g) * 5
    tg = torch.randint(0, 9, (6, 7), generator=g)
    tg[torch.rand(6, 7, generator=g) < 0.4] = -100
    tg[:, 0] = 3  # every row has at least one valid token
    tg[0, 1], tg[4, 2] = 0, 0  # token id 0 is a real target, not padding: an answer using targets > 0 differs
    tk = torch.tensor([0, 2, 2, 0, 3, 2])
    valid = (tg != -100).float()
    means = [(tl * valid)[tk == k].sum() / valid[tk == k].sum() for k in (0, 2, 3)]
    want = torch.stack(means).mean()
    with case(1, "random batch of 3 of 4 tasks"):
        _diagnose(_scalar(fn(tl, tg, tk, 4), "task_token_mean_loss"), want, {}, "task_token_mean_loss on a random batch of 3 of 4 tasks")
        tl.requires_grad_(True)
        assert fn(tl, tg, tk, 4).requires_grad, "task_token_mean_loss: the result is detached from token_loss; keep it a tensor computation so it can be backpropagated"


# ------------------------------------------------------------------ exercise 3
def _slopes(h: Tensor) -> Tensor:
    W = h.shape[0]
    x = torch.arange(W, dtype=h.dtype) - (W - 1) / 2.0  # (W,)
    # alpha_k = sum_t (t - tbar)(h_tk - hbar_k) / sum_t (t - tbar)^2
    return (x[:, None] * (h - h.mean(dim=0))).sum(dim=0) / (x**2).sum()  # (K,)


def _weights(alpha: Tensor, floor: float, *, cut: bool = True, sign: float = 1.0, scale_k: bool = True) -> Tensor:
    K = alpha.numel()
    z = sign * (K if scale_k else 1) * alpha / alpha.abs().sum()
    rcs = torch.softmax(z, dim=0)
    if cut:
        rcs = torch.where(alpha > 0, torch.zeros_like(rcs), rcs)
    rcs = rcs / rcs.sum()
    return floor + (1 - K * floor) * rcs


@exercise("05", "convergence_weights", points=3, forbid=tuple(_BAL + n for n in (
    "coba_weights", "slopes", "ConvergenceBalancer.observe_val")))
def check_convergence_weights(fn: Callable[..., Any]) -> None:
    """fn(history (W, K), floor) -> CoBa-style weights (K,) from normalised validation-loss slopes."""
    cases = [
        # task 0 fast, task 1 slow, task 2 diverging; different starting losses
        (torch.tensor([[4.0, 2.0, 1.0], [3.2, 1.96, 1.02], [2.4, 1.92, 1.04]]), 0.05),
        # four tasks, a curved history (least squares != last - first), floor 0.1
        (torch.tensor([[5.0, 3.0, 2.0, 1.0], [3.0, 2.9, 1.5, 0.99], [2.8, 2.8, 1.2, 0.98], [2.7, 2.5, 1.0, 0.97]]), 0.1),
    ]
    g = rng("05.convergence_weights")  # a history drawn for this run: decaying losses, one task rising
    drawn = 3.0 * torch.exp(-torch.rand(1, 5, generator=g) * torch.arange(4.0)[:, None]) + 0.1
    drawn[:, 4] = torch.linspace(1.0, 1.2, 4)
    for (h, floor), pts, label in zip(cases, (2, 1), ("three tasks, one diverging", "four tasks, a curved history")):
        with case(pts, label):
            _check_weights(fn, h, floor)
            if pts == 1:
                _check_weights(fn, drawn, 0.05)


def _check_weights(fn: Callable[..., Any], h: Tensor, floor: float) -> None:
    """One history: the weights, or the name of the mistake that gives the learner's numbers."""
    W, K = h.shape
    n = h / h[0]
    a = _slopes(n)
    want = _weights(a, floor)
    ends = (n[-1] - n[0]) / (W - 1)
    mistakes = {
        "normalise each task's history by its first loss (h / h[0]) before fitting the slopes: tasks start at different losses":
            _weights(_slopes(h), floor),
        "a task whose validation loss rises (slope > 0) must get RCS 0 (only the floor) before renormalising":
            _weights(a, floor, cut=False),
        "every weight must be at least the floor: return floor + (1 - K * floor) * RCS, not RCS alone":
            _weights(a, 0.0),
        "the softmax is the wrong way round: slow tasks (slope near 0) must get MORE weight than fast ones (very negative slope); use +K*alpha/sum|alpha|":
            _weights(a, floor, sign=-1.0),
        "the softmax input is K * alpha / sum_j |alpha_j|; you left out the factor K":
            _weights(a, floor, scale_k=False),
        "the slope is a least-squares fit over the whole window, not (last - first) / (W - 1)":
            _weights(ends, floor),
    }
    got = pure_call(fn, ("history", "floor"), h, floor)
    assert isinstance(got, Tensor) and got.shape == (K,), f"convergence_weights: return a (K,) = ({K},) tensor, got {getattr(got, 'shape', type(got).__name__)}"
    _diagnose(got, want, mistakes, f"convergence_weights on a {W}x{K} history, floor {floor}")
