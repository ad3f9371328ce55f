"""Multi-task fine-tuning loop with a pluggable loss balancer (lesson 05).

Batches are drawn from the pooled training examples of all tasks (``mix="size"``: each
example equally likely, so a task's share of the batch follows its data size, as when
datasets are simply concatenated), task-first (``mix="uniform"``: pick a task uniformly,
then an example of it), or task-first with the balancer's current weights as the task
probabilities (``mix="balancer"``: dynamic weights steer the data mix, not only the loss). The balancer turns the per-token losses into one scalar and its
per-task weights are logged every step; per-task validation loss and answer-token accuracy
are measured every ``eval_every`` steps (and at step 0) and fed to the balancer.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from codex_lab.training.balancing import Balancer, make_balancer, relative_improvement, spread, token_losses
from codex_lab.nn.model import CodexModel
from codex_lab.training.evaluate import task_losses
from codex_lab.training.loop import LoopConfig, adamw, run_loop
from codex_lab.runtime import seed_everything
from codex_lab.data.task_batches import Encoded, collate, encode_tasks
from codex_lab.data.tasks import TaskSet
from codex_lab.data.tokenizer import CodeTokenizer


@dataclass
class FinetuneConfig:
    """What one fine-tuning run does.

    Args:
        tasks: task names (see ``codex_lab.data.tasks.TASKS``), in the order of their indices.
        balance: balancing strategy (``codex_lab.training.balancing.STRATEGIES``).
        steps: optimiser steps.
        batch_size: examples per step.
        lr: AdamW learning rate (constant after a short linear warm-up of ``warmup`` steps).
        warmup: warm-up steps.
        weight_decay: AdamW weight decay.
        max_len: longest example kept, in tokens (prompt + answer).
        eval_every: steps between per-task validations.
        val_per_task: held-out examples per task used for validation loss (first N, fixed).
        mix: "size" (sample examples from the pool), "uniform" (sample a task, then an example) or
            "balancer" (sample a task with the balancer's ``sampling_weights()``, then an example).
        seed: seed of initial state, batch order and balancer.
        grad_clip: gradient-norm clip.
        balance_options: keyword options of the balancer (e.g. ``{"floor": 0.05}``).
        device: "cpu", "cuda", ... (``None``: the model's device).
    """

    tasks: tuple[str, ...] = ("completion", "bugfix", "testgen")
    balance: str = "token"
    steps: int = 200
    batch_size: int = 16
    lr: float = 3e-4
    warmup: int = 10
    weight_decay: float = 0.0
    max_len: int = 320
    eval_every: int = 20
    val_per_task: int = 32
    mix: str = "size"
    seed: int = 0
    grad_clip: float = 1.0
    balance_options: dict[str, float] = field(default_factory=dict)
    device: str | None = None

    def __post_init__(self) -> None:
        if self.mix not in ("size", "uniform", "balancer"):
            raise ValueError(f"mix must be 'size', 'uniform' or 'balancer', got {self.mix!r}")
        if not self.tasks:
            raise ValueError("give at least one task")
        if self.steps < 1 or self.batch_size < 1 or self.eval_every < 1:
            raise ValueError("steps, batch_size and eval_every must be >= 1")


@dataclass
class FinetuneResult:
    """A finished run.

    ``steps``: one dict per step (step, loss, w_<task>, n_<task> rows in the batch);
    ``evals``: one dict per evaluation (step, val_<task>, acc_<task>);
    ``initial``/``final``: per-task validation losses before and after (K,).
    """

    config: FinetuneConfig
    steps: list[dict[str, float]]
    evals: list[dict[str, float]]
    initial: torch.Tensor
    final: torch.Tensor
    final_acc: torch.Tensor
    train_sizes: dict[str, int]
    time_s: float

    @property
    def rel_improvement(self) -> torch.Tensor:
        """(L_before - L_after) / L_before per task, (K,)."""
        return relative_improvement(self.initial, self.final)

    @property
    def improvement_spread(self) -> float:
        """max - min of the relative improvements across tasks."""
        return spread(self.rel_improvement)

    def table(self) -> str:
        """Per-task plain-text table: examples, val loss before/after, relative gain, accuracy, last weight."""
        names = self.config.tasks
        last = self.steps[-1] if self.steps else {}
        lines = [f"{'task':<11} {'train ex':>8} {'val before':>10} {'val after':>9} {'rel gain':>8} {'tok acc':>7} {'weight':>6}"]
        for k, t in enumerate(names):
            lines.append(
                f"{t:<11} {self.train_sizes.get(t, 0):>8} {float(self.initial[k]):>10.3f} {float(self.final[k]):>9.3f} "
                f"{float(self.rel_improvement[k]):>8.1%} {float(self.final_acc[k]):>7.1%} {last.get('w_' + t, float('nan')):>6.3f}"
            )
        lines.append(f"spread of relative gains: {self.improvement_spread:.3f}  ({self.config.balance}, {len(self.steps)} steps, {self.time_s:.1f} s)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable summary."""
        return {"config": asdict(self.config), "steps": self.steps, "evals": self.evals,
                "initial": self.initial.tolist(), "final": self.final.tolist(), "final_acc": self.final_acc.tolist(),
                "rel_improvement": self.rel_improvement.tolist(), "spread": self.improvement_spread,
                "train_sizes": self.train_sizes, "time_s": self.time_s}


def prepare(tok: CodeTokenizer, taskset: TaskSet, cfg: FinetuneConfig) -> tuple[dict[str, list[Encoded]], dict[str, list[Encoded]]]:
    """Encoded (train, val) examples of ``cfg.tasks``; val is cut to ``cfg.val_per_task`` per task."""
    missing = [t for t in cfg.tasks if t not in taskset.examples]
    if missing:
        raise ValueError(f"tasks {missing} were not built; build_tasks(..., tasks=...) must include them")
    train = encode_tasks(tok, taskset.split("train"), cfg.tasks, cfg.max_len)
    val = encode_tasks(tok, taskset.split("val"), cfg.tasks, cfg.max_len)
    val = {t: v[: cfg.val_per_task] for t, v in val.items()}
    empty = [t for t in cfg.tasks if not train[t] or not val[t]]
    if empty:
        raise ValueError(f"tasks {empty} have no train or validation example of <= {cfg.max_len} tokens; raise max_len or use a bigger corpus")
    return train, val


class FinetuneSession:
    """A fine-tuning run that can be continued: :meth:`advance` trains ``n`` more steps from where
    the last call stopped (the model, optimiser, balancer and batch generator carry over), so a
    run can be extended until its arm reaches a plateau (:mod:`codex_lab.training.plateau`).
    The learning rate is constant after the warm-up, so the steps of one call or of several are
    the same steps: ``advance(a); advance(b)`` equals one run of ``a + b`` steps
    (``tests/test_finetune.py`` holds them equal). ``cfg.steps`` is not used; :func:`finetune`
    runs exactly ``cfg.steps``.
    """

    def __init__(self, model: CodexModel, tok: CodeTokenizer, taskset: TaskSet, cfg: FinetuneConfig, *,
                 balancer: Balancer | None = None) -> None:
        self.model, self.cfg = model, cfg
        self.train, self.val = prepare(tok, taskset, cfg)
        self.names = list(cfg.tasks)
        self.device = torch.device(cfg.device) if cfg.device else next(model.parameters()).device
        model.to(self.device).train()
        self.gen = seed_everything(cfg.seed)
        self.bal = balancer or make_balancer(cfg.balance, len(self.names), **cfg.balance_options)
        self.bal.to(self.device)
        self.loop = LoopConfig(steps=cfg.steps, lr=cfg.lr, warmup=max(1, cfg.warmup), weight_decay=cfg.weight_decay,
                               grad_clip=cfg.grad_clip, eval_every=cfg.eval_every)
        self.opt = adamw(list(model.parameters()) + list(self.bal.parameters()), self.loop)
        self.pool = [e for t in self.names for e in self.train[t]]
        self.pad = tok.pad_id
        self.step = 0
        self.rows: list[dict[str, float]] = []
        self.evals: list[dict[str, float]] = []
        self.time_s = 0.0
        self.initial = self._eval(0)

    def _draw(self) -> list[Encoded]:
        cfg, gen, names, K = self.cfg, self.gen, self.names, len(self.names)
        if cfg.mix == "size":
            idx = torch.randint(0, len(self.pool), (cfg.batch_size,), generator=gen).tolist()
            return [self.pool[i] for i in idx]
        if cfg.mix == "balancer":
            # P(task k) = the balancer's current weight w_k
            ks = torch.multinomial(self.bal.sampling_weights().cpu().float(), cfg.batch_size, replacement=True,
                                   generator=gen).tolist()
        else:
            ks = torch.randint(0, K, (cfg.batch_size,), generator=gen).tolist()
        return [self.train[names[k]][int(torch.randint(0, len(self.train[names[k]]), (1,), generator=gen))] for k in ks]

    def _loss(self, _: int) -> tuple[Tensor, dict[str, float]]:
        names, K = self.names, len(self.names)
        b = collate(self._draw(), self.pad)
        y = b.y.to(self.device)
        logits = self.model(b.x.to(self.device)).logits  # (B, T, V)
        loss, w = self.bal(token_losses(logits, y), y, b.task.to(self.device))
        counts = torch.bincount(b.task, minlength=K)
        return loss, {**{f"w_{t}": float(w[k]) for k, t in enumerate(names)},
                      **{f"n_{t}": float(counts[k]) for k, t in enumerate(names)}}

    def _eval(self, step: int, _: dict[str, float] | None = None) -> Tensor:
        if self.evals and self.evals[-1]["step"] == step:
            return torch.empty(0)
        vl, acc = task_losses(self.model, self.val, self.names, pad_id=self.pad, batch_size=self.cfg.batch_size)
        self.evals.append({"step": float(step), **{f"val_{t}": float(vl[k]) for k, t in enumerate(self.names)},
                           **{f"acc_{t}": float(acc[k]) for k, t in enumerate(self.names)}})
        self.bal.observe_val(vl)
        return vl

    def advance(self, steps: int, *, progress: bool = False) -> None:
        """Train ``steps`` more optimiser steps (evaluating every ``eval_every`` and at the end)."""
        if steps < 1:
            raise ValueError(f"advance() needs at least 1 step, got {steps}")
        t0 = time.perf_counter()
        self.loop.steps = self.step + steps
        done = run_loop(self._loss, self.opt, self.loop, clip_params=self.model.parameters(), eval_fn=self._eval,
                        start_step=self.step, progress=progress, desc=f"finetune {self.cfg.balance}")
        self.rows += [{**r, "step": float(r["step"])} for r in done.rows]
        self.step = self.loop.steps
        self.time_s += time.perf_counter() - t0

    def result(self) -> FinetuneResult:
        """The run so far as a :class:`FinetuneResult` (its config's ``steps`` set to the steps run)."""
        names = self.names
        final = torch.tensor([self.evals[-1][f"val_{t}"] for t in names])
        final_acc = torch.tensor([self.evals[-1][f"acc_{t}"] for t in names])
        if any(math.isnan(float(v)) for v in final):
            raise RuntimeError("a task's validation loss is NaN; check its validation examples")
        cfg = FinetuneConfig(**{**asdict(self.cfg), "steps": self.step, "tasks": tuple(self.cfg.tasks)})
        return FinetuneResult(cfg, list(self.rows), list(self.evals), self.initial, final, final_acc,
                              {t: len(self.train[t]) for t in names}, self.time_s)


def finetune(
    model: CodexModel,
    tok: CodeTokenizer,
    taskset: TaskSet,
    cfg: FinetuneConfig,
    *,
    progress: bool = True,
    balancer: Balancer | None = None,
) -> FinetuneResult:
    """Fine-tune ``model`` in place on the tasks of ``cfg`` with the chosen balancer for ``cfg.steps`` steps."""
    s = FinetuneSession(model, tok, taskset, cfg, balancer=balancer)
    s.advance(cfg.steps, progress=progress)
    r = s.result()
    r.config = cfg
    return r

