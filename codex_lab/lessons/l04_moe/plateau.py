"""Lesson 04's quality claims with every arm at its own plateau: MoE against dense at equal
active compute and at equal total parameters, each arm trained from scratch until the
training-state rule calls it trained.

The fixed-budget protocol (:mod:`codex_lab.lessons.l04_moe.protocol`) gives every arm the same
steps on a cosine schedule; at a rate that can still move the model its arms were still learning
(the tuning runs in :func:`~codex_lab.lessons.l04_moe.protocol.protocol_plan`). Here every arm of
:data:`~codex_lab.lessons.l04_moe.protocol.QUALITY_ARMS` trains, its seeds in lockstep, at one held
rate (after a warm-up) until the rule calls it trained or the cap
(:func:`codex_lab.training.lm_plateau.lm_to_plateau`), then half as long again (the
budget-extension check). Every arm of a seed shares the initialisation draw, the data order and
the evaluation sample (paired), as in the fixed protocol; the verdicts are the protocol's own
(:func:`~codex_lab.lessons.l04_moe.protocol.quality_verdicts`) on the losses at each arm's
stopping point.

The rate is held at half the plan's peak (:func:`codex_lab.training_state.held_floor`), the rate
the fixed protocol holds over its judged tail: a constant rate has a noise floor of its own, so
every arm is judged at the same one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import torch
from torch import Tensor

from codex_lab.lessons.l04_moe.protocol import (MIN_CHANGE, QUALITY_ARMS, Plan, QualityVerdicts, balance_claim,
                                                eval_sample, held_out_load, quality_verdicts)
from codex_lab.nn.accounting import ffn_counts
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.nn.moe import moe_layers_of
from codex_lab.training.lm_plateau import lm_sessions, lm_to_plateau
from codex_lab.training.plateau import plateau_line
from codex_lab.training_state import TrainingState, held_floor


@dataclass(frozen=True)
class StopPlan:
    """How far each arm may train: held-out loss every ``eval_every`` steps, judged every
    ``chunk`` steps from ``min_steps``, capped at ``max_steps``; ``extend``: the budget-extension
    share (0: none); ``confirm``: the extension decides (an arm it finds still learning trains on,
    judged again, to a stopping point it confirms or the cap)."""

    eval_every: int
    chunk: int
    min_steps: int
    max_steps: int
    extend: float = 0.5
    confirm: bool = False

    def __post_init__(self) -> None:
        if self.eval_every < 1 or self.chunk % self.eval_every or self.max_steps < self.chunk:
            raise ValueError(f"eval_every {self.eval_every}, chunk {self.chunk}, max_steps {self.max_steps}: the chunk "
                             "must be a multiple of eval_every and at most max_steps")


def plateau_geometry(plan: Plan, stop: StopPlan) -> str:
    """One line: the geometry and how every arm trained."""
    return (f"{plan.n_layer} layer(s) of width {plan.d_model}, {plan.seq_len}-token sequences x {plan.batch_size}, a "
            f"{plan.vocab}-token BPE vocabulary (trained on {plan.files} corpus files); MoE = {plan.n_experts} experts "
            f"of hidden {plan.expert_hidden}, top-{plan.top_k}; every arm from scratch at lr {held_floor(plan.lr):g} "
            f"({plan.warmup} warm-up steps, then held) to its plateau: held-out loss every {stop.eval_every} steps on "
            f"{plan.eval_batches * plan.eval_batch_size} windows per seed, judged every {stop.chunk} steps from "
            f"{stop.min_steps}, cap {stop.max_steps}, then {stop.extend:.0%} more (the budget-extension check"
            f"{'; an arm it finds still learning trains on' if stop.confirm else ''}); "
            f"{len(plan.seeds)} seeds")


@dataclass
class ArmPlateau:
    """One arm at its plateau, every seed: ``curves`` to the stopping point, ``state`` there (the
    extension check overrules a "trained" it contradicts), ``final`` each seed's held-out loss
    there (nats/token), the extension check, ``active_params`` (parameters a token uses)."""

    arm: str
    curves: list[list[tuple[float, float]]]
    state: TrainingState
    steps: int
    reached: bool
    final: list[float]
    active_params: int
    extension_steps: int = 0
    extension_change: float = math.nan
    seconds: float = 0.0
    load: list[float] = field(default_factory=list)  # MoE arms: each seed's busiest-expert load at the stopping point
    false_stops: list[int] = field(default_factory=list)  # stopping points the extension overruled (``confirm``)

    def describe(self) -> str:
        """The arm's state, its steps and the extension check, one line."""
        return plateau_line(self.arm, self.state, self.steps, reached=self.reached, extension_steps=self.extension_steps,
                            extension_change=self.extension_change, min_change=MIN_CHANGE,
                            false_stops=getattr(self, "false_stops", ()))


