"""The capstone's measured trade: what each optimisation buys and what it costs, and which
combination the release gates promote.

The brief 4 + 4 step pipeline run (:func:`~codex_lab.lessons.l08_capstone.pipeline.run_capstone`)
shows every stage working, but a converted model that has trained a few steps has not won back
what conversion cost: comparing it with the baseline measures the step budget, not the design.
Here every design gets the baseline's training budget until both plateau:

1. per seed, a plain model is pre-trained from scratch (the seed draws its initialisation, the
   data order and the held-out windows it is scored on);
2. it is converted (:func:`codex_lab.nn.surgery.convert`, the capstone's recipe: K/V heads
   mean-pooled, experts upcycled from the dense FFN) into each design: sparse deep layers,
   GQA, MoE, and all three together;
3. every design *and the plain model itself* train ``uptrain_steps`` more steps on the same
   batches (the same budget), each with a held-out curve;
4. each curve gets its training state (:func:`codex_lab.training_state.training_state`);
   the quality cost of a design is the paired held-out loss difference against the plain
   arm, judged for non-inferiority with the margin :data:`MARGIN_NATS` declared here
   (:func:`codex_lab.stats.noninferiority`), and "under-trained: no verdict" unless both arms
   plateaued (:func:`codex_lab.stats.judge_trained`).

On a CPU this converges only at a smaller geometry than the shipped model's: the model, the
sequence, the window and the stride shrink together (standard mode: 2 layers of width 64,
32-token sequences, an 8-token window and every 4th 8-token block, which attends to the same
share of pairs at 32 tokens (0.43) as the shipped candidate's 64-token window + every 4th
64-token block at 256 tokens (0.44)); the steps are not cut.

What the designs *buy* does not depend on the trained values: decode speed (interleaved
rounds, :func:`~codex_lab.lessons.l08_capstone.pipeline.speed_ablation`), KV-cache bytes and
parameters stored vs active are measured on the shipped model converted into each design, the
size a release would ship. :func:`trade_rows` joins the two; :func:`gate_row` is the release
gate applied to one row (its quality criterion is the same non-inferiority margin), and
:func:`trade_decision` picks what the gates promote.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.parallel import run_units
from codex_lab.stats import HOLDS, Comparison, judge_trained, noninferiority
from codex_lab.training.curves import heldout_windows, small_vocab_streams, train_curve
from codex_lab.training_state import TrainingState, training_state

# The largest quality cost still called "kept", declared before any run (the same margin as
# lesson 03's GQA claim): 0.05 nats/token is a perplexity ratio exp(0.05) = 1.05, about 1.5% of
# the held-out losses these models reach (~3.3 nats/token). A design whose one-sided 95% upper
# bound of the cost is below it keeps the plain model's quality; the release gate uses the same
# margin (gate_row).
MARGIN_NATS = 0.05
# The smallest change of a held-out loss the training-state rule cares about: a fifth of the
# margin, so a curve still moving by less over another quarter of its run cannot move a
# verdict across the margin.
MIN_CHANGE_NATS = 0.01
# The designs, in the order of the table: the plain model, each optimisation alone, all together.
KINDS = ("plain", "sparse", "gqa", "moe", "all")
LABELS = {"plain": "plain (baseline)", "sparse": "sparse deep layers", "gqa": "GQA", "moe": "MoE (upcycled)", "all": "all three"}


@dataclass(frozen=True)
class TradeSizes:
    """The geometry and budget of the trade experiment in one mode.

    Model: ``n_layer`` layers of width ``d_model``, ``n_head`` query heads, vocabulary
    ``vocab_size`` (a byte-level BPE trained on the train split of the first ``max_files``
    corpus files); ``seq_len``-token windows, ``batch_size`` per step. The designs: the last
    ``n_layer - dense_layers`` layers use the pattern ``sparse`` and (MoE) ``n_experts``
    experts top-``top_k``; GQA keeps ``n_kv_head`` K/V heads. Pre-training:
    ``pretrain_steps`` AdamW steps, warm-up ``warmup`` to ``lr``; after conversion every
    design and the plain model train ``uptrain_steps`` steps, warm-up over a tenth of them to
    ``uptrain_lr``; both schedules decay by a cosine to ``min_lr`` over their first
    ``1 - flat_share`` and hold ``min_lr`` flat after it (so a curve's tail shows a plateau,
    not the annealing). Held-out loss (nats/token) on ``eval_windows`` windows per seed, every
    ``eval_every`` pre-training / ``uptrain_eval_every`` uptraining steps.
    """

    d_model: int
    n_layer: int
    n_head: int
    n_kv_head: int
    seq_len: int
    batch_size: int
    pretrain_steps: int
    uptrain_steps: int
    lr: float
    min_lr: float
    uptrain_lr: float
    warmup: int
    eval_every: int
    uptrain_eval_every: int
    eval_windows: int
    seeds: tuple[int, ...]
    vocab_size: int
    max_files: int | None
    sparse: str
    dense_layers: int
    n_experts: int
    top_k: int
    flat_share: float = 0.4

    def describe(self) -> str:
        """One line for the lesson and the report."""
        files = "all" if self.max_files is None else f"the first {self.max_files}"
        return (f"{self.n_layer} layers of width {self.d_model}, {self.n_head} heads, {self.seq_len}-token windows x "
                f"{self.batch_size}, vocabulary {self.vocab_size} (BPE on {files} corpus files); designs: layers "
                f"{self.dense_layers}..{self.n_layer - 1} sparse `{self.sparse}` and MoE {self.n_experts} experts "
                f"top-{self.top_k}, GQA {self.n_kv_head} K/V heads; pre-training {self.pretrain_steps} steps, then "
                f"{self.uptrain_steps} steps for every design and the plain model; {len(self.seeds)} seeds")


TRADE_SIZES: dict[str, TradeSizes] = {
    # CI: seconds; too short to plateau: the rule says "under-trained" and nothing is promoted on quality
    "fast": TradeSizes(d_model=32, n_layer=2, n_head=4, n_kv_head=2, seq_len=32, batch_size=8, pretrain_steps=30,
                       uptrain_steps=6, lr=3e-3, min_lr=3e-4, uptrain_lr=1e-3, warmup=3, eval_every=10,
                       uptrain_eval_every=2, eval_windows=16, seeds=(0, 1, 2), vocab_size=384, max_files=40,
                       sparse="window:8+blockstride:8:4", dense_layers=1, n_experts=4, top_k=2),
    # one CPU core: every arm reaches a plateau (the geometry shrunk, not the steps; see the module)
    # measured: 88 CPU s, 3 seeds, every arm "trained" (64-token windows, 500 pre-training steps: still falling)
    "standard": TradeSizes(d_model=64, n_layer=2, n_head=4, n_kv_head=2, seq_len=32, batch_size=16, pretrain_steps=800,
                           uptrain_steps=120, lr=3e-3, min_lr=3e-4, uptrain_lr=1e-3, warmup=25, eval_every=40,
                           uptrain_eval_every=10, eval_windows=64, seeds=(0, 1, 2), vocab_size=512, max_files=300,
                           sparse="window:8+blockstride:8:4", dense_layers=1, n_experts=4, top_k=2),
    # the shipped model's geometry with the capstone's pattern, for a GPU (not run on a CPU)
    "full": TradeSizes(d_model=256, n_layer=4, n_head=4, n_kv_head=2, seq_len=256, batch_size=16, pretrain_steps=4000,
                       uptrain_steps=400, lr=1e-3, min_lr=1e-4, uptrain_lr=3e-4, warmup=200, eval_every=200,
                       uptrain_eval_every=20, eval_windows=64, seeds=(0, 1, 2, 3, 4), vocab_size=4096, max_files=None,
                       sparse="window:64+blockstride:64:4", dense_layers=2, n_experts=8, top_k=2),
}


def trade_sizes(mode: str | None = None) -> TradeSizes:
    """The sizes for ``mode`` (default: the mode in force, :func:`codex_lab.runtime.mode_info`)."""
    from codex_lab.runtime import mode_info

    m = mode or mode_info().mode
    if m not in TRADE_SIZES:
        raise ValueError(f"unknown mode {m!r}; one of {sorted(TRADE_SIZES)}")
    return TRADE_SIZES[m]


def design_configs(base: ModelConfig, *, sparse: str, dense_layers: int, n_kv_head: int, n_experts: int,
                   top_k: int) -> dict[str, ModelConfig]:
    """One config per design of :data:`KINDS` over ``base`` (``"plain"`` is ``base`` itself):
    each optimisation alone, then all three (the capstone candidate's recipe)."""
    from codex_lab.lessons.l08_capstone.architecture import capstone_config

    n = base.n_layer
    deep = list(range(dense_layers, n))
    common = dict(sparse=sparse, n_experts=n_experts, top_k=top_k, attn_impl="blocks")
    return {
        "plain": base,
        "sparse": capstone_config(base, dense_layers=dense_layers, n_kv_head=base.n_kv_head, moe_layers=[], **common),
        "gqa": capstone_config(base, dense_layers=n, n_kv_head=n_kv_head, moe_layers=[], **common),
        "moe": capstone_config(base, dense_layers=n, n_kv_head=base.n_kv_head, moe_layers=deep, **common),
        "all": capstone_config(base, dense_layers=dense_layers, n_kv_head=n_kv_head, moe_layers=deep, **common),
    }


def trade_data(corpus: Any, sizes: TradeSizes) -> tuple[Tensor, Tensor, int]:
    """(train ids, val ids, vocabulary size) of the trade's small vocabulary
    (:func:`codex_lab.training.curves.small_vocab_streams`)."""
    return small_vocab_streams(corpus, sizes.vocab_size, sizes.max_files)


@dataclass
class TradeRun:
    """One seed: the plain pre-training curve, each design's held-out loss right after
    conversion, and each design's curve over the equal budget after it (``"plain"``: the
    plain model trained further)."""

    seed: int
    base: list[tuple[float, float]]
    converted: dict[str, float]
    curves: dict[str, list[tuple[float, float]]]
    seconds: float = 0.0

    def final(self, kind: str) -> float:
        """The last held-out loss of ``kind`` (nats/token)."""
        return self.curves[kind][-1][1]


def run_trade_seed(seed: int, train_tokens: Tensor, val_tokens: Tensor, vocab_size: int, sizes: TradeSizes, *,
                   device: torch.device | None = None) -> TradeRun:
    """One seed of the trade experiment (module docstring, steps 1-3). The seed draws the plain
    model's initialisation, the data order (every design of a seed trains on the same batches,
    so the arms are paired) and the held-out windows."""
    from codex_lab.nn.surgery import convert
    from codex_lab.training.evaluate import val_loss

    t0 = time.perf_counter()
    s, dev = sizes, device or torch.device("cpu")
    evals = heldout_windows(val_tokens, s.eval_windows, s.seq_len, seed, salt=29)
    torch.manual_seed(seed)
    base_cfg = ModelConfig(vocab_size=vocab_size, d_model=s.d_model, n_layer=s.n_layer, n_head=s.n_head,
                           max_seq_len=max(1024, s.seq_len))
    base = CodexModel(base_cfg).to(dev)
    base_curve = train_curve(base, train_tokens, evals, steps=s.pretrain_steps, lr=s.lr, min_lr=s.min_lr,
                             warmup=s.warmup, batch_size=s.batch_size, seq_len=s.seq_len, seed=seed,
                             eval_every=s.eval_every, flat_share=s.flat_share)
    cfgs = design_configs(base_cfg, sparse=s.sparse, dense_layers=s.dense_layers, n_kv_head=s.n_kv_head,
                          n_experts=s.n_experts, top_k=s.top_k)
    converted, curves = {}, {}
    for kind, cfg in cfgs.items():
        m = convert(base, cfg, seed=seed)  # a copy; "plain" converts to itself
        converted[kind] = val_loss(m, evals)
        curves[kind] = train_curve(m, train_tokens, evals, steps=s.uptrain_steps, lr=s.uptrain_lr, min_lr=s.min_lr,
                                   warmup=max(1, s.uptrain_steps // 10), batch_size=s.batch_size, seq_len=s.seq_len,
                                   seed=seed + 1_000_003, eval_every=s.uptrain_eval_every, flat_share=s.flat_share)
    return TradeRun(seed, base_curve, converted, curves, time.perf_counter() - t0)


def run_trade(corpus: Any, sizes: TradeSizes | None = None, *, device: torch.device | None = None) -> list[TradeRun]:
    """Every seed of the trade experiment at ``sizes`` (default: the mode's)."""
    s = sizes or trade_sizes()
    train, val, vocab = trade_data(corpus, s)
    # one seed per worker process where cores allow (codex_lab.parallel: the same numbers as a loop)
    return run_units(run_trade_seed, [(seed,) for seed in s.seeds],
                     common=dict(train_tokens=train, val_tokens=val, vocab_size=vocab, sizes=s, device=device),
                     names=[f"seed {seed}" for seed in s.seeds])


def trade_states(runs: Sequence[TradeRun], *, min_change: float = MIN_CHANGE_NATS) -> dict[str, TrainingState]:
    """Training state over the seeds of the plain pre-training (``"pre-training"``) and of
    every design's curve after conversion (held-out loss, lower is better)."""
    if not runs:
        raise ValueError("no runs: give one TradeRun per seed")
    out = {"pre-training": training_state([r.base for r in runs], higher_is_better=False, min_change=min_change,
                                          arm="pre-training")}
    for kind in runs[0].curves:
        out[kind] = training_state([r.curves[kind] for r in runs], higher_is_better=False, min_change=min_change,
                                   arm=kind)
    return out


def trade_costs(runs: Sequence[TradeRun], states: Mapping[str, TrainingState], *,
                margin: float = MARGIN_NATS) -> dict[str, Comparison]:
    """Per design (not "plain"): the quality cost, final held-out loss of the design minus the
    plain model's, paired by seed, as a non-inferiority comparison with ``margin``, judged
    with the pre-training's and both arms' training states (under-trained: no verdict)."""
    plain = [r.final("plain") for r in runs]
    out = {}
    for kind in runs[0].curves:
        if kind == "plain":
            continue
        c = noninferiority(plain, [r.final(kind) for r in runs], margin=margin, paired=True, higher_is_better=False,
                           metric=f"held-out loss, {kind} minus plain (nats/token)")
        # conversion starts from a plateaued plain model or the comparison says nothing about the design
        out[kind] = judge_trained(c, [states["pre-training"], states["plain"], states[kind]])
    return out


@dataclass
class TradeRow:
    """One design's line of the trade table.

    Buys (shipped-size conversions): ``speed``/``speed_lo``/``speed_hi`` decode tokens/s over
    plain (median and per-round range of interleaved rounds), ``kv_bytes`` per token (fp32),
    ``params``/``active`` stored and used per token. Costs (trained geometry): ``cost`` the
    non-inferiority comparison (None for plain); ``state`` the design's training state.
    ``passed``/``reasons``: the release gate (:func:`gate_row`).
    """

    kind: str
    speed: float
    speed_lo: float
    speed_hi: float
    kv_bytes: int
    kv_ratio: float
    params: int
    active: int
    state: TrainingState | None
    cost: Comparison | None
    passed: bool = False
    reasons: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The design's name in the table."""
        return LABELS.get(self.kind, self.kind)


def gate_row(row: TradeRow, *, margin: float = MARGIN_NATS) -> tuple[bool, list[str]]:
    """The release gate on one design: (passed, reasons it was refused).

    - quality: the cost's non-inferiority verdict "holds" at ``margin`` (so both arms
      plateaued; the same margin as the table's verdicts);
    - speed: decode is not slower than plain in every interleaved round (``speed_hi >= 1``);
    - worth shipping: it buys something, a smaller KV cache or faster decode in every round
      (``speed_lo > 1``).
    """
    if row.kind == "plain":
        return False, ["the baseline itself"]
    if row.cost is not None and row.cost.margin != margin:
        raise ValueError(f"the cost was judged with a {row.cost.margin:g} nats/token margin and the gate with {margin:g}: "
                         "the gate's quality criterion is the table's non-inferiority margin; use one")
    why = []
    if row.cost is None or row.cost.verdict != HOLDS:
        v = "not measured" if row.cost is None else row.cost.verdict
        why.append(f"quality: cost not shown below the {margin:g} nats/token margin ({v})")
    if not row.speed_hi >= 1.0:
        why.append(f"speed: slower than plain in every round ({row.speed_lo:.2f}-{row.speed_hi:.2f}x)")
    if not (row.kv_ratio < 1.0 or row.speed_lo > 1.0):
        why.append("buys nothing: KV cache not smaller and decode not faster in every round")
    return not why, why


def trade_rows(runs: Sequence[TradeRun], ablation: Sequence[dict[str, Any]], *, batch: int | None = None,
               margin: float = MARGIN_NATS, min_change: float = MIN_CHANGE_NATS) -> list[TradeRow]:
    """The trade table: each design's buys (from :func:`~codex_lab.lessons.l08_capstone.pipeline.speed_ablation`
    records, which carry ``kind``, at ``batch``, default the largest) and costs (from ``runs``),
    each gated with :func:`gate_row`."""
    states = trade_states(runs, min_change=min_change)
    costs = trade_costs(runs, states, margin=margin)
    b = batch if batch is not None else max(r["batch"] for r in ablation)
    recs = {r["kind"]: r for r in ablation if r["batch"] == b}
    missing = [k for k in KINDS if k not in recs]
    if missing:
        raise ValueError(f"the speed ablation at batch {b} lacks {missing}; run speed_ablation with every design")
    plain_kv = recs["plain"]["kv_bytes_per_token"]
    rows = []
    for kind in KINDS:
        r = recs[kind]
        row = TradeRow(kind, r["vs_plain_median"], r["vs_plain_lo"], r["vs_plain_hi"], r["kv_bytes_per_token"],
                       # kv_ratio = design's KV bytes per token / plain's
                       r["kv_bytes_per_token"] / plain_kv, r["params"], r["active_params"], states.get(kind),
                       costs.get(kind))
        row.passed, row.reasons = gate_row(row, margin=margin)
        rows.append(row)
    return rows


def trade_decision(rows: Sequence[TradeRow]) -> dict[str, Any]:
    """What the gates promote: among the designs that pass :func:`gate_row`, the one with the
    fastest median decode (the smaller KV cache breaks ties); none passing: keep the plain
    model. Returns ``{"promoted": kind or None, "passed": [kinds], "text": one sentence}``."""
    ok = [r for r in rows if r.passed]
    if not ok:
        return {"promoted": None, "passed": [], "text": "the gates promote no design: the plain model stays (each "
                "design's refusal is in its row)"}
    best = max(ok, key=lambda r: (r.speed, -r.kv_bytes))
    return {"promoted": best.kind, "passed": [r.kind for r in ok],
            "text": f"the gates promote {best.label}: it passes quality (non-inferior), speed and worth-shipping, and "
                    f"decodes fastest among the {len(ok)} design(s) that pass ({', '.join(r.label for r in ok)})"}


def trade_table(rows: Sequence[TradeRow], *, markdown: bool = False) -> str:
    """The trade table as text (plain or Markdown): buys, costs, state, gate."""
    head = ["design", "decode vs plain (rounds)", "KV B/token", "params stored / active", "held-out loss cost vs plain",
            "training state", "gate"]
    body = []
    for r in rows:
        if r.cost is None:
            cost = "-"
        else:
            c = r.cost
            # the paired difference and its 90% interval (the one-sided 95% bounds), then the verdict
            cost = f"{c.diff:+.3f} [{c.lo:+.3f}, {c.hi:+.3f}] -> {c.verdict}"
        st = r.state.short() if r.state is not None else "-"
        gate = "-" if r.kind == "plain" else ("promotable" if r.passed else "refused: " + "; ".join(w.split(":")[0] for w in r.reasons))
        body.append([r.label, f"{r.speed:.2f}x ({r.speed_lo:.2f}-{r.speed_hi:.2f}x)",
                     f"{r.kv_bytes:,} ({r.kv_ratio:.2f}x)", f"{r.params:,} / {r.active:,}", cost, st, gate])
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                         + ["| " + " | ".join(b) + " |" for b in body])
    w = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    return "\n".join("  ".join(x[i].ljust(w[i]) for i in range(len(head))).rstrip() for x in [head] + body)


def plot_trade(runs: Sequence[TradeRun]) -> Any:
    """Held-out loss after conversion, mean over seeds, every design (steps from the
    conversion). Returns the figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3))
    for kind in runs[0].curves:
        xs = [s for s, _ in runs[0].curves[kind]]
        ys = [sum(r.curves[kind][i][1] for r in runs) / len(runs) for i in range(len(xs))]
        ax.plot(xs, ys, "o-", ms=3, label=LABELS.get(kind, kind))
    ax.set_xlabel("steps after conversion (same batches for every design)")
    ax.set_ylabel("held-out loss (nats/token)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig

