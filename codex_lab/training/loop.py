"""The one training loop: AdamW, warm-up + cosine schedule, gradient clipping, gradient
accumulation, an evaluation hook every N steps and a progress bar with a time estimate.

Pre-training (:mod:`codex_lab.training.pretrain`), multi-task fine-tuning
(:mod:`codex_lab.training.finetune`), GQA uptraining, the MoE experiments and the capstone
all run :func:`run_loop`; what differs between them is only the loss of one micro-batch
(``loss_fn``), what happens at an evaluation (``eval_fn``) and the numbers of :class:`LoopConfig`.

One optimiser step::

    lr_t = schedule(t)                      # linear warm-up, then cosine to min_lr
    zero grads
    for each of accum_steps micro-batches:  # gradient accumulation
        loss = loss_fn(t) / accum_steps     # under bf16 autocast on CUDA
        loss.backward()
    clip ||grad|| to grad_clip; AdamW step
    t += 1; every eval_every steps (and at the last): eval_fn(t, row)
"""

from __future__ import annotations

import math
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm


@dataclass
class LoopConfig:
    """How :func:`run_loop` optimises.

    Args:
        steps: optimiser steps in all (a resumed run counts from ``start_step``).
        lr: peak learning rate, reached after ``warmup`` steps.
        min_lr: learning rate at ``steps`` after the cosine decay (``None`` = ``lr``: constant
            after the warm-up).
        warmup: linear warm-up steps (0 = none).
        weight_decay: AdamW decoupled weight decay (applied to matrices only when
            :func:`adamw` splits the parameters).
        betas: AdamW moment decays.
        grad_clip: clip the global gradient norm to this (``None`` = no clipping).
        accum_steps: micro-batches whose gradients are summed into one step.
        eval_every: steps between calls of ``eval_fn`` (0 = only at the last step).
    """

    steps: int
    lr: float
    min_lr: float | None = None
    warmup: int = 0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0
    accum_steps: int = 1
    eval_every: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.accum_steps < 1:
            raise ValueError(f"accum_steps must be >= 1, got {self.accum_steps}")
        if self.warmup < 0 or self.eval_every < 0:
            raise ValueError(f"warmup and eval_every must be >= 0, got {self.warmup} and {self.eval_every}")


def held_tail(cfg: LoopConfig, flat_share: float) -> tuple[LoopConfig, LoopConfig | None]:
    """Split ``cfg`` into a cosine that reaches ``min_lr`` at ``steps x (1 - flat_share)`` and a tail
    that holds ``min_lr`` to ``steps``: ``(cosine config, tail config or None)``. Run the first,
    then the tail with the same optimiser and ``start_step=cosine.steps``. A curve whose rate is
    still falling keeps improving to its last step whatever the budget; over a held tail the
    training-state rule reads whether more steps at the final rate would still help."""
    if not 0.0 <= flat_share < 1.0:
        raise ValueError(f"flat_share is the share of the steps held at min_lr, in [0, 1); got {flat_share}")
    if not flat_share:
        return cfg, None
    if cfg.min_lr is None:
        raise ValueError("flat_share needs min_lr: the rate held over the tail")
    # decay_end = steps x (1 - flat_share), at least past the warm-up
    decay_end = max(min(cfg.steps, cfg.warmup + 1), round(cfg.steps * (1.0 - flat_share)))
    tail = replace(cfg, lr=cfg.min_lr, min_lr=None, warmup=0) if cfg.steps > decay_end else None
    return replace(cfg, steps=decay_end), tail


def rates_at(eval_steps: Sequence[float], cfg: LoopConfig, flat_share: float = 0.0) -> list[float]:
    """The learning rate of the update before each evaluation step (an evaluation after ``t``
    updates follows update ``t - 1``; one at step 0 gets the first update's rate), for ``cfg``
    run as :func:`held_tail` splits it: the training-state rule's ``rates``."""
    cosine, tail = held_tail(cfg, flat_share)

    def rate(u: int) -> float:
        if tail is not None and u >= cosine.steps:
            return float(tail.lr)  # the held tail: min_lr
        return lr_schedule(u, cosine.lr, cosine.warmup, cosine.steps, cosine.min_lr)

    return [rate(max(0, int(s) - 1)) for s in eval_steps]


