"""The capstone's measured trade: one set of designs, each trained to its plateau after
conversion, and on *those same trained models* what each optimisation costs and buys.

A converted model that has trained a few steps has not won back what conversion cost:
comparing it with the baseline measures the step budget, not the design. So:

1. per seed, a plain model is pre-trained from scratch for a fixed budget (the seed draws the
   initialisation, the data order and the held-out windows it is scored on): the checkpoint a
   team converts. It need not be at its plateau: the plain arm of step 3 *is* its pre-training
   continued, to its own plateau, so every comparison is between arms that each levelled off;
2. it is converted (:func:`codex_lab.nn.surgery.convert`, the capstone's recipe: K/V heads
   mean-pooled, experts upcycled from the dense FFN) into each design of :data:`KINDS`:
   sparse deep layers, GQA at group sizes 4 and 8, upcycled MoE, and all of them together;
3. every design *and the plain model itself* train on from there, each to its own plateau
   (the seeds in lockstep, :func:`codex_lab.training.plateau.train_to_plateau`; a constant
   rate after a warm-up, so the rule sees the model level off, not an annealed rate), then
   half as long again (the budget-extension check); each arm's steps are printed;
4. the quality cost of a design is its held-out loss at its stopping point minus the plain
   model's, paired by seed, judged for non-inferiority with the margin :data:`MARGIN_NATS`
   declared here (:func:`codex_lab.stats.noninferiority`), and "under-trained: no verdict"
   unless both arms plateaued (:func:`codex_lab.stats.judge_trained`);
5. on the first seed's trained models, what each design buys at a context where it is meant
   to pay (:mod:`~codex_lab.lessons.l08_capstone.trade_speed`): prefill of ``context`` tokens
   (sparse attention), decode of a batch over a cache of ``context`` tokens (GQA), KV-cache
   bytes measured on the cache the model fills, parameters stored and active.

On a CPU this trains only at a smaller geometry than the shipped model's (standard mode: 2
layers of width 64, 8 heads, 32-token training windows, an 8-token window and every 4th
8-token block in the sparse layer); the steps are not cut, the rule decides them. The table,
gates and decision are :mod:`~codex_lab.lessons.l08_capstone.trade_table`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.parallel import run_units
from codex_lab.stats import Comparison, judge_trained, noninferiority
from codex_lab.training.curves import heldout_windows, small_vocab_data
from codex_lab.training.lm_plateau import Session, first_values, fixed_steps, lm_sessions, lm_to_plateau
from codex_lab.training.plateau import overruled_by_extension, plateau_line
from codex_lab.training.preregistration import Preregistered, check_disjoint
from codex_lab.training_state import TrainingState

# The largest quality cost still called "kept", declared before any run (the same margin as
# lesson 03's GQA claim): 0.05 nats/token is a perplexity ratio exp(0.05) = 1.05, about 1.5% of
# the held-out losses these models reach (~3.3 nats/token). A design whose one-sided 95% upper
# bound of the cost is below it keeps the plain model's quality; the release gate uses the same
# margin (trade_table.gate_row).
MARGIN_NATS = 0.05
# The smallest change of a held-out loss the training-state rule cares about: a fifth of the
# margin, so a curve still moving by less over another quarter of its run cannot move a
# verdict across the margin.
MIN_CHANGE_NATS = 0.01
# The designs, in the order of the table: the plain model, each optimisation alone, all together.
KINDS = ("plain", "sparse", "gqa4", "gqa8", "moe", "all")
LABELS = {"plain": "plain (baseline)", "sparse": "sparse deep layers", "gqa4": "GQA g=4", "gqa8": "GQA g=8",
          "moe": "MoE (upcycled)", "all": "all (sparse + GQA g=4 + MoE)"}


@dataclass(frozen=True)
class TradeSizes(Preregistered):
    """The geometry, budget and speed context of the trade experiment in one mode.

    Model: ``n_layer`` layers of width ``d_model``, ``n_head`` query heads, vocabulary
    ``vocab_size`` (a byte-level BPE trained on the train split of the first ``max_files``
    corpus files); ``seq_len``-token training windows, ``batch_size`` per step. The designs:
    the last ``n_layer - dense_layers`` layers use the pattern ``sparse`` and (MoE)
    ``n_experts`` experts top-``top_k``; GQA at each group size of ``groups`` (query heads
    per K/V head; "all" uses the first). Pre-training: ``pretrain_steps`` steps, warm-up
    ``warmup`` to ``lr``, then constant; after conversion each arm at ``uptrain_lr`` to its
    plateau (judged every ``chunk`` steps from ``min_steps``, cap ``max_steps``). Held-out loss (nats/token) on ``eval_windows`` windows
    per seed, every ``eval_every`` steps. Speed: prefill ``context`` tokens (batch 1) and
    decode ``new_tokens`` steps of a ``decode_batch`` batch over a ``context``-token cache,
    ``rounds`` interleaved rounds. ``extend``: the budget-extension share (0: none).
    ``seeds`` judge the verdicts; ``tuning_seeds`` trained the runs that chose these sizes, never
    the verdict's (pre-registration: building sizes whose two sets overlap is refused).
    """

    d_model: int
    n_layer: int
    n_head: int
    seq_len: int
    batch_size: int
    lr: float
    uptrain_lr: float
    warmup: int
    eval_every: int
    chunk: int
    pretrain_steps: int
    min_steps: int
    max_steps: int
    eval_windows: int
    seeds: tuple[int, ...]
    vocab_size: int
    max_files: int | None
    sparse: str
    dense_layers: int
    n_experts: int
    top_k: int
    groups: tuple[int, ...] = (4, 8)
    context: int = 2048
    decode_batch: int = 8
    new_tokens: int = 16
    rounds: int = 5
    extend: float = 0.5
    confirm: bool = False  # the extension decides: an arm it finds still learning trains on (the reference run)
    # the seeds the runs that chose these sizes trained on (the standard live run and the first reference run,
    # which set the pre-training budget and the cap): never the verdict's (pre-registration)
    tuning_seeds: tuple[int, ...] = (0, 1, 2)

    def __post_init__(self) -> None:
        bad = [g for g in self.groups if g < 2 or self.n_head % g]
        if bad or len(self.groups) != 2:
            raise ValueError(f"groups={self.groups}: give two group sizes >= 2 that divide n_head={self.n_head}")
        check_disjoint(self.seeds, self.tuning_seeds)

    def describe(self) -> str:
        """One line for the lesson and the report."""
        files = "all" if self.max_files is None else f"the first {self.max_files}"
        return (f"{self.n_layer} layers of width {self.d_model}, {self.n_head} heads, {self.seq_len}-token windows x "
                f"{self.batch_size}, vocabulary {self.vocab_size} (BPE on {files} corpus files); designs: layers "
                f"{self.dense_layers}..{self.n_layer - 1} sparse `{self.sparse}`, GQA g={self.groups[0]} and "
                f"g={self.groups[1]} ({self.n_head // self.groups[0]} and {self.n_head // self.groups[1]} K/V heads), "
                f"MoE {self.n_experts} experts top-{self.top_k}; pre-training {self.pretrain_steps} steps, then every "
                f"arm to its plateau (judged every {self.chunk} steps, cap {self.max_steps}"
                f"{'; an arm the budget-extension check finds still learning trains on' if self.confirm else ''}); "
                f"{len(self.seeds)} seeds ({self.preregistration}); speed at {self.context} tokens of context")


TRADE_SIZES: dict[str, TradeSizes] = {
    # CI: seconds; caps far too short to plateau: the rule says "under-trained" and nothing is promoted on quality
    "fast": TradeSizes(d_model=32, n_layer=2, n_head=8, seq_len=32, batch_size=8, lr=3e-3, uptrain_lr=1e-3, warmup=3,
                       eval_every=4, chunk=8, pretrain_steps=16, min_steps=8, max_steps=8,
                       eval_windows=16, seeds=(10, 11, 12), vocab_size=384, max_files=40,
                       sparse="window:8+blockstride:8:4", dense_layers=1, n_experts=4, top_k=2, context=256,
                       decode_batch=4, new_tokens=4, rounds=3, extend=0.0),
    # the laptop's live run, sized to the report's budget (~4 min on 2 quiet cores), not to a plateau: measured
    # 2026-12-06 (under load), 1,500 pre-training steps then a 1,500-step cap left every arm still falling by
    # 0.03-0.04 nats/token per quarter at constant rates, so the rule withholds the verdicts here; the shipped
    # reference run (scripts/reference_article.py --section 08) is where the arms get the steps to level off
    "standard": TradeSizes(d_model=64, n_layer=2, n_head=8, seq_len=32, batch_size=16, lr=3e-3, uptrain_lr=1e-3,
                           warmup=25, eval_every=25, chunk=100, pretrain_steps=1000, min_steps=200,
                           max_steps=800, eval_windows=64, seeds=(10, 11, 12), vocab_size=512, max_files=300,
                           sparse="window:8+blockstride:8:4", dense_layers=1, n_experts=4, top_k=2),
    # the shipped model's geometry with the capstone's pattern, for a GPU (not run on a CPU)
    "full": TradeSizes(d_model=256, n_layer=4, n_head=8, seq_len=256, batch_size=16, lr=1e-3, uptrain_lr=3e-4,
                       warmup=200, eval_every=100, chunk=400, pretrain_steps=8000, min_steps=800,
                       max_steps=8000, eval_windows=64, seeds=(10, 11, 12, 13, 14), vocab_size=4096, max_files=None,
                       sparse="window:64+blockstride:64:4", dense_layers=2, n_experts=8, top_k=2, context=4096),
}


def trade_sizes(mode: str) -> TradeSizes:
    """The sizes for ``mode`` ("fast", "standard" or "full")."""
    if mode not in TRADE_SIZES:
        raise ValueError(f"unknown mode {mode!r}; one of {sorted(TRADE_SIZES)}")
    return TRADE_SIZES[mode]


def design_configs(base: ModelConfig, *, sparse: str, dense_layers: int, groups: tuple[int, int], n_experts: int,
                   top_k: int) -> dict[str, ModelConfig]:
    """One config per design of :data:`KINDS` over ``base`` (``"plain"`` is ``base`` itself):
    each optimisation alone (GQA at both group sizes), then all of them (GQA at ``groups[0]``)."""
    from codex_lab.lessons.l08_capstone.architecture import capstone_config

    n, h = base.n_layer, base.n_head
    deep = list(range(dense_layers, n))
    common = dict(sparse=sparse, n_experts=n_experts, top_k=top_k, attn_impl="blocks")
    full_kv = base.n_kv_head or h
    return {
        "plain": base,
        "sparse": capstone_config(base, dense_layers=dense_layers, n_kv_head=full_kv, moe_layers=[], **common),
        # K/V heads = query heads / group size
        "gqa4": capstone_config(base, dense_layers=n, n_kv_head=h // groups[0], moe_layers=[], **common),
        "gqa8": capstone_config(base, dense_layers=n, n_kv_head=h // groups[1], moe_layers=[], **common),
        "moe": capstone_config(base, dense_layers=n, n_kv_head=full_kv, moe_layers=deep, **common),
        "all": capstone_config(base, dense_layers=dense_layers, n_kv_head=h // groups[0], moe_layers=deep, **common),
    }


def trade_data(corpus: Any, sizes: TradeSizes) -> tuple[Tensor, Tensor, Any]:
    """(train ids, val ids, tokenizer) of the trade's small vocabulary
    (:func:`codex_lab.training.curves.small_vocab_data`)."""
    return small_vocab_data(corpus, sizes.vocab_size, sizes.max_files)


def base_config(sizes: TradeSizes, vocab_size: int) -> ModelConfig:
    """The plain model's config: RoPE tables long enough for the speed context, and for serving
    (1,024 tokens at least: the release gates' prompts and answers)."""
    s = sizes
    return ModelConfig(vocab_size=vocab_size, d_model=s.d_model, n_layer=s.n_layer, n_head=s.n_head,
                       max_seq_len=max(1024, s.seq_len, s.context + s.new_tokens + 1))


@dataclass
class ArmRun:
    """One arm (the pre-training, or a design after conversion), every seed, at its plateau.

    ``curves``: each seed's held-out curve to the stopping point; ``state`` and ``steps`` there;
    ``final``: each seed's held-out loss there (nats/token); ``converted``: each seed's loss right
    after conversion (designs only); ``extension_steps``/``extension_change``: the
    budget-extension check (0 / nan: not run); ``weights``: the first seed's trained state dict
    (the model speed is measured on); ``seconds``: wall time of the unit."""

    arm: str
    curves: list[list[tuple[float, float]]]
    state: TrainingState
    steps: int
    reached: bool
    final: list[float]
    converted: list[float] = field(default_factory=list)
    extension_steps: int = 0
    extension_change: float = float("nan")
    weights: dict[str, Tensor] = field(default_factory=dict)
    seconds: float = 0.0
    fixed: bool = False  # a fixed budget (the pre-training), not a run to a plateau
    false_stops: list[int] = field(default_factory=list)  # stopping points the extension overruled (``confirm``)

    @property
    def judged(self) -> TrainingState:
        """The state the verdicts use: the rule's at the stopping point, overruled when the
        budget-extension check found the arm still learning (an improvement of min_change or more)."""
        return overruled_by_extension(self.state, steps=self.steps, extension_steps=self.extension_steps,
                                      change=self.extension_change, min_change=MIN_CHANGE_NATS)

    def describe(self) -> str:
        """The arm's state, its steps and the extension check, one line."""
        return plateau_line(self.arm, self.judged, self.steps, reached=self.reached, extension_steps=self.extension_steps,
                            extension_change=self.extension_change, min_change=MIN_CHANGE_NATS,
                            note=" (a fixed budget: the plain arm continues it)" if self.fixed else "",
                            false_stops=getattr(self, "false_stops", ()))


def _sessions(models: Sequence[CodexModel], sizes: TradeSizes, train: Tensor, val: Tensor, *, lr: float,
              salt: int, seeds: Sequence[int] | None = None, checkpoints: str | Path | None = None,
              unit: str = "", processes: bool = False) -> list[Session]:
    # one session per seed: the seed draws the data order; every arm of a seed is scored on the same windows
    seeds = list(sizes.seeds if seeds is None else seeds)
    evals = [heldout_windows(val, sizes.eval_windows, sizes.seq_len, seed, salt=29) for seed in seeds]
    return lm_sessions(models, seeds, train, evals, lr=lr, warmup=sizes.warmup, batch_size=sizes.batch_size,
                       seq_len=sizes.seq_len, eval_every=sizes.eval_every, salt=salt, checkpoints=checkpoints,
                       unit=unit, processes=processes)


def pretrain_unit(sizes: TradeSizes, train: Tensor, val: Tensor, vocab_size: int, *,
                  seeds: Sequence[int] | None = None, checkpoints: str | Path | None = None) -> ArmRun:
    """Step 1: the plain model of every seed (or of ``seeds``: a share of the seeds, one unit
    each, put together by :func:`merge_pretraining`) pre-trained ``pretrain_steps`` steps, in
    chunks of ``chunk`` (resumable from ``checkpoints``); its state is reported, not required
    (the plain arm continues it to a plateau). ``weights`` holds every seed's state dict here,
    keyed ``"<seed>.<name>"`` (each design is converted from them)."""
    from codex_lab.training_state import training_state

    t0 = time.perf_counter()
    seeds = list(sizes.seeds if seeds is None else seeds)
    models = []
    for seed in seeds:
        torch.manual_seed(seed)  # the seed draws the initialisation
        models.append(CodexModel(base_config(sizes, vocab_size)))
    sessions = _sessions(models, sizes, train, val, lr=sizes.lr, salt=0, seeds=seeds, checkpoints=checkpoints,
                         unit="pretrain")
    curves = fixed_steps(sessions, sizes.pretrain_steps, sizes.chunk)  # in chunks, each one checkpointed
    state = training_state(curves, higher_is_better=False, min_change=MIN_CHANGE_NATS, arm="pre-training")
    return ArmRun("pre-training", curves, state, sizes.pretrain_steps, state.trained, [c[-1][1] for c in curves],
                  weights={f"{seed}.{k}": v for seed, s in zip(seeds, sessions) for k, v in s.model.state_dict().items()},
                  seconds=time.perf_counter() - t0, fixed=True)


def merge_pretraining(parts: Sequence[ArmRun]) -> ArmRun:
    """The pre-training of all seeds from units that each trained a share of them (in the seeds'
    order), its state judged again over every seed."""
    from codex_lab.training_state import training_state

    curves = [c for p in parts for c in p.curves]
    state = training_state(curves, higher_is_better=False, min_change=MIN_CHANGE_NATS, arm="pre-training")
    return ArmRun("pre-training", curves, state, parts[0].steps, state.trained, [f for p in parts for f in p.final],
                  weights={k: v for p in parts for k, v in p.weights.items()},
                  seconds=sum(p.seconds for p in parts), fixed=True)


def _seed_weights(flat: Mapping[str, Tensor], seed: int) -> dict[str, Tensor]:
    pre = f"{seed}."
    return {k[len(pre):]: v for k, v in flat.items() if k.startswith(pre)}


def design_unit(kind: str, pre: ArmRun, sizes: TradeSizes, train: Tensor, val: Tensor, vocab_size: int, *,
                checkpoints: str | Path | None = None, seed_processes: bool = False) -> ArmRun:
    """Steps 2-3 for one design: every seed's pre-trained model converted into ``kind`` and
    trained to its plateau (``"plain"``: trained on, unconverted). Every arm of a seed trains
    on the same batches (the arms are paired). ``weights``: the first seed's model.
    ``seed_processes``: each seed trains in a process of its own, side by side (same numbers)."""
    from codex_lab.nn.surgery import convert

    t0 = time.perf_counter()
    cfg_base = base_config(sizes, vocab_size)
    cfg = design_configs(cfg_base, sparse=sizes.sparse, dense_layers=sizes.dense_layers, groups=sizes.groups,
                         n_experts=sizes.n_experts, top_k=sizes.top_k)[kind]
    models = []
    for seed in sizes.seeds:
        base = CodexModel(cfg_base)
        base.load_state_dict(_seed_weights(pre.weights, seed))
        models.append(convert(base, cfg, seed=seed))  # a copy; "plain" converts to itself
    sessions = _sessions(models, sizes, train, val, lr=sizes.uptrain_lr, salt=1_000_003, checkpoints=checkpoints,
                         unit=f"design-{kind}", processes=seed_processes)
    converted = first_values(sessions)
    run, final, weights = lm_to_plateau(kind, sessions, chunk=sizes.chunk, min_steps=sizes.min_steps,
                                        max_steps=sizes.max_steps, min_change=MIN_CHANGE_NATS, extend=sizes.extend,
                                        confirm=sizes.confirm)
    return ArmRun(kind, run.curves, run.state, run.steps, run.reached, final, converted, run.extension_steps,
                  run.extension_change, weights[0], time.perf_counter() - t0, false_stops=list(run.false_stops))


@dataclass
class TradeResult:
    """The pre-training, every design at its plateau, the configs of the trained models and the
    tokenizer they read (to serve them)."""

    sizes: TradeSizes
    vocab_size: int
    pre: ArmRun
    arms: dict[str, ArmRun]
    tokenizer: Any = None

    @property
    def seconds(self) -> float:
        """Wall seconds of every unit (units that ran side by side each count)."""
        return self.pre.seconds + sum(a.seconds for a in self.arms.values())

    def configs(self) -> dict[str, ModelConfig]:
        s = self.sizes
        return design_configs(base_config(s, self.vocab_size), sparse=s.sparse, dense_layers=s.dense_layers,
                              groups=s.groups, n_experts=s.n_experts, top_k=s.top_k)

    def model(self, kind: str) -> CodexModel:
        """The first seed's trained ``kind`` model (eval mode): the model speed is measured on."""
        m = CodexModel(self.configs()[kind])
        m.load_state_dict(self.arms[kind].weights)
        return m.eval()


def run_trade(corpus: Any, sizes: TradeSizes) -> TradeResult:
    """Steps 1-3 at ``sizes``: the pre-training (one unit, seeds in lockstep), then one unit per
    design in worker processes where cores allow (:mod:`codex_lab.parallel`: the same numbers as
    a loop)."""
    train, val, tok = trade_data(corpus, sizes)
    vocab = tok.vocab_size
    pre = pretrain_unit(sizes, train, val, vocab)
    outs = run_units(design_unit, [(k,) for k in KINDS],
                     common=dict(pre=pre, sizes=sizes, train=train, val=val, vocab_size=vocab),
                     names=[f"design {k}" for k in KINDS])
    return TradeResult(sizes, vocab, pre, dict(zip(KINDS, outs)), tok)


def trade_states(res: TradeResult) -> dict[str, TrainingState]:
    """The training state of the pre-training (``"pre-training"``) and of every design at its
    stopping point, as its extension check leaves it (:attr:`ArmRun.judged`)."""
    return {"pre-training": res.pre.state, **{k: a.judged for k, a in res.arms.items()}}


def trade_costs(res: TradeResult, *, margin: float = MARGIN_NATS) -> dict[str, Comparison]:
    """Per design (not "plain"): the quality cost, held-out loss of the design minus the plain
    model's, each at its stopping point, paired by seed, as a non-inferiority comparison with
    ``margin``, judged with both arms' training states (the pre-training's is reported, not
    required: the plain arm is the pre-training continued to its plateau)."""
    states = trade_states(res)
    plain = res.arms["plain"].final
    out = {}
    for kind, arm in res.arms.items():
        if kind == "plain":
            continue
        c = noninferiority(plain, arm.final, margin=margin, paired=True, higher_is_better=False,
                           metric=f"held-out loss, {kind} minus plain (nats/token)")
        # both arms at their plateau, or the interval measures the budget, not the design
        out[kind] = judge_trained(c, [states["plain"], states[kind]])
    return out


__all__ = ["ArmRun", "KINDS", "LABELS", "MARGIN_NATS", "MIN_CHANGE_NATS", "TRADE_SIZES", "TradeResult", "TradeSizes",
           "base_config", "design_configs", "design_unit", "merge_pretraining", "pretrain_unit", "run_trade",
           "trade_costs", "trade_data",
           "trade_sizes", "trade_states"]
