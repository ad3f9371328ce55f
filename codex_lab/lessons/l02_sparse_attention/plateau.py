"""Lesson 02's claims with every arm at its own plateau: each attention pattern trained on the
recall task until the training-state rule calls it trained, then half as long again.

The fixed-budget protocol (:mod:`codex_lab.lessons.l02_sparse_attention.experiments`) gives every
arm the same steps; at a rate that can still move the model its dense arm, the one the primary
comparison needs, was still learning (the tuning runs in
:mod:`~codex_lab.lessons.l02_sparse_attention.geometry`). Here every arm trains its seeds in
lockstep (:class:`RecallSession`: warm-up, then the peak rate held; the same initial weights,
batches and held-out sequences per seed in every arm, as in the fixed protocol) until the rule
calls it trained or the cap (:func:`codex_lab.training.plateau.train_to_plateau`, on the held-out
accuracy over all distances, with the task's chance level), then the budget-extension check.
The accuracies at each arm's stopping point go through the protocol's own verdicts
(:func:`~codex_lab.lessons.l02_sparse_attention.experiments.judge`), with the states from the runs
(the dense arm also held to the ceiling the other arms show).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from codex_lab.data.longrange import make_recall_batch
from codex_lab.lessons.l02_sparse_attention.experiments import (MIN_CHANGE, RecallRun, Verdicts, _on_device, arm_states,
                                                              build_model, chance_of, eval_batches, evaluate_recall,
                                                              judge, recall_loss, task_data)
from codex_lab.lessons.l02_sparse_attention.geometry import RecallConfig
from codex_lab.parallel import Remote, call_all
from codex_lab.training.curves import ChunkedSession
from codex_lab.training.loop import LoopConfig, adamw
from codex_lab.training.plateau import plateau_line, train_to_plateau
from codex_lab.training_state import NOT_LEARNED, TrainingState


@dataclass(frozen=True)
class StopPlan:
    """How far each arm may train: judged every ``chunk`` steps (a multiple of the config's
    ``eval_every``) from ``min_steps``, capped at ``max_steps``; ``extend``: the budget-extension
    share (0: none); ``confirm``: the extension decides (an arm it finds still learning trains on
    from the extension's end, judged again, until a stopping point the extension confirms or the
    cap: :func:`~codex_lab.training.plateau.train_to_plateau`), instead of only being reported."""

    chunk: int
    min_steps: int
    max_steps: int
    extend: float = 0.5
    confirm: bool = False

    def check(self, cfg: RecallConfig) -> None:
        """Refuse a plan whose chunks do not land on the config's evaluations."""
        if self.chunk < 1 or self.chunk % cfg.eval_every or self.max_steps < self.chunk:
            raise ValueError(f"chunk {self.chunk} must be a multiple of eval_every {cfg.eval_every} and at most "
                             f"max_steps {self.max_steps}")


class RecallSession(ChunkedSession):
    """One arm at one seed on the recall task, trained in chunks: ``advance(n) -> curve`` (step,
    held-out accuracy over all distances), at step 0 and every ``cfg.eval_every`` steps.

    The seed draws the initial weights, the batch stream (the generator
    :func:`~codex_lab.lessons.l02_sparse_attention.experiments.train_batches` uses, drawn as it goes,
    so a run has no end built in) and the held-out sequences; AdamW, a linear warm-up over
    ``cfg.warmup`` steps to ``cfg.lr``, then ``cfg.lr`` held; gradient norm clipped at 1.
    ``checkpoint``: kept after every ``advance``, replayed on a resume
    (:class:`codex_lab.training.curves.ChunkedSession`)."""

    def __init__(self, patterns: Sequence[str], cfg: RecallConfig, seed: int, *,
                 checkpoint: str | Path | None = None) -> None:
        self.cfg, self.seed = cfg, seed
        self.vocab, vocab_size, self.lines, _ = task_data(cfg.corpus_files, cfg.max_line)
        torch.manual_seed(seed)
        self.model = build_model(list(patterns), cfg, vocab_size)
        self.gen = torch.Generator().manual_seed(1000 + seed)
        self.held = eval_batches(cfg, seed)
        self.opt = adamw(self.model, LoopConfig(steps=1, lr=cfg.lr))
        self.far_curve: list[tuple[float, float]] = []
        self.accuracy: dict[str, float] = {}
        self._start(checkpoint)

    def _first_point(self) -> tuple[float, float]:
        return self._evaluate()

    def _evaluate(self) -> tuple[float, float]:
        """Score the held-out sequences now: keeps the accuracy per distance and the far curve's
        point, returns the curve's (step, accuracy over all distances)."""
        acc = evaluate_recall(self.model, self.vocab, self.held, self.cfg.task.distances)
        self.accuracy = acc
        far = [d for d in self.cfg.task.distances if d > self.cfg.reach]
        if far:
            self.far_curve.append((float(self.step), sum(acc[str(d)] for d in far) / len(far)))
        # overall = mean over distances (each distance has the same number of queries)
        return (float(self.step), sum(acc.values()) / len(acc))

    def _extra(self) -> dict[str, Any]:
        return {"far_curve": self.far_curve, "accuracy": self.accuracy}

    def _load_extra(self, state: dict[str, Any]) -> None:
        self.far_curve, self.accuracy = [tuple(p) for p in state["far_curve"]], dict(state["accuracy"])

    def _train(self, n: int) -> None:
        for _ in range(n):
            # lr(step) = lr x min(1, (step + 1) / warmup): linear warm-up, then constant
            for g in self.opt.param_groups:
                g["lr"] = self.cfg.lr * min(1.0, (self.step + 1) / max(1, self.cfg.warmup))
            b = make_recall_batch(self.lines, self.vocab, self.cfg.task, self.cfg.batch, self.gen)
            batch, cand = _on_device(b, self.vocab, self.model)
            loss = recall_loss(self.model, batch, cand)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"the recall loss became {float(loss)} at step {self.step}: lower lr")
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.step += 1
            if self.step % self.cfg.eval_every == 0:
                self.curve.append(self._evaluate())

    def freeze(self) -> RecallRun:
        """The seed's result at the step the driver has reached (the verdict's), kept in the
        checkpoint so that a replay past it reads the same."""
        rec = self._frozen_at()
        if rec is not None:
            return copy.deepcopy(rec["run"])
        run = RecallRun(dict(self.accuracy), list(self.curve), list(self.far_curve), 0.0)
        self._keep_frozen({"run": run})
        return copy.deepcopy(run)