def arm_unit(arm: str, *, configs: Mapping[str, ModelConfig], plan: Plan, stop: StopPlan, train: Tensor, val: Tensor,
             checkpoints: str | Path | None = None, seed_processes: bool = False) -> ArmPlateau:
    """One arm, every seed of ``plan``, trained from scratch to its plateau (resumable from
    ``checkpoints``). Seed ``s`` draws the initialisation (``torch.manual_seed(s)``), the data
    order (``Generator(s)``) and the evaluation sample (:func:`eval_sample`), the same in every arm.
    ``seed_processes``: each seed trains in a process of its own, side by side (same numbers)."""
    t0 = time.perf_counter()
    models = []
    for seed in plan.seeds:
        torch.manual_seed(seed)
        m = CodexModel(configs[arm])
        for layer in moe_layers_of(m):
            layer.bias_update_rate = plan.bias_update_rate
        models.append(m)
    evals = [eval_sample(val, seed, batch_size=plan.eval_batch_size, seq_len=plan.seq_len, n_batches=plan.eval_batches)
             for seed in plan.seeds]
    sessions = lm_sessions(models, plan.seeds, train, evals, lr=held_floor(plan.lr), warmup=plan.warmup,
                           batch_size=plan.batch_size, seq_len=plan.seq_len, eval_every=stop.eval_every, salt=0,
                           checkpoints=checkpoints, unit=f"arm-{arm}", processes=seed_processes)
    run, final, weights = lm_to_plateau(arm, sessions, chunk=stop.chunk, min_steps=stop.min_steps,
                                        max_steps=stop.max_steps, min_change=MIN_CHANGE, extend=stop.extend,
                                        confirm=stop.confirm)
    state = run.judged  # the rule's call, overruled where the extension found the arm still learning
    active, total = ffn_counts(configs[arm])
    load: list[float] = []
    if moe_layers_of(models[0]):  # the router's load where the verdict is read: the weights at the stopping point
        for m, w, ev in zip(models, weights, evals):
            m.load_state_dict(w)
            load.append(held_out_load(m, ev))
    return ArmPlateau(arm, run.curves, state, run.steps, run.reached, final, models[0].num_params() - (total - active),
                      run.extension_steps, run.extension_change, time.perf_counter() - t0, load, list(run.false_stops))


def plateau_balance(arms: Mapping[str, ArmPlateau]) -> tuple[str, str]:
    """(verdict, measured text) of the load claim on arms at their plateau: the unbalanced
    router (``moe_none``), the bias-balanced one (``moe_bias``) and the aux-loss MoE (``moe``),
    each trained to its own plateau by the same rule, the load read at each arm's stopping point
    (:func:`~codex_lab.lessons.l04_moe.protocol.balance_claim`; no verdict unless all three are trained)."""
    need = ("moe_none", "moe_bias", "moe")
    missing = [a for a in need if a not in arms or not arms[a].load]
    if missing:
        raise ValueError(f"the load claim needs the MoE arms {need} with their loads; missing {missing}")
    return balance_claim({a: arms[a].load for a in need}, states={a: arms[a].state for a in need})


def plateau_verdicts(arms: Mapping[str, ArmPlateau], plan: Plan) -> QualityVerdicts:
    """The protocol's quality verdicts on the arms at their plateau (each arm's loss at its own
    stopping point, paired by seed)."""
    missing = [a for a in QUALITY_ARMS if a not in arms]
    if missing:
        raise ValueError(f"the quality verdicts need the arms {QUALITY_ARMS}; missing {missing}")
    return quality_verdicts({a: arms[a].final for a in QUALITY_ARMS}, {a: arms[a].state for a in QUALITY_ARMS})


def arm_rows(arms: Mapping[str, ArmPlateau], seeds: Sequence[int]) -> list[str]:
    """Markdown rows: per arm, the parameters a token uses, its steps and its held-out loss."""
    rows = ["| arm | parameters a token uses | steps per seed | held-out loss where it stopped (mean of seeds) |",
            "|---|---|---|---|"]
    for a in QUALITY_ARMS:
        r = arms[a]
        rows.append(f"| {a} | {r.active_params:,} | {r.steps}{'' if r.reached else ' (cap)'} | "
                    f"{sum(r.final) / len(r.final):.3f} |")
    return rows + ["", f"(mean of {len(seeds)} seeds, nats/token on each seed's held-out windows)"]


__all__ = ["ArmPlateau", "StopPlan", "arm_rows", "arm_unit", "plateau_balance", "plateau_geometry", "plateau_verdicts"]
