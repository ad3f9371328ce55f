"""Lesson 03's claim with every arm at its own plateau: "GQA keeps MHA's quality", judged on
uptrained arms that each trained until the training-state rule called them trained.

The fixed-budget protocol (:mod:`codex_lab.lessons.l03_gqa.experiments`) gives every arm the same
steps; at a rate that can still move the model its arms were still learning (the tuning runs in
:mod:`~codex_lab.lessons.l03_gqa.sizes`). Here, as in the capstone's trade:

1. per seed, an MHA model is pre-trained from scratch for ``pretrain_steps`` (warm-up, then the
   rate held at ``lr``): the checkpoint a team converts. It is a fixed budget, not an arm: the
   g = 1 arm continues it to its own plateau;
2. it is mean-pooled to g = 2, 4, 8 (:func:`codex_lab.nn.surgery.mha_to_gqa`; g = 1 copies it);
3. every g, g = 1 included, trains on at ``uptrain_lr`` (warm-up, then constant) in lockstep over
   the seeds until the rule calls it trained or the cap (:func:`codex_lab.training.lm_plateau.lm_to_plateau`),
   then half as long again (the budget-extension check);
4. the cost of g is its held-out loss at its stopping point minus g = 1's, paired by seed, judged
   for non-inferiority with the lesson's margin (:data:`~codex_lab.lessons.l03_gqa.experiments.MARGIN_NATS`),
   "under-trained: no verdict" unless both arms plateaued; g = 4 is the primary comparison, g = 2
   and 8 are Holm-corrected secondaries. The from-scratch arms of the fixed protocol are not run
   here: each would be a pre-training of its own to a plateau.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from codex_lab.lessons.l03_gqa.experiments import MARGIN_NATS, MIN_CHANGE_NATS, heldout_sample
from codex_lab.lessons.l03_gqa.sizes import ProtocolSizes
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.nn.surgery import mha_to_gqa
from codex_lab.stats import Comparison, holm, judge_trained, noninferiority
from codex_lab.training.lm_plateau import fixed_steps, lm_sessions, lm_to_plateau
from codex_lab.training.plateau import plateau_line
from codex_lab.training_state import TrainingState, training_state

UPTRAIN_SALT = 1_000_003  # the uptraining's data order: seed + salt (the fixed protocol's)


@dataclass(frozen=True)
class PlateauPlan:
    """How far each arm may train: judged every ``chunk`` steps from ``min_steps`` (so every arm
    trains long enough to show a cost), capped at ``max_steps``; ``extend``: the budget-extension
    share (0: none); ``groups``: the group sizes (1, the MHA control, first)."""

    chunk: int
    min_steps: int
    max_steps: int
    extend: float = 0.5
    groups: tuple[int, ...] = (1, 2, 4, 8)

    def __post_init__(self) -> None:
        if self.groups[:1] != (1,) or 4 not in self.groups:
            raise ValueError(f"groups={self.groups}: give 1 (the MHA control) first and 4 (the primary comparison)")
        if self.chunk < 1 or self.max_steps < self.chunk or self.min_steps > self.max_steps:
            raise ValueError(f"chunk {self.chunk}, min_steps {self.min_steps}, max_steps {self.max_steps}: need "
                             "1 <= chunk <= max_steps and min_steps <= max_steps")


def plateau_geometry(s: ProtocolSizes, plan: PlateauPlan) -> str:
    """One line: the geometry and how every arm trained (the fixed protocol's ``describe`` names
    its cosine schedules, which this design does not use)."""
    files = "all" if s.max_files is None else f"the first {s.max_files}"
    return (f"{s.n_layer} layers, d_model {s.d_model}, {s.n_head} heads of width {s.d_model // s.n_head}, "
            f"{s.seq_len}-token sequences x {s.batch_size}, vocabulary {s.vocab_size} (BPE on {files} corpus files); "
            f"MHA pre-training {s.pretrain_steps} steps ({s.warmup} warm-up steps to lr {s.lr:g}, then held); every g "
            f"(g = 1 too) uptrained at lr {s.uptrain_lr:g} ({max(1, s.uptrain_steps // 10)} warm-up steps, then held) "
            f"to its plateau: held-out loss every {s.uptrain_eval_every} steps on {s.eval_windows} windows per seed, "
            f"judged every {plan.chunk} steps from {plan.min_steps}, cap {plan.max_steps}, then "
            f"{plan.extend:.0%} more (the budget-extension check); {len(s.seeds)} seeds")


def _config(s: ProtocolSizes, vocab_size: int, g: int = 1) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, d_model=s.d_model, n_layer=s.n_layer, n_head=s.n_head,
                       n_kv_head=s.n_head // g, max_seq_len=max(1024, s.seq_len))


def pretrain_unit(seed: int, *, sizes: ProtocolSizes, train: Tensor, val: Tensor, vocab_size: int, chunk: int,
                  checkpoints: str | Path | None = None) -> dict[str, Any]:
    """Step 1 for one seed: the MHA base pre-trained ``sizes.pretrain_steps`` steps (warm-up, then
    ``sizes.lr`` held), resumable from ``checkpoints``. Returns ``seed``, ``curve`` and ``weights``."""
    torch.manual_seed(seed)  # the seed draws the initialisation
    model = CodexModel(_config(sizes, vocab_size))
    sessions = lm_sessions([model], [seed], train, [heldout_sample(val, sizes.eval_windows, sizes.seq_len, seed)],
                           lr=sizes.lr, warmup=sizes.warmup, batch_size=sizes.batch_size, seq_len=sizes.seq_len,
                           eval_every=sizes.eval_every, salt=0, checkpoints=checkpoints, unit="mha-pretrain")
    curve = fixed_steps(sessions, sizes.pretrain_steps, chunk)[0]
    return {"seed": seed, "curve": curve, "weights": {k: v.clone() for k, v in model.state_dict().items()}}


@dataclass
class GroupArm:
    """One group size uptrained to its plateau, every seed: ``curves`` to the stopping point,
    ``state`` there (the extension check overrules a "trained" it contradicts), ``final`` each seed's
    held-out loss there (nats/token), ``converted`` right after pooling, the extension check."""

    g: int
    curves: list[list[tuple[float, float]]]
    state: TrainingState
    steps: int
    reached: bool
    final: list[float]
    converted: list[float]
    extension_steps: int = 0
    extension_change: float = math.nan
    seconds: float = 0.0

    @property
    def arm(self) -> str:
        return f"uptrained g={self.g}"

    def describe(self) -> str:
        """The arm's state, its steps and the extension check, one line."""
        return plateau_line(self.arm, self.state, self.steps, reached=self.reached, extension_steps=self.extension_steps,
                            extension_change=self.extension_change, min_change=MIN_CHANGE_NATS)