def lr_schedule(step: int, lr: float, warmup: int, steps: int, min_lr: float | None = None) -> float:
    """Learning rate at 0-based ``step``: linear warm-up to ``lr`` over ``warmup`` steps, then a
    cosine decay to ``min_lr`` at ``steps`` (constant ``lr`` when ``min_lr`` is None).

    The warm-up convention: step ``t`` (the ``t``-th optimiser update, from 0) uses
    ``lr * (t + 1) / warmup``, so the first update is not wasted at a rate of 0 and the peak is
    reached at step ``warmup - 1``. Hugging Face's schedulers (``get_cosine_schedule_with_warmup``)
    and CS336's use ``lr * t / warmup``, 0 at step 0: during the warm-up ours equals theirs one
    step later (ours(t) = theirs(t + 1)); from step ``warmup`` on the two are identical
    (``tests/test_checkpoint_train.py`` holds both statements against transformers).
    """
    if step < warmup:
        # lr * (step + 1) / warmup
        return lr * (step + 1) / warmup
    if min_lr is None:
        return lr
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    # min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def adamw(
    params: Iterable[torch.nn.Parameter] | torch.nn.Module, cfg: LoopConfig, *, split_decay: bool = False, fused: bool | None = None
) -> torch.optim.AdamW:
    """AdamW for ``params`` with ``cfg``'s lr, betas and weight decay.

    ``split_decay`` (a module): weight decay on matrices only, none on vectors (norm gains,
    biases), as pre-training does. ``fused``: the fused CUDA kernel.
    """
    if split_decay:
        assert isinstance(params, torch.nn.Module), "split_decay needs the module, to see parameter shapes"
        named = list(params.named_parameters())
        groups: Any = [{"params": [p for _, p in named if p.dim() >= 2], "weight_decay": cfg.weight_decay},
                       {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=fused)
    plist = list(params.parameters()) if isinstance(params, torch.nn.Module) else list(params)
    return torch.optim.AdamW(plist, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=fused)


def autocast_for(device: torch.device) -> AbstractContextManager:
    """bf16 autocast on CUDA (mixed precision); nothing elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


@dataclass
class LoopResult:
    """What :func:`run_loop` did: one row per step (``step``, ``loss``, ``lr`` and whatever
    ``loss_fn`` reported), the last step reached, and seconds spent training and evaluating."""

    rows: list[dict[str, float]] = field(default_factory=list)
    step: int = 0
    train_time_s: float = 0.0
    eval_time_s: float = 0.0

    @property
    def losses(self) -> list[float]:
        """The training loss of every step (nats/token as ``loss_fn`` reports it)."""
        return [r["loss"] for r in self.rows]


LossFn = Callable[[int], "tuple[Tensor, dict[str, float]]"]
EvalFn = Callable[[int, "dict[str, float]"], None]


def run_loop(
    loss_fn: LossFn,
    optimizer: torch.optim.Optimizer,
    cfg: LoopConfig,
    *,
    clip_params: Iterable[torch.nn.Parameter] | None = None,
    eval_fn: EvalFn | None = None,
    start_step: int = 0,
    autocast: AbstractContextManager | None = None,
    progress: bool = False,
    desc: str = "train",
) -> LoopResult:
    """Optimise from ``start_step`` to ``cfg.steps``; return the per-step rows and timing.

    Args:
        loss_fn: ``loss_fn(step) -> (loss, metrics)``: draws one micro-batch, runs the model and
            returns the scalar to minimise and numbers to log (a ``"loss"`` entry, the LM loss in
            nats/token, is shown on the bar; without one the minimised loss is logged).
        optimizer: e.g. :func:`adamw`; its learning rate is set every step from the schedule.
        cfg: steps, schedule, clipping, accumulation, evaluation period.
        clip_params: the parameters whose gradient norm is clipped (default: all the optimiser's).
        eval_fn: ``eval_fn(step, row)`` after every ``cfg.eval_every``-th step and after the
            last one (``row``: the step's logged numbers plus ``elapsed_s``); its time is
            counted in ``eval_time_s``, not ``train_time_s``.
        start_step: steps already done (resume).
        autocast: context for the forward (default: none; see :func:`autocast_for`).
        progress: show a tqdm bar (with its time estimate).
    """
    clip = list(clip_params) if clip_params is not None else [p for g in optimizer.param_groups for p in g["params"]]
    amp = autocast if autocast is not None else nullcontext()
    res = LoopResult(step=start_step)
    bar = tqdm(total=cfg.steps, initial=start_step, desc=desc, disable=not progress)
    t0 = time.perf_counter()
    step = start_step
    while step < cfg.steps:
        lr = lr_schedule(step, cfg.lr, cfg.warmup, cfg.steps, cfg.min_lr)
        for g in optimizer.param_groups:
            g["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        total = 0.0
        for _ in range(cfg.accum_steps):
            with amp:
                loss, m = loss_fn(step)
            # grad = mean over micro-batches of d loss_i: each backward carries 1 / accum_steps
            (loss / cfg.accum_steps if cfg.accum_steps > 1 else loss).backward()
            total += float(loss.detach())
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + v / cfg.accum_steps
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(clip, cfg.grad_clip)
        optimizer.step()
        step += 1
        row = {"step": step, "loss": total / cfg.accum_steps, **metrics, "lr": lr}
        res.rows.append(row)
        res.step = step
        bar.update(1)
        bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{lr:.1e}")
        if eval_fn is not None and ((cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps):
            e0 = time.perf_counter()
            eval_fn(step, {**row, "elapsed_s": e0 - t0})
            res.eval_time_s += time.perf_counter() - e0
    bar.close()
    res.train_time_s = time.perf_counter() - t0 - res.eval_time_s
    return res
