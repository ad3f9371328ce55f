"""Lesson 05's test of the article's claim on codebench 2: single-task specialists against
naive and balanced (CoBa) multi-task fine-tuning at equal compute, every arm trained to a
plateau, pass@1 per family by execution, per split (``iid``, ``length``, ``compose``).

Geometry (shrunk so that every arm reaches a plateau on a CPU; the steps are not cut):
a small Llama-style model (``d_model`` x ``n_layer``, a byte-level BPE vocabulary of
``vocab`` tokens trained on the split's training texts, so the output layer stays cheap)
trained **from scratch** on the split's five task families (codebench 2's ``train`` part,
docstrings without ``>>>`` examples, prompts + answers of <= ``max_len`` tokens).

Arms, each with the same compute (``steps`` optimiser steps of ``batch_size`` examples):

- ``single-task``: one specialist per family, each trained on its own family for
  ``steps // K`` steps (the K specialists together cost one multi-task run); family f's
  score is specialist f's;
- ``naive``: one model on the pooled data, pooled valid-token loss (``token``, ``mix=size``);
- ``coba``: convergence balancing, its weights also choosing each batch's tasks
  (``coba``, ``mix=balancer``);
- ``extra`` balanced arms (e.g. ``task_token`` with a task-uniform mix), when given.

The primary arm is the balanced arm (``coba`` or an extra) with the lowest mean final
validation loss, chosen on validation only (never on the test problems).

Seeds vary the initialisation (``torch.manual_seed(seed)`` before the model is built), the
data order (the fine-tuning seed) and the evaluation sample (``per_family`` test problems
per family drawn with the seed). Every run records its held-out curve (mean over families
of the validation loss, nats/token, at ``evals`` evaluations); the curves of an arm give its
training state (:func:`codex_lab.training_state.training_state`) and every comparison goes
through :func:`codex_lab.stats.judge_trained`.
"""

from __future__ import annotations

import copy
import functools
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from codex_lab.evals import codebench2 as cb2
from codex_lab.evals import codebench_run as cr
from codex_lab.parallel import cpu_seconds, run_units
from codex_lab.stats import Comparison, compare, holm, judge_trained
from codex_lab.training.finetune import FinetuneConfig, finetune
from codex_lab.training_state import TrainingState, training_state

OTHER_BALANCERS: tuple[str, ...] = ("sample", "task_token", "focal", "dwa", "uncertainty")
BALANCED: dict[str, dict[str, str]] = {"coba": dict(balance="coba", mix="balancer"),
                                       "task_token": dict(balance="task_token", mix="uniform"),
                                       "sample": dict(balance="sample", mix="uniform"),
                                       "focal": dict(balance="focal", mix="uniform"),
                                       "dwa": dict(balance="dwa", mix="uniform"),
                                       "uncertainty": dict(balance="uncertainty", mix="uniform")}

# The smallest change of the held-out loss the claim cares about (training-state rule), in
# nats/token of the mean over families: 0.03. Why: across the lesson's tuning runs (width
# 32-64, 600-3000 steps; a one-off sizing probe, since deleted: git log -- scripts/l05_size_probe.py) pass@1 over all families moved
# by about 1.0 per nat/token of this mean loss (0.42 -> 0.19, 0.35 -> 0.21, 0.30 -> 0.30), so
# 0.03 nats/token is worth about 0.03 pass@1: one standard error of one seed's pass@1 over its
# 5 x 48 test problems (sqrt(0.25 / 240) = 0.032). A drift smaller than that over another
# quarter of the run cannot change what one seed's evaluation resolves.
MIN_CHANGE = 0.03


