"""Loss balancing across tasks for multi-task fine-tuning (lesson 05).

Every strategy turns the per-token losses of a mixed batch into one scalar through the
same interface, and reports the per-task weights it used (logged every step):

    loss, weights = balancer(token_loss, targets, task)

- token_loss (B, T): cross-entropy per position (anything where targets == -100 is ignored);
- targets (B, T): next-token ids, -100 = no loss (prompt, padding);
- task (B,): task index of each row, 0..K-1.

Weights are normalised to sum to 1 over the tasks present in the batch, so the loss of
every strategy is  L = sum_k w_k * L_k  with L_k the task's mean loss over its valid tokens
(for "sample" and "token" the weights are the shares those strategies implicitly give).
Strategies: sample, token, task_token (MFTCoder case3), focal, dwa, uncertainty, coba.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class TaskStats:
    """Per-task sums of one batch: loss_sum (K,), tokens (K,), samples (K,), mean (K,)
    = loss_sum / tokens (0 where a task has no valid token), present (K,) bool."""

    loss_sum: Tensor
    tokens: Tensor
    samples: Tensor
    mean: Tensor
    present: Tensor


def task_stats(token_loss: Tensor, targets: Tensor, task: Tensor, n_tasks: int) -> TaskStats:
    """Sum each task's valid-token losses, count its valid tokens and samples."""
    if token_loss.shape != targets.shape:
        raise ValueError(f"token_loss {tuple(token_loss.shape)} and targets {tuple(targets.shape)} must have the same shape (B, T)")
    if task.shape != token_loss.shape[:1]:
        raise ValueError(f"task must be (B,) = ({token_loss.shape[0]},), got {tuple(task.shape)}")
    if task.numel() and (int(task.min()) < 0 or int(task.max()) >= n_tasks):
        raise ValueError(f"task indices must be in 0..{n_tasks - 1}, got {task.tolist()}")
    valid = (targets != -100).to(token_loss.dtype)  # (B, T)
    row_loss = (token_loss * valid).sum(dim=1)  # (B,)
    row_tokens = valid.sum(dim=1)  # (B,)
    onehot = torch.nn.functional.one_hot(task, n_tasks).to(token_loss.dtype)  # (B, K)
    loss_sum = onehot.T @ row_loss  # (K,)
    tokens = onehot.T @ row_tokens  # (K,)
    samples = onehot.sum(dim=0)  # (K,)
    present = tokens > 0  # (K,)
    # L_k = sum of task k's valid-token losses / its valid tokens
    mean = torch.where(present, loss_sum / tokens.clamp(min=1), torch.zeros_like(loss_sum))  # (K,)
    return TaskStats(loss_sum, tokens, samples, mean, present)