@dataclass
class PatternArm:
    """One attention pattern at its plateau, every seed: ``runs`` each seed's result at the
    stopping point, ``state`` there (the extension check overrules a "trained" it contradicts)."""

    name: str
    runs: list[RecallRun]
    state: TrainingState
    steps: int
    reached: bool
    extension_steps: int = 0
    extension_change: float = math.nan
    seconds: float = 0.0
    false_stops: list[int] = field(default_factory=list)  # stopping points the extension overruled (``confirm``)

    @property
    def final(self) -> list[float]:
        """Each seed's held-out accuracy over all distances at the stopping point."""
        return [r.curve[-1][1] for r in self.runs]

    def describe(self) -> str:
        """The arm's state, its steps and the extension check, one line."""
        return plateau_line(self.name, self.state, self.steps, reached=self.reached, extension_steps=self.extension_steps,
                            extension_change=self.extension_change, min_change=MIN_CHANGE, higher_is_better=True,
                            metric="held-out accuracy", unit="", false_stops=getattr(self, "false_stops", ()))


def pattern_unit(name: str, patterns: Sequence[str], *, cfg: RecallConfig, stop: StopPlan,
                 checkpoints: str | Path | None = None, seed_processes: bool = False) -> PatternArm:
    """One arm (one pattern spec per layer), every seed of ``cfg``, to its plateau.

    ``seed_processes``: each seed's session lives in a process of its own
    (:class:`codex_lab.parallel.Remote`), so the seeds of each chunk train side by side (an arm
    that runs alone then uses every core; the numbers are the ones the sessions give in place)."""
    stop.check(cfg)
    if len(patterns) != cfg.n_layer:
        raise ValueError(f"{len(patterns)} patterns for {cfg.n_layer} layers; give one spec per layer")
    t0 = time.perf_counter()
    slug = "".join(c if c.isalnum() else "-" for c in name)
    paths = [None if checkpoints is None else Path(checkpoints) / f"recall-{slug}-seed{seed}.pt" for seed in cfg.seeds]
    if seed_processes:
        remotes = [Remote(RecallSession, list(patterns), cfg, seed, checkpoint=p) for seed, p in zip(cfg.seeds, paths)]
        advance: list[Any] = [r.method("advance") for r in remotes]
        freezers: list[Any] = [r.method("freeze") for r in remotes]
    else:
        remotes = []
        sessions = [RecallSession(patterns, cfg, seed, checkpoint=p) for seed, p in zip(cfg.seeds, paths)]
        advance, freezers = [s.advance for s in sessions], [s.freeze for s in sessions]
    at_stop: dict[str, list[RecallRun]] = {}

    def freeze() -> None:  # the verdict is read at the stopping point, before the extension trains on
        at_stop["runs"] = call_all(freezers)

    try:
        run = train_to_plateau(advance, arm=name, chunk=stop.chunk, max_steps=stop.max_steps,
                               min_steps=stop.min_steps, higher_is_better=True, min_change=MIN_CHANGE,
                               chance=chance_of(cfg), extend=stop.extend, before_extension=freeze,
                               confirm=stop.confirm)
    finally:
        for r in remotes:
            r.close()
    state = run.judged  # the rule's call, overruled where the extension found the arm still learning
    return PatternArm(name, at_stop["runs"], state, run.steps, run.reached, run.extension_steps,
                      run.extension_change, time.perf_counter() - t0, list(run.false_stops))


def plateau_judge(arms: Mapping[str, PatternArm], cfg: RecallConfig) -> Verdicts:
    """The protocol's verdicts on the arms at their plateau: each arm's state is the rule's on its
    curves to the stopping point (the dense arm also held to the ceiling the others show,
    :func:`~codex_lab.lessons.l02_sparse_attention.experiments.arm_states`, with no schedule rates:
    the rate is held); an arm its run left off its plateau (the cap, or an extension that found it
    still learning: :attr:`PatternArm.state`) keeps that state, unless the rule finds a seed that
    did not learn the task (at chance, or far below a sibling seed): more steps for the arm would
    not turn that seed's failed optimisation into the design's plateau, so that is its state."""
    results = {k: a.runs for k, a in arms.items()}
    rule = arm_states(results, cfg, schedule_rates=False)
    states = {k: (rule[k] if a.state.trained or rule[k].state == NOT_LEARNED else a.state) for k, a in arms.items()}
    return judge(results, cfg, states=states)


__all__ = ["PatternArm", "RecallSession", "StopPlan", "pattern_unit", "plateau_judge"]
