"""The capstone's measured numbers: a per-model log filled stage by stage, and the table
that lays both models side by side (plain text or Markdown)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageLog:
    """Per-model numbers gathered stage by stage (a name -> value dict per model), each
    model's held-out curve of the pre-training stage (``(step, nats/token)`` pairs), and the
    release gates' comparisons (gate -> :class:`~codex_lab.stats.Comparison`)."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)
    curves: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    gates: dict[str, Any] = field(default_factory=dict)

    def put(self, model: str, **values: Any) -> None:
        """Record values for one model (``"baseline"`` or ``"candidate"``)."""
        self.rows.setdefault(model, {}).update(values)

    def timed(self, stage: str, t0: float) -> float:
        """Record the wall time of ``stage`` since ``t0`` (perf_counter seconds); return it."""
        self.times[stage] = time.perf_counter() - t0
        return self.times[stage]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def summary_table(log: StageLog, *, markdown: bool = False) -> str:
    """The numbers of both models side by side (plain text, or a Markdown table)."""
    models = list(log.rows)
    keys: list[str] = []
    for m in models:
        keys += [k for k in log.rows[m] if k not in keys]
    if markdown:
        lines = ["| measure | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
        lines += ["| " + k + " | " + " | ".join(_fmt(log.rows[m].get(k, "-")) for m in models) + " |" for k in keys]
        return "\n".join(lines)
    w = max(len(k) for k in keys) if keys else 8
    cw = max([len(m) for m in models] + [14])
    lines = [f"{'measure':<{w}}  " + "  ".join(f"{m:>{cw}}" for m in models)]
    for k in keys:
        lines.append(f"{k:<{w}}  " + "  ".join(f"{_fmt(log.rows[m].get(k, '-')):>{cw}}" for m in models))
    return "\n".join(lines)
