"""The trade table: each design's costs (quality at its plateau) beside what it buys (speed and
KV bytes on the same trained models), its release gate, and the decision.

The gate (:func:`gate_row`) asks three things of a design, with the table's own numbers:
quality kept (non-inferior at :data:`~codex_lab.lessons.l08_capstone.trade.MARGIN_NATS`, so
both arms plateaued); not slower than plain in every round of prefill or of decode; and worth
shipping (a smaller KV cache, or prefill or decode faster in every round). The gates promote
the passing design with the fastest median decode (:func:`trade_decision`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from codex_lab.lessons.l08_capstone.trade import KINDS, LABELS, MARGIN_NATS, ArmRun, TradeResult, trade_costs
from codex_lab.stats import HOLDS, Comparison
from codex_lab.training_state import TrainingState

Ratio = tuple[float, float, float]  # (median, lo, hi) of the per-round speed-ups over plain


@dataclass
class TradeRow:
    """One design's line of the trade table.

    Buys (the first seed's trained model): ``prefill``/``decode`` speed-ups over plain
    (:data:`Ratio`), ``kv_bytes`` per token measured on its cache, ``params``/``active``
    stored and used per token. Costs: ``cost`` the non-inferiority comparison (None for plain);
    ``arm`` the design's run to its plateau (state, steps, extension check).
    ``passed``/``reasons``: the release gate (:func:`gate_row`).
    """

    kind: str
    prefill: Ratio
    decode: Ratio
    kv_bytes: int
    kv_ratio: float
    params: int
    active: int
    arm: ArmRun
    cost: Comparison | None
    passed: bool = False
    reasons: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The design's name in the table."""
        return LABELS.get(self.kind, self.kind)

    @property
    def state(self) -> TrainingState:
        """The design's training state at its stopping point."""
        return self.arm.judged


def gate_row(row: TradeRow, *, margin: float = MARGIN_NATS) -> tuple[bool, list[str]]:
    """The release gate on one design: (passed, reasons it was refused); see the module."""
    if row.kind == "plain":
        return False, ["the baseline itself"]
    if row.cost is not None and row.cost.margin != margin:
        raise ValueError(f"the cost was judged with a {row.cost.margin:g} nats/token margin and the gate with {margin:g}: "
                         "the gate's quality criterion is the table's non-inferiority margin; use one")
    why = []
    if row.cost is None or row.cost.verdict != HOLDS:
        v = "not measured" if row.cost is None else row.cost.verdict
        why.append(f"quality: cost not shown below the {margin:g} nats/token margin ({v})")
    slow = [f"{p} {r[1]:.2f}-{r[2]:.2f}x" for p, r in (("prefill", row.prefill), ("decode", row.decode)) if not r[2] >= 1.0]
    if slow:
        why.append("speed: slower than plain in every round (" + ", ".join(slow) + ")")
    if not (row.kv_ratio < 1.0 or row.prefill[1] > 1.0 or row.decode[1] > 1.0):
        why.append("buys nothing: KV cache not smaller, prefill and decode not faster in every round")
    return not why, why


def trade_rows(res: TradeResult, speed: Mapping[str, Mapping[str, Any]], *,
               margin: float = MARGIN_NATS) -> list[TradeRow]:
    """The trade table: each design's buys (``speed``: :func:`~codex_lab.lessons.l08_capstone.trade_speed.speed_records`
    on ``res``'s trained models) and costs (from ``res``), each gated with :func:`gate_row`."""
    missing = [k for k in KINDS if k not in speed or k not in res.arms]
    if missing:
        raise ValueError(f"the trade lacks {missing}: run every design and time every trained model")
    costs = trade_costs(res, margin=margin)
    plain_kv = speed["plain"]["kv_bytes_per_token"]
    rows = []
    for kind in KINDS:
        r = speed[kind]
        row = TradeRow(kind, tuple(r["prefill_vs_plain"]), tuple(r["decode_vs_plain"]), r["kv_bytes_per_token"],
                       # kv_ratio = design's KV bytes per token / plain's
                       r["kv_bytes_per_token"] / plain_kv, r["params"], r["active_params"], res.arms[kind],
                       costs.get(kind))
        row.passed, row.reasons = gate_row(row, margin=margin)
        rows.append(row)
    return rows


def trade_decision(rows: list[TradeRow]) -> dict[str, Any]:
    """What the gates promote: among the designs that pass :func:`gate_row`, the one with the
    fastest median decode (the smaller KV cache breaks ties); none passing: keep the plain
    model. Returns ``{"promoted": kind or None, "passed": [kinds], "text": one sentence}``."""
    ok = [r for r in rows if r.passed]
    if not ok:
        return {"promoted": None, "passed": [], "text": "the gates promote no design: the plain model stays (each "
                "design's refusal is in its row)"}
    best = max(ok, key=lambda r: (r.decode[0], -r.kv_bytes))
    return {"promoted": best.kind, "passed": [r.kind for r in ok],
            "text": f"the gates promote {best.label}: it keeps quality (non-inferior), is not slower and buys "
                    f"something, and decodes fastest among the {len(ok)} design(s) that pass "
                    f"({', '.join(r.label for r in ok)})"}


def _ratio(r: Ratio) -> str:
    return f"{r[0]:.2f}x ({r[1]:.2f}-{r[2]:.2f}x)"


def trade_table(rows: list[TradeRow], *, context: int, decode_batch: int, markdown: bool = False) -> str:
    """The trade table as text (plain or Markdown): costs, state and steps, buys, gate."""
    head = ["design", "held-out loss cost vs plain", "training state (steps)", f"prefill {context} tok vs plain",
            f"decode b{decode_batch} @ {context} vs plain", "KV B/token", "params stored / active", "gate"]
    body = []
    for r in rows:
        c = r.cost
        # the paired difference and its 90% interval (the one-sided 95% bounds), then the verdict
        cost = "-" if c is None else f"{c.diff:+.3f} [{c.lo:+.3f}, {c.hi:+.3f}] -> {c.verdict}"
        gate = "-" if r.kind == "plain" else ("promotable" if r.passed else "refused: " + "; ".join(w.split(":")[0] for w in r.reasons))
        body.append([r.label, cost, f"{r.state.short()} ({r.arm.steps})", _ratio(r.prefill), _ratio(r.decode),
                     f"{r.kv_bytes:,} ({r.kv_ratio:.2f}x)", f"{r.params:,} / {r.active:,}", gate])
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                         + ["| " + " | ".join(b) + " |" for b in body])
    w = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    return "\n".join("  ".join(x[i].ljust(w[i]) for i in range(len(head))).rstrip() for x in [head] + body)