@dataclass
class Setup:
    """Sizes of the experiment (see the module docstring).

    Args:
        split: codebench 2 split (``iid``, ``length``, ``compose``): train and test on it.
        families: the task families (codebench 2's five by default).
        steps: optimiser steps of one multi-task run (a specialist gets ``steps // K``).
        batch_size: examples per step.
        lr: AdamW learning rate (constant after ``warmup`` steps).
        warmup: warm-up steps.
        d_model, n_layer, n_head: the model's width, depth and heads.
        vocab: BPE vocabulary size (trained on the split's training texts).
        max_len: longest example kept, tokens (prompt + answer).
        n_per_family: training programs per family (None: all 1,200 of the split).
        evals: evaluations per run (held-out curve points after step 0).
        seeds: seeds of every arm (init, data order, evaluation sample); >= 3 for a verdict.
        per_family: test problems per family and seed (drawn with the seed).
        val_per_task: validation examples per family (the held-out curve; CoBa's signal).
        extra: balanced arms besides CoBa (keys of :data:`BALANCED`).
        min_change: the training-state rule's smallest change that matters, nats/token.
        max_new_tokens: answer length limit at test time, tokens.
    """

    split: str = "iid"
    families: tuple[str, ...] = cb2.FAMILIES
    steps: int = 1000
    batch_size: int = 8
    lr: float = 5e-3
    warmup: int = 20
    d_model: int = 48
    n_layer: int = 2
    n_head: int = 4
    vocab: int = 768
    max_len: int = 256
    n_per_family: int | None = None
    evals: int = 10
    seeds: tuple[int, ...] = (0, 1, 2)
    per_family: int = 48
    val_per_task: int = 48
    extra: tuple[str, ...] = ()
    min_change: float = MIN_CHANGE
    max_new_tokens: int = 128

    def config(self, seed: int, **change: Any) -> FinetuneConfig:
        """The fine-tuning configuration of one run (``change`` overrides any field)."""
        steps = change.get("steps", self.steps)
        base = dict(tasks=self.families, steps=self.steps, batch_size=self.batch_size, lr=self.lr,
                    warmup=min(self.warmup, max(1, steps // 5)), max_len=self.max_len,
                    eval_every=max(1, steps // self.evals), val_per_task=self.val_per_task, seed=seed)
        return FinetuneConfig(**{**base, **change})

    def describe(self) -> str:
        """The geometry in one sentence."""
        k = len(self.families)
        return (f"a {self.n_layer}-layer model of width {self.d_model} ({self.n_head} heads) with a {self.vocab}-token BPE "
                f"vocabulary trained on the {self.split} split's training texts, from scratch; {self.steps} steps of "
                f"{self.batch_size} examples (<= {self.max_len} tokens) per multi-task arm, {self.steps // k} per "
                f"specialist; lr {self.lr:g}; {len(self.seeds)} seeds; {self.per_family} test problems per family and seed")


@functools.lru_cache(maxsize=8)
def _data(split: str, families: tuple[str, ...], vocab: int, n_per_family: int | None) -> tuple[Any, Any]:
    from codex_lab.data.tokenizer import train_tokenizer

    ts = cb2.training_tasks(split, families, n_per_family=n_per_family, seed=0, examples=False)
    texts = [e.prompt + e.answer for d in ts.examples.values() for e in d["train"]]
    return train_tokenizer(texts, vocab_size=vocab), ts


def data(setup: Setup) -> tuple[Any, Any]:
    """(tokenizer, TaskSet) of ``setup.split``: codebench 2's train + val parts (never test),
    docstrings without examples, and a BPE vocabulary trained on the training texts (cached)."""
    return _data(setup.split, tuple(setup.families), setup.vocab, setup.n_per_family)


def new_model(setup: Setup, vocab_size: int, seed: int) -> Any:
    """A freshly initialised model of ``setup``'s geometry; ``seed`` sets the initialisation."""
    from codex_lab.nn.config import ModelConfig
    from codex_lab.nn.model import CodexModel

    torch.manual_seed(seed)
    return CodexModel(ModelConfig(vocab_size=vocab_size, d_model=setup.d_model, n_layer=setup.n_layer,
                                  n_head=setup.n_head, max_seq_len=setup.max_len + setup.max_new_tokens))


def test_problems(setup: Setup, seed: int) -> list[Any]:
    """The evaluation sample of one seed: ``per_family`` test problems per family, drawn with ``seed``."""
    return cb2.load_problems(setup.split, setup.families, n=setup.per_family, seed=seed, examples=False)


def score_model(model: Any, tok: Any, problems: Sequence[Any], max_new_tokens: int = 128) -> dict[str, list[float]]:
    """Greedy pass/fail (1.0 / 0.0) of every problem, by family: ``{family: [pass of problem i]}``."""
    comps = cr.complete(model.eval(), tok, problems, max_new_tokens=max_new_tokens)
    res = cb2.execute(problems, comps)
    out: dict[str, list[float]] = {}
    for p, rs in zip(problems, res):
        out.setdefault(p.family, []).append(float(rs[0].passed))
    return out


def mean_curve(evals: Sequence[dict[str, float]], families: Sequence[str]) -> list[tuple[float, float]]:
    """(step, mean over ``families`` of the validation loss) per evaluation of one run."""
    return [(e["step"], statistics.fmean(e[f"val_{f}"] for f in families)) for e in evals]


@dataclass
class Results:
    """Everything one split's experiment measured.

    ``scores[arm][i][family]``: pass (1.0/0.0) per test problem, seed ``setup.seeds[i]``;
    ``curves[arm][i]``: that run's held-out curve (step, mean validation loss), the
    single-task arm's being the mean over its specialists of each one's own-family loss
    at the same evaluation; ``final_val[arm][i]``: the mean validation loss at the end.
    """

    setup: Setup
    scores: dict[str, list[dict[str, list[float]]]] = field(default_factory=dict)
    curves: dict[str, list[list[tuple[float, float]]]] = field(default_factory=dict)
    final_val: dict[str, list[float]] = field(default_factory=dict)
    runs: dict[str, list[Any]] = field(default_factory=dict)  # multi-task arm -> FinetuneResult per seed
    problems: list[list[Any]] = field(default_factory=list)  # the test problems of each seed
    primary: str = "coba"
    cpu_s: float = 0.0
    model: Any = None  # the primary arm's model of the first seed
    tokenizer: Any = None

    @property
    def arms(self) -> list[str]:
        return list(self.scores)

    def values(self, arm: str, family: str) -> list[float]:
        """pass@1 of ``arm`` on ``family`` (``"all"``: over every family's problems), one per seed."""
        fams = self.setup.families if family == "all" else (family,)
        return [statistics.fmean(x for f in fams for x in s[f]) for s in self.scores[arm]]

    def per_problem(self, arm: str, family: str) -> list[list[float]]:
        """``[seed][problem]`` pass of ``arm`` on ``family`` (or ``"all"``)."""
        fams = self.setup.families if family == "all" else (family,)
        return [[x for f in fams for x in s[f]] for s in self.scores[arm]]

    def interval(self, arm: str, family: str) -> tuple[float, float, float]:
        """(mean, lo, hi): pass@1 with the two-level bootstrap over seeds and problems."""
        return cb2.seed_problem_interval(self.per_problem(arm, family))

    def states(self) -> dict[str, TrainingState]:
        """Each arm's training state from its held-out curves (loss: lower is better)."""
        return {arm: training_state(cs, higher_is_better=False, min_change=self.setup.min_change, arm=arm)
                for arm, cs in self.curves.items()}

    def table(self) -> str:
        """pass@1 per arm and family: mean over seeds [95% bootstrap over seeds and problems]."""
        cols = [*self.setup.families, "all"]
        lines = [f"{'arm':<12}" + "".join(f"{c:>22}" for c in cols)]
        for arm in self.scores:
            cells = []
            for c in cols:
                m, lo, hi = self.interval(arm, c)
                cells.append(f"{m:.3f} [{lo:.3f}, {hi:.3f}]")
            lines.append(f"{arm:<12}" + "".join(f"{c:>22}" for c in cells))
        return "\n".join(lines)

    def comparison(self, baseline: str, arm: str, family: str) -> Comparison:
        """``arm`` - ``baseline`` pass@1 on ``family`` (claim: ``arm`` scores higher): Welch over
        seeds, paired by seed (both arms of a seed answer the same drawn problems, so the
        seed-to-seed spread of the difference holds the evaluation sample's noise as well),
        judged with both arms' training states."""
        c = compare(self.values(baseline, family), self.values(arm, family), paired=True,
                    metric=f"{self.setup.split} pass@1 {family}: {arm} - {baseline}")
        st = self.states()
        # validation-loss states behind a pass@1 comparison: different units (judge_trained's same_metric)
        return judge_trained(c, [st[baseline], st[arm]], same_metric=False)

    def primary_comparison(self) -> Comparison:
        """The pre-declared primary comparison: the primary balanced arm vs the specialists, all families."""
        return self.comparison("single-task", self.primary, "all")

    def secondary(self) -> list[Comparison]:
        """naive vs single-task and the primary arm vs naive, per family, Holm-corrected together."""
        cs = [self.comparison("single-task", "naive", f) for f in self.setup.families]
        cs += [self.comparison("naive", self.primary, f) for f in self.setup.families]
        return holm(cs)

    def audit_line(self) -> str:
        """The near-duplicate audit of every test problem scored (all seeds) against the split's training data."""
        seen: dict[str, Any] = {}
        for ps in self.problems:
            for p in ps:
                seen.setdefault(p.task_id, p)
        return cb2.split_audit(self.setup.split, list(seen.values())).line()


def _run(model: Any, tok: Any, ts: Any, cfg: FinetuneConfig) -> Any:
    return finetune(model, tok, ts, cfg, progress=False)


def _arms(setup: Setup) -> dict[str, dict[str, str]]:
    """The pooled arms of ``setup`` and how each changes the fine-tuning config."""
    return {"naive": dict(balance="token", mix="size"), "coba": BALANCED["coba"], **{a: BALANCED[a] for a in setup.extra}}


def run_unit(setup: Setup, seed: int, arm: str, *, tok: Any, ts: Any) -> dict[str, Any]:
    """One run of :func:`run_experiment`: a pooled ``arm`` (``"naive"``, ``"coba"``, ...) or one
    specialist (``"single-task:FAMILY"``, ``steps // families`` steps) at ``seed``, trained and
    scored on the seed's test problems. Returns ``curve`` ((step, mean val loss) pairs) and
    ``scores`` ({family: [pass of problem i]}), plus ``run`` and ``model`` for a pooled arm."""
    fams = tuple(setup.families)
    problems = test_problems(setup, seed)
    m = new_model(setup, tok.vocab_size, seed)
    if arm.startswith("single-task:"):
        fam = arm.split(":", 1)[1]
        r = _run(m, tok, ts, setup.config(seed, tasks=(fam,), steps=max(1, setup.steps // len(fams))))
        return {"curve": mean_curve(r.evals, (fam,)),
                "scores": {fam: score_model(m, tok, [p for p in problems if p.family == fam],
                                            setup.max_new_tokens)[fam]}}
    r = _run(m, tok, ts, setup.config(seed, **_arms(setup)[arm]))
    return {"curve": mean_curve(r.evals, fams), "scores": score_model(m, tok, problems, setup.max_new_tokens),
            "run": r, "model": m}


def run_experiment(setup: Setup, *, log: Callable[[str], None] | None = None) -> Results:
    """Every arm on every seed of ``setup.split`` (see the module docstring), one run per worker
    process where cores allow (:func:`codex_lab.parallel.run_units`: the same numbers as a loop)."""
    t0 = cpu_seconds()
    tok, ts = data(setup)
    fams = tuple(setup.families)
    res = Results(setup, tokenizer=tok)
    arms = _arms(setup)
    balanced = [a for a in arms if a != "naive"]
    res.scores = {"single-task": [], **{a: [] for a in arms}}
    res.curves = {a: [] for a in res.scores}
    res.final_val = {a: [] for a in res.scores}
    units = [(setup, seed, name) for seed in setup.seeds for name in [f"single-task:{f}" for f in fams] + list(arms)]
    done = iter(run_units(run_unit, units, common=dict(tok=tok, ts=ts),
                          names=[f"{name}, seed {seed}" for _, seed, name in units]))
    models: dict[str, Any] = {}
    for seed in setup.seeds:
        res.problems.append(test_problems(setup, seed))
        specs = [next(done) for _ in fams]
        res.scores["single-task"].append({f: u["scores"][f] for f, u in zip(fams, specs)})
        # the specialists share their evaluation steps: the arm's curve is their mean at each one
        curves = [u["curve"] for u in specs]
        res.curves["single-task"].append([(curves[0][i][0], statistics.fmean(c[i][1] for c in curves))
                                          for i in range(len(curves[0]))])
        res.final_val["single-task"].append(res.curves["single-task"][-1][-1][1])
        for arm in arms:
            u = next(done)
            res.runs.setdefault(arm, []).append(u["run"])
            res.curves[arm].append(u["curve"])
            res.final_val[arm].append(u["curve"][-1][1])
            res.scores[arm].append(u["scores"])
            models.setdefault(arm, u["model"])
        if log:
            log(f"{setup.split} seed {seed}: " + "; ".join(
                f"{a} pass@1 {statistics.fmean(x for f in fams for x in v[-1][f]):.3f} val {res.final_val[a][-1]:.3f}"
                for a, v in res.scores.items()))
    # the primary balanced arm: the lowest mean final validation loss (validation only, never test)
    res.primary = min(balanced, key=lambda a: statistics.fmean(res.final_val[a]))
    res.model = models[res.primary]
    res.cpu_s = cpu_seconds() - t0  # this process and its worker processes
    return res


# ---------------------------------------------------------------------------------------------
# The shipped model on codebench (lesson 07's release baseline, the functional gate)


def tune_for_codebench(model: Any, tok: Any, *, steps: int = 40, seed: int = 0, balance: str = "coba",
                       lr: float = 2e-3) -> Any:
    """A fine-tuned copy of ``model`` on the first codebench's training split (lesson 05's balanced arm).

    Used where a model must score above zero on a codebench (the functional gate's tests,
    lesson 07/08 baselines): the shipped model before fine-tuning does not know the task
    format and scores ~0. It stays on the first codebench (codebench 2's ``legacy`` split):
    after 40 steps the shipped model scores in the 20-80% band there, while on codebench 2's
    ``iid`` split it needs hundreds of steps to leave 0-20% (lesson 05's report prints the
    measurement), and a gate on a near-zero score cannot tell a damaged model from a good one.
    """
    from codex_lab.evals import codebench as cb

    m = copy.deepcopy(model)
    mix = "balancer" if balance == "coba" else "uniform"
    cfg = FinetuneConfig(tasks=cb.FAMILIES, balance=balance, mix=mix, steps=steps, batch_size=8, lr=lr, warmup=3,
                         max_len=96, eval_every=max(1, steps // 4), val_per_task=8, seed=seed)
    finetune(m, tok, cb.training_tasks(), cfg, progress=False)
    return m.eval()


def tune_shipped_on_codebench2(model: Any, tok: Any, *, split: str = "iid", steps: int = 300, batch_size: int = 16,
                               lr: float = 1e-3, seed: int = 0, examples: bool = True) -> Any:
    """The shipped model fine-tuned on codebench 2's ``split`` (every family pooled, ``token``
    loss, ``mix=size``): the calibration run (``scripts/l05_calibrate_shipped.py``)."""
    m = copy.deepcopy(model)
    ts = cb2.training_tasks(split, "all", examples=examples)
    cfg = FinetuneConfig(tasks=cb2.FAMILIES, balance="token", mix="size", steps=steps, batch_size=batch_size, lr=lr,
                         warmup=10, max_len=320, eval_every=max(1, steps // 10), val_per_task=48, seed=seed)
    finetune(m, tok, ts, cfg, progress=False)
    return m.eval()


def protocol_setup(mode: str, split: str = "iid") -> Setup:
    """The experiment's sizes per runtime mode (:mod:`codex_lab.runtime`).

    ``fast`` (CI): a 1-layer width-32 model, 60 steps, 8 problems per family and seed: far
    too short to plateau (the training-state rule must say "under-trained").

    ``standard`` (the default on a CPU): :class:`Setup`'s defaults, a 2-layer width-48 model
    with a 768-token BPE vocabulary, batches of 8, 1,000 steps per arm (200 per specialist),
    sized to the report's CPU share (~0.038 CPU s per step on one thread: ~6 CPU minutes for
    three arms x three seeds). Measured with a one-off sizing probe (since deleted; ``git log -- scripts/l05_size_probe.py``): this geometry's
    pooled run keeps improving up to 3,000 steps (mean validation loss 0.42 -> 0.35 over its
    last quarter), and a specialist of 500-700 steps is still falling steeply, so at this
    budget the training-state rule is expected to withhold the verdict; the report prints
    the states it measured.

    ``converge``: the sizes that bring the pooled arms near a plateau on a CPU (2-layer
    width-64, a 1,024-token vocabulary, batches of 16, 2,500 steps: ~0.10 CPU s per step,
    ~40 CPU minutes for three arms x three seeds); ``full`` (GPU): wider and deeper, 6,000
    steps, 96 problems per family and seed, five seeds, ``task_token`` as a second balanced arm.
    """
    if mode == "fast":
        return Setup(split=split, steps=60, batch_size=8, d_model=32, n_layer=1, n_head=2, vocab=384, max_len=192,
                     n_per_family=96, evals=4, per_family=8, val_per_task=8, warmup=5, max_new_tokens=64)
    if mode == "converge":
        return Setup(split=split, steps=2500, batch_size=16, lr=3e-3, d_model=64, n_layer=2, vocab=1024)
    if mode == "full":
        return Setup(split=split, steps=6000, batch_size=32, lr=1e-3, d_model=128, n_layer=4, vocab=2048, max_len=256,
                     evals=15, seeds=(0, 1, 2, 3, 4), per_family=96, extra=("task_token",))
    return Setup(split=split)


def protocol_splits(mode: str) -> tuple[str, ...]:
    """The splits run per mode: ``iid`` in fast and standard mode, all three in full mode."""
    return ("iid", "length", "compose") if mode == "full" else ("iid",)