def uptrain_unit(g: int, *, bases: Sequence[Mapping[str, Any]], sizes: ProtocolSizes, plan: PlateauPlan, train: Tensor,
                 val: Tensor, vocab_size: int, checkpoints: str | Path | None = None) -> GroupArm:
    """Steps 2-3 for one group size: every seed's base (``bases``: :func:`pretrain_unit`'s results)
    pooled to ``g`` and uptrained to its plateau (every g of a seed draws the same batches)."""
    t0 = time.perf_counter()
    models, seeds, evals = [], [], []
    for b in bases:
        base = CodexModel(_config(sizes, vocab_size))
        base.load_state_dict(b["weights"])
        models.append(mha_to_gqa(base, sizes.n_head // g))  # a copy; g = 1 copies the base unchanged
        seeds.append(int(b["seed"]))
        evals.append(heldout_sample(val, sizes.eval_windows, sizes.seq_len, int(b["seed"])))
    sessions = lm_sessions(models, seeds, train, evals, lr=sizes.uptrain_lr, warmup=max(1, sizes.uptrain_steps // 10),
                           batch_size=sizes.batch_size, seq_len=sizes.seq_len, eval_every=sizes.uptrain_eval_every,
                           salt=UPTRAIN_SALT, checkpoints=checkpoints, unit=f"uptrain-g{g}")
    converted = [s.curve[0][1] for s in sessions]
    run, final, _ = lm_to_plateau(f"uptrained g={g}", sessions, chunk=plan.chunk, min_steps=plan.min_steps,
                                  max_steps=plan.max_steps, min_change=MIN_CHANGE_NATS, extend=plan.extend)
    state = run.judged  # the rule's call, overruled where the extension found the arm still learning
    return GroupArm(g, run.curves, state, run.steps, run.reached, final, converted, run.extension_steps,
                    run.extension_change, time.perf_counter() - t0)


@dataclass
class PlateauVerdicts:
    """``primary``: g = 4 against the g = 1 control; ``secondary``: the other g (Holm)."""

    primary: Comparison
    secondary: dict[str, Comparison]
    margin: float


def plateau_verdicts(arms: Mapping[int, GroupArm], *, margin: float = MARGIN_NATS, primary_g: int = 4) -> PlateauVerdicts:
    """Judge "GQA keeps MHA's quality" on arms at their plateau: per g, the non-inferiority of
    ``loss(g) - loss(g = 1)`` at each arm's stopping point, paired by seed, with ``margin``
    nats/token (:func:`codex_lab.stats.noninferiority`), then
    :func:`~codex_lab.stats.judge_trained` on both arms' states."""
    if 1 not in arms or primary_g not in arms:
        raise ValueError(f"the arms need g = 1 (the MHA control) and g = {primary_g}; got {sorted(arms)}")

    def cost(g: int) -> Comparison:
        # cost = loss(GQA g) - loss(MHA), each at its own plateau; non-inferior when the upper bound < margin
        c = noninferiority(arms[1].final, arms[g].final, margin=margin, paired=True, higher_is_better=False,
                           metric=f"held-out loss, g={g} minus MHA, each uptrained to its plateau (nats/token)")
        return judge_trained(c, [arms[1].state, arms[g].state])

    others = [g for g in sorted(arms) if g not in (1, primary_g)]
    return PlateauVerdicts(cost(primary_g), dict(zip([f"uptrained g={g}" for g in others], holm([cost(g) for g in others]))),
                           margin)


def pretraining_state(bases: Sequence[Mapping[str, Any]]) -> TrainingState:
    """The fixed-budget pre-training's state, reported (not required: the g = 1 arm continues it)."""
    return training_state([b["curve"] for b in bases], higher_is_better=False, min_change=MIN_CHANGE_NATS,
                          arm="MHA pre-training")


__all__ = ["GroupArm", "PlateauPlan", "PlateauVerdicts", "UPTRAIN_SALT", "plateau_geometry", "plateau_verdicts",
           "pretrain_unit", "pretraining_state", "uptrain_unit"]