def trade_lines(res: TradeResult) -> list[str]:
    """Every arm's run to its plateau, one line each (state, steps, extension check)."""
    return [res.pre.describe()] + [a.describe() for a in res.arms.values()]


def plot_trade(res: TradeResult) -> Any:
    """Held-out loss after conversion, mean over seeds, every design (steps from the
    conversion; each arm stops where the rule called it). Returns the figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3))
    for kind, arm in res.arms.items():
        n = min(len(c) for c in arm.curves)
        xs = [s for s, _ in arm.curves[0][:n]]
        ys = [sum(c[i][1] for c in arm.curves) / len(arm.curves) for i in range(n)]
        ax.plot(xs, ys, "o-", ms=2, label=LABELS.get(kind, kind))
    ax.set_xlabel("steps after conversion (same batches for every design of a seed)")
    ax.set_ylabel("held-out loss (nats/token)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def reference_agreement(res: TradeResult, *, ref: Mapping[str, Any] | None = None) -> list[str]:
    """Lines for the report: per design, the shipped reference run's quality verdict
    (``scripts/reference_article.py --section 08``, every arm trained to its plateau at the
    article's sizes) beside this run's (:func:`trade_costs`), saying whether they agree. A
    design's reference verdict is the claim's when it stands: both arms it compares (the design
    and the plain model) at their plateau by today's rule (:func:`codex_lab.reference.rejudge`)
    and neither found still learning by its extension check; otherwise its line says what blocks
    it, and neither run settles that claim. ``ref``: the reference (default: the shipped one);
    no lines when none is shipped."""
    from codex_lab.reference import describe_provenance, load_reference, rejudge

    ref = load_reference("l08_article") if ref is None else ref
    if ref is None:
        return []
    d = ref["data"]
    states = {s.arm: s for s in (rejudge(d) or [])}
    ext = d.get("extension") or {}

    def blocked(kind: str) -> str:
        """Why the reference's verdict on ``kind`` does not stand ("" when it stands)."""
        why = []
        for arm in (LABELS["plain"], LABELS.get(kind, kind)):
            st = states.get(arm)
            if st is None:
                why.append(f"{arm}: no training state shipped")
            elif not st.trained:
                why.append(f"{arm} {st.state}")
            elif (ext.get(arm) or {}).get("confirmed") is False:
                why.append(f"{arm} still learning in its extension check")
        return "; ".join(why)

    # pre-registration: a run that records no verdict seeds apart from its tuning seeds (the first reference run
    # judged on seeds 0-2, which chose its sizes) cannot give the claims' verdicts, whatever its arms' states
    seeds, tuning = d.get("seeds"), d.get("tuning_seeds")
    unregistered = ("judged on the seeds that chose its sizes (not pre-registered)" if seeds is None or tuning is None
                    else f"seeds {sorted(set(seeds) & set(tuning))} both tuned and judged it" if set(seeds) & set(tuning)
                    else "")
    theirs, mine = d.get("primary") or {}, trade_costs(res)
    lines, standing = [], []
    for kind, c in mine.items():
        r = theirs.get(kind)
        if r is None:
            continue
        why = "; ".join(w for w in (unregistered, blocked(kind)) if w)
        standing.append(not why)
        agree = "agrees" if r["verdict"] == c.verdict else f"differs ({c.verdict})"
        lines.append(f"- {LABELS.get(kind, kind)}: reference {r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}] "
                     f"-> {r['verdict']} ({'stands' if not why else 'does not stand: ' + why}); this run {agree}")
    if standing and all(standing):
        head = ("The claims' verdicts are the shipped reference run's (every arm there at its plateau, each confirmed "
                "by its extension check)")
    elif any(standing):
        head = ("Per design, the claim's verdict is the shipped reference run's where both arms it compares are at "
                "their plateau and confirmed by its extension check; where they are not (the line says why), "
                "neither run settles it")
    else:
        head = "The shipped reference run's verdicts do not stand either (each line says why): neither run settles these claims"
    return [f"{head}; {describe_provenance(ref)}:", "", *lines]


__all__ = ["Ratio", "TradeRow", "gate_row", "plot_trade", "reference_agreement", "trade_decision", "trade_lines", "trade_rows",
           "trade_table"]
