"""Lesson 05's test of the article's claim, as stated: balanced multi-task fine-tuning against
single-task fine-tuning, scored by execution on codebench (pass@1 per family, >= 3 seeds).

Arms, every one starting from the shipped model, with the same total token budget
(``steps`` optimiser steps of ``batch_size`` examples):

- ``single-task``: one specialist per family, each fine-tuned on its own family for
  ``steps / n_families`` steps (the four together cost one multi-task run); family f's
  score is specialist f's;
- ``naive``: one model on the pooled data, pooled valid-token loss (``token``, ``mix=size``);
- ``coba``: convergence balancing, its weights also choosing each batch's tasks
  (``coba``, ``mix=balancer``);
- the best of the course's other balancers (``sample``, ``task_token``, ``focal``, ``dwa``,
  ``uncertainty``, each with a task-uniform mix), chosen on a separate selection seed by
  the mean validation loss (never by the benchmark: no test information in the choice).

Verdicts: :func:`codex_lab.stats.compare` per family and over all families, Welch 95%
interval over seeds, the course's rule (holds / fails / not resolved).
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from codex_lab.evals import codebench as cb
from codex_lab.evals import codebench_run as cr
from codex_lab.stats import Comparison, compare
from codex_lab.training.finetune import FinetuneConfig, finetune

OTHER_BALANCERS: tuple[str, ...] = ("sample", "task_token", "focal", "dwa", "uncertainty")


@dataclass
class Setup:
    """Sizes of the experiment (see the module docstring).

    Args:
        steps: optimiser steps of one multi-task run (a specialist gets ``steps // K``).
        batch_size: examples per step.
        lr: AdamW learning rate (constant after ``warmup`` steps).
        seeds: seeds of every arm (batch order); at least 3 for a verdict.
        per_family: held-out problems scored per family.
        candidates: the other balancers the best is chosen from.
        select_seed: the seed of the selection runs (not one of ``seeds``).
        val_per_task: validation examples per family (CoBa's convergence signal).
    """

    steps: int = 40
    batch_size: int = 8
    lr: float = 2e-3
    warmup: int = 3
    seeds: tuple[int, ...] = (0, 1, 2)
    per_family: int = 32
    candidates: tuple[str, ...] = OTHER_BALANCERS
    select_seed: int = 100
    val_per_task: int = 8
    max_len: int = 96
    families: tuple[str, ...] = cb.FAMILIES

    def config(self, seed: int, **change: Any) -> FinetuneConfig:
        """The fine-tuning configuration of one run."""
        base = dict(tasks=self.families, steps=self.steps, batch_size=self.batch_size, lr=self.lr, warmup=self.warmup,
                    max_len=self.max_len, eval_every=max(1, self.steps // 4), val_per_task=self.val_per_task, seed=seed)
        return FinetuneConfig(**{**base, **change})


@dataclass
class Results:
    """pass@1 per arm, seed and family: ``scores[arm][i][family]`` (seed ``setup.seeds[i]``)."""

    setup: Setup
    scores: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    other: str = ""
    selection: dict[str, float] = field(default_factory=dict)  # candidate -> mean final val loss
    runs: dict[str, list[Any]] = field(default_factory=dict)  # arm -> FinetuneResult per seed
    model: Any = None  # the CoBa model of the first seed (for further measurements)

    def values(self, arm: str, family: str) -> list[float]:
        """pass@1 of ``arm`` on ``family`` (or ``"all"``: the mean over families), one per seed."""
        if family == "all":
            return [statistics.fmean(s[f] for f in self.setup.families) for s in self.scores[arm]]
        return [s[family] for s in self.scores[arm]]

    def table(self) -> str:
        """pass@1 per arm and family: mean over seeds and the 95% half-width of that mean."""
        from codex_lab.stats import t_quantile

        cols = [*self.setup.families, "all"]
        lines = [f"{'arm':<22}" + "".join(f"{c:>18}" for c in cols)]
        for arm in self.scores:
            cells = []
            for c in cols:
                xs = self.values(arm, c)
                m = statistics.fmean(xs)
                # half-width of the mean: t_{0.975, n-1} * sd / sqrt(n)
                h = t_quantile(0.975, len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")
                cells.append(f"{m:.3f} ± {h:.3f}")
            lines.append(f"{arm:<22}" + "".join(f"{c:>18}" for c in cells))
        return "\n".join(lines)

    def verdicts(self, arm: str, baseline: str = "single-task") -> list[Comparison]:
        """``arm`` against ``baseline`` per family and over all (claim: ``arm`` scores higher)."""
        return [compare(self.values(baseline, f), self.values(arm, f), metric=f"pass@1 {f}: {arm} - {baseline}")
                for f in [*self.setup.families, "all"]]


def _fresh(base: Any) -> Any:
    return copy.deepcopy(base)


def score_model(model: Any, tok: Any, problems: Sequence[cb.Problem]) -> dict[str, float]:
    """Greedy pass@1 per family of ``model`` on ``problems`` (batched sandbox path)."""
    sc, _ = cr.evaluate(model, tok, problems)
    return {f: v for f, v in sc.items() if f in cb.FAMILIES}


def select_other(base: Any, tok: Any, taskset: Any, setup: Setup) -> tuple[str, dict[str, float]]:
    """The candidate balancer with the lowest mean final validation loss on ``setup.select_seed``.

    With a single candidate nothing is chosen and no run is made (``{}`` losses).
    """
    if len(setup.candidates) == 1:
        return setup.candidates[0], {}
    losses = {}
    for name in setup.candidates:
        r = finetune(_fresh(base), tok, taskset, setup.config(setup.select_seed, balance=name, mix="uniform"), progress=False)
        losses[name] = float(r.final.mean())
    return min(losses, key=losses.__getitem__), losses


def run_experiment(base: Any, tok: Any, setup: Setup, *, problems: Sequence[cb.Problem] | None = None,
                   log: Callable[[str], None] | None = None) -> Results:
    """Every arm on every seed (see the module docstring); ``base`` is copied for each run."""
    taskset = cb.training_tasks(setup.families)
    problems = list(problems or cb.load_problems(setup.per_family, families=setup.families))
    res = Results(setup)
    res.other, res.selection = select_other(base, tok, taskset, setup)
    arms = {"naive": dict(balance="token", mix="size"), "coba": dict(balance="coba", mix="balancer"),
            res.other: dict(balance=res.other, mix="uniform")}
    res.scores = {"single-task": [], **{a: [] for a in arms}}
    k = len(setup.families)
    for seed in setup.seeds:
        single: dict[str, float] = {}
        for fam in setup.families:
            m = _fresh(base)
            finetune(m, tok, taskset, setup.config(seed, tasks=(fam,), steps=max(1, setup.steps // k)), progress=False)
            single[fam] = score_model(m, tok, [p for p in problems if p.family == fam])[fam]
        res.scores["single-task"].append(single)
        for arm, change in arms.items():
            m = _fresh(base)
            r = finetune(m, tok, taskset, setup.config(seed, **change), progress=False)
            res.runs.setdefault(arm, []).append(r)
            res.scores[arm].append(score_model(m, tok, problems))
            if arm == "coba" and res.model is None:
                res.model = m
        if log:
            log(f"seed {seed}: " + "; ".join(f"{a} " + " ".join(f"{f}={v[-1][f]:.2f}" for f in setup.families)
                                             for a, v in res.scores.items()))
    return res


def tune_for_codebench(model: Any, tok: Any, *, steps: int = 40, seed: int = 0, balance: str = "coba",
                       lr: float = 2e-3) -> Any:
    """A fine-tuned copy of ``model`` on codebench's training split (lesson 05's balanced arm).

    Used where a model must score above zero on codebench (the functional gate's tests,
    lesson 07/08 baselines): the shipped model before fine-tuning does not know the task
    format and scores ~0.
    """
    m = _fresh(model)
    setup = Setup(steps=steps, lr=lr)
    mix = "balancer" if balance == "coba" else "uniform"
    finetune(m, tok, cb.training_tasks(), setup.config(seed, balance=balance, mix=mix), progress=False)
    return m.eval()