def token_losses(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy per position: logits (B, T, V), targets (B, T) -> (B, T); 0 where -100."""
    B, T, V = logits.shape
    # l_t = -log softmax(logits_t)[target_t]
    return torch.nn.functional.cross_entropy(logits.float().reshape(B * T, V), targets.reshape(-1), ignore_index=-100, reduction="none").view(B, T)


def _normalise(w: Tensor, present: Tensor) -> Tensor:
    """Zero the absent tasks and rescale so the weights sum to 1."""
    w = torch.where(present, w, torch.zeros_like(w))
    return w / w.sum().clamp(min=1e-12)


class Balancer(nn.Module):
    """Base class: ``forward(token_loss, targets, task) -> (loss, weights (K,))``.

    Subclasses implement :meth:`weights`. ``observe_val`` receives per-task validation
    losses (dynamic strategies use them); ``state()`` returns what to log.
    """

    name = "base"

    def __init__(self, n_tasks: int) -> None:
        super().__init__()
        if n_tasks < 1:
            raise ValueError(f"n_tasks must be >= 1, got {n_tasks}")
        self.n_tasks = n_tasks
        self.step = 0

    def weights(self, s: TaskStats) -> Tensor:
        """Per-task weights (K,), summing to 1 over present tasks, detached."""
        raise NotImplementedError

    def combine(self, s: TaskStats, w: Tensor) -> Tensor:
        """The scalar loss from the stats and weights: L = sum_k w_k L_k."""
        return (w * s.mean).sum()

    def forward(self, token_loss: Tensor, targets: Tensor, task: Tensor) -> tuple[Tensor, Tensor]:
        """(loss scalar, weights (K,)) for one batch; advances the step counter."""
        s = task_stats(token_loss, targets, task, self.n_tasks)
        if not bool(s.present.any()):
            raise ValueError("the batch has no valid (loss-bearing) token; check the collate masking")
        w = self.weights(s)
        loss = self.combine(s, w)
        self.after_step(s)
        self.step += 1
        return loss, w.detach()

    def after_step(self, s: TaskStats) -> None:
        """Hook for strategies that track training losses."""

    def sampling_weights(self) -> Tensor:
        """Task probabilities (K,) for a balancer-driven data mix: equal unless a strategy
        keeps weights between steps (``coba``)."""
        return torch.full((self.n_tasks,), 1.0 / self.n_tasks)

    def observe_val(self, val_losses: Tensor) -> None:
        """Receive per-task validation losses (K,) after an evaluation."""


class SampleMean(Balancer):
    """Every sample counts the same, whatever its length (the naive sample-weighted mean)."""

    name = "sample"

    def weights(self, s: TaskStats) -> Tensor:
        # reported share of task k: w_k = samples_k / B (each row's own token mean counts once)
        return _normalise(s.samples.clone(), s.present)

    def forward(self, token_loss: Tensor, targets: Tensor, task: Tensor) -> tuple[Tensor, Tensor]:
        s = task_stats(token_loss, targets, task, self.n_tasks)
        valid = (targets != -100).to(token_loss.dtype)  # (B, T)
        n = valid.sum(dim=1)  # (B,)
        keep = n > 0
        if not bool(keep.any()):
            raise ValueError("the batch has no valid (loss-bearing) token; check the collate masking")
        # L = (1/B) sum_i (1/n_i) sum_t l_it   (rows without valid tokens are skipped)
        row_mean = (token_loss * valid).sum(dim=1)[keep] / n[keep]  # (B',)
        self.step += 1
        return row_mean.mean(), self.weights(s)


class TokenMean(Balancer):
    """All valid tokens pooled: long answers and big tasks dominate (what the model's own loss does)."""

    name = "token"

    def weights(self, s: TaskStats) -> Tensor:
        # L = sum_i sum_t l_it / sum_i n_i  =  sum_k (N_k / N) L_k   ->  w_k = N_k / N
        return _normalise(s.tokens.clone(), s.present)


class TaskTokenMean(Balancer):
    """MFTCoder "case3": each task's mean over its own valid tokens, then an equal-weight mean."""

    name = "task_token"

    def weights(self, s: TaskStats) -> Tensor:
        # L = (1/K') sum_k L_k over the K' tasks present  ->  w_k = 1/K'
        return _normalise(torch.ones_like(s.mean), s.present)


class FocalTask(Balancer):
    """Focal-style: easy tasks (low loss, high mean token probability) are down-weighted."""

    name = "focal"

    def __init__(self, n_tasks: int, gamma: float = 2.0) -> None:
        super().__init__(n_tasks)
        self.gamma = gamma

    def weights(self, s: TaskStats) -> Tensor:
        # p_k = exp(-L_k) (geometric-mean token probability);  w_k ∝ (1 - p_k)^gamma
        p = torch.exp(-s.mean.detach())
        return _normalise((1.0 - p).clamp(min=1e-6) ** self.gamma, s.present)


class DynamicWeightAverage(Balancer):
    """Dynamic Weight Average (Liu et al. 2019) on per-task training-loss averages.

    A task whose loss falls slowly (ratio near or above 1) gets more weight.
    """

    name = "dwa"

    def __init__(self, n_tasks: int, temperature: float = 2.0, lag: int = 10, ema: float = 0.9) -> None:
        super().__init__(n_tasks)
        self.temperature, self.lag, self.ema_decay = temperature, lag, ema
        self.ema = torch.full((n_tasks,), float("nan"))
        self.history: list[Tensor] = []

    def weights(self, s: TaskStats) -> Tensor:
        if len(self.history) <= self.lag or torch.isnan(self.history[-1]).any() or torch.isnan(self.history[-1 - self.lag]).any():
            return _normalise(torch.ones_like(s.mean), s.present)
        # r_k = Lbar_k(t-1) / Lbar_k(t-1-lag);  w_k = softmax_k(r_k / T)
        r = self.history[-1] / self.history[-1 - self.lag].clamp(min=1e-8)
        return _normalise(torch.softmax(r / self.temperature, dim=0).to(s.mean.dtype), s.present)

    def after_step(self, s: TaskStats) -> None:
        m = s.mean.detach().cpu().float()
        p = s.present.cpu()
        # Lbar_k <- d * Lbar_k + (1 - d) * L_k   (first value: L_k itself)
        upd = torch.where(torch.isnan(self.ema), m, self.ema_decay * self.ema + (1 - self.ema_decay) * m)
        self.ema = torch.where(p, upd, self.ema)
        self.history.append(self.ema.clone())


class UncertaintyWeighting(Balancer):
    """Homoscedastic uncertainty weighting (Kendall et al. 2018) with learned s_k = log sigma_k^2.

    Its ``parameters()`` must be given to the optimiser.
    """

    name = "uncertainty"

    def __init__(self, n_tasks: int) -> None:
        super().__init__(n_tasks)
        self.log_var = nn.Parameter(torch.zeros(n_tasks))

    def weights(self, s: TaskStats) -> Tensor:
        # reported weight w_k ∝ exp(-s_k) (the factor in front of L_k)
        return _normalise(torch.exp(-self.log_var.detach()).to(s.mean.device), s.present)

    def combine(self, s: TaskStats, w: Tensor) -> Tensor:
        lv = self.log_var.to(s.mean.device)
        # L = sum_k present_k * (exp(-s_k) L_k + s_k) / 2
        terms = 0.5 * (torch.exp(-lv) * s.mean + lv)  # (K,)
        return torch.where(s.present, terms, torch.zeros_like(terms)).sum()


class ConvergenceBalancer(Balancer):
    """Convergence balancing in the style of CoBa (Gong et al. 2024), simplified.

    From the last ``window`` validation losses of each task, normalised by its first one,
    a least-squares slope alpha_k (per evaluation) measures how fast the task converges.
    Slow tasks (alpha near 0) get more weight than fast ones (alpha very negative), through
    the relative convergence score of CoBa; a diverging task (alpha > 0: validation loss
    rising) is cut to the floor, which replaces CoBa's divergence factor. Every weight stays
    at least ``floor`` so no task is ever switched off. Before ``window`` evaluations the
    weights are equal (MFTCoder case3).
    """

    name = "coba"

    def __init__(self, n_tasks: int, window: int = 3, floor: float = 0.05, temperature: float = 1.0) -> None:
        super().__init__(n_tasks)
        if window < 2:
            raise ValueError(f"window must be >= 2 evaluations to fit a slope, got {window}")
        if not 0.0 <= floor * n_tasks <= 1.0:
            raise ValueError(f"floor * n_tasks must be in [0, 1], got {floor} * {n_tasks}")
        self.window, self.floor, self.temperature = window, floor, temperature
        self.val_history: list[Tensor] = []
        self.current = torch.full((n_tasks,), 1.0 / n_tasks)
        self.slopes = torch.zeros(n_tasks)

    def observe_val(self, val_losses: Tensor) -> None:
        self.val_history.append(val_losses.detach().cpu().float())
        if len(self.val_history) < self.window:
            return
        h = torch.stack(self.val_history[-self.window :])  # (W, K)
        h = h / self.val_history[0].clamp(min=1e-8)  # normalised: l_k(t) / l_k(0)
        self.slopes = slopes(h)
        self.current = coba_weights(self.slopes, floor=self.floor, temperature=self.temperature)

    def weights(self, s: TaskStats) -> Tensor:
        return _normalise(self.current.to(s.mean), s.present)

    def sampling_weights(self) -> Tensor:
        """The current convergence weights (K,), every one >= floor."""
        return self.current.clone()


def slopes(h: Tensor) -> Tensor:
    """Least-squares slope of each column of h (W, K) against 0..W-1 -> (K,)."""
    W = h.shape[0]
    x = torch.arange(W, dtype=h.dtype) - (W - 1) / 2.0  # centred steps (W,)
    # alpha_k = sum_t x_t (h_tk - mean_k) / sum_t x_t^2
    return (x[:, None] * (h - h.mean(dim=0, keepdim=True))).sum(dim=0) / (x**2).sum()


def coba_weights(alpha: Tensor, floor: float = 0.05, temperature: float = 1.0) -> Tensor:
    """Weights (K,) from validation-loss slopes alpha (K,), per :class:`ConvergenceBalancer`."""
    K = alpha.numel()
    scale = alpha.abs().sum().clamp(min=1e-12)
    # RCS_k = softmax_k(K * alpha_k / (T * sum_j |alpha_j|)): slower (larger alpha) -> larger
    rcs = torch.softmax(K * alpha / (temperature * scale), dim=0)
    rcs = torch.where(alpha > 0, torch.zeros_like(rcs), rcs)  # diverging task: floor only
    if rcs.sum() <= 0:
        rcs = torch.ones_like(rcs)
    rcs = rcs / rcs.sum()
    # w_k = floor + (1 - K * floor) * RCS_k   (every w_k >= floor, sum = 1)
    return floor + (1.0 - K * floor) * rcs


STRATEGIES: dict[str, type[Balancer]] = {
    c.name: c for c in (SampleMean, TokenMean, TaskTokenMean, FocalTask, DynamicWeightAverage, UncertaintyWeighting, ConvergenceBalancer)
}


def make_balancer(name: str, n_tasks: int, **kwargs: float) -> Balancer:
    """A balancer by name (see :data:`STRATEGIES`); keyword options go to its constructor."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown balancing strategy {name!r}; choose one of {sorted(STRATEGIES)}")
    return STRATEGIES[name](n_tasks, **kwargs)  # type: ignore[arg-type]


def relative_improvement(before: Tensor, after: Tensor) -> Tensor:
    """Per-task relative validation-loss improvement (before - after) / before, (K,)."""
    return (before - after) / before.clamp(min=1e-12)


def spread(x: Tensor) -> float:
    """max - min of a 1-D tensor (the spread of relative improvements across tasks)."""
    return float(x.max() - x.min()) if x.numel() else math.nan
