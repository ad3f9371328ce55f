"""``codex-lab report``: run every lesson's report section and write Markdown + PNG plots.

Sections are the ``report.py`` modules of the lessons (``codex_lab/lessons/lNN_topic/``), each with
``TITLE: str``, ``ORDER: int`` and ``run(ctx: ReportContext) -> str`` returning Markdown.
A section records each seed claim it checks with ``ctx.claim(...)``; the report ends with
a table of every claim beside the measured figure and a verdict.
"""

from __future__ import annotations


import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

from codex_lab.course.plugins import lesson_modules
from codex_lab.runtime import describe_environment, fast_mode

VERDICTS = ("holds", "holds with a correction", "does not hold", "not reproduced at this scale")


@dataclass
class ReportContext:
    """What a section gets: the output folder, the mode, and cached shared inputs."""

    out_dir: Path
    fast: bool
    corpus_path: str | None = None
    progress: bool = True
    claims: list[dict[str, str]] = field(default_factory=list)
    _cache: dict[str, Any] = field(default_factory=dict)

    def savefig(self, fig: Any, name: str) -> str:
        """Save a matplotlib figure as PNG in the report folder; return the Markdown image link."""
        import matplotlib.pyplot as plt

        path = self.out_dir / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return f"![{name}]({path.name})"

    def checkpoint(self) -> Any:
        """The shipped checkpoint (loaded once per report)."""
        if "ckpt" not in self._cache:
            from codex_lab.training.checkpoint import load_pretrained

            self._cache["ckpt"] = load_pretrained()
        return self._cache["ckpt"]

    def corpus(self) -> Any:
        """The corpus (default: standard library), read once per report."""
        if "corpus" not in self._cache:
            from codex_lab.data.corpus import load_corpus

            self._cache["corpus"] = load_corpus(self.corpus_path)
        return self._cache["corpus"]

    def claim(self, claim: str, measured: str, verdict: str, lesson: str = "") -> None:
        """Record one seed claim, the figure measured here, and a verdict from ``VERDICTS``."""
        if verdict not in VERDICTS:
            raise ValueError(f"verdict {verdict!r} must be one of {VERDICTS}")
        self.claims.append({"lesson": lesson, "claim": claim, "measured": measured, "verdict": verdict})


def discover_sections() -> list[ModuleType]:
    """Every section module, sorted by ORDER then name."""
    mods = lesson_modules("report")
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", 99), m.__name__))


def run_report(out_dir: str | Path | None = None, *, sections: list[str] | None = None, corpus: str | None = None, progress: bool = True) -> Path:
    """Run the report; return the path of ``report.md``.

    ``sections`` filters by module name substring (e.g. ``["l00", "l02"]``). A section that
    crashes is reported as such (with its traceback) and the run exits non-zero later;
    the other sections still run.
    """
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path(out_dir) if out_dir else Path("reports") / stamp
    out.mkdir(parents=True, exist_ok=True)
    ctx = ReportContext(out_dir=out, fast=fast_mode(), corpus_path=corpus, progress=progress)
    t_start = time.perf_counter()
    parts = [f"# codex-lab report\n\nGenerated {stamp} UTC in {'fast' if ctx.fast else 'full'} mode.\n"]
    failures = []
    mods = [m for m in discover_sections() if not sections or any(s in m.__name__ for s in sections)]
    if not mods:
        raise ValueError(f"no report section matches {sections}")
    timings = []
    for mod in mods:
        t0 = time.perf_counter()
        title = getattr(mod, "TITLE", mod.__name__)
        if progress:
            print(f"[report] {title} ...", flush=True)
        try:
            body = mod.run(ctx)
        except Exception:
            failures.append(title)
            body = f"**This section failed:**\n\n```\n{traceback.format_exc()}\n```\n"
        dt = time.perf_counter() - t0
        timings.append((title, dt))
        parts.append(f"## {title}\n\n{body.strip()}\n\n_Section time: {dt:.1f} s._\n")
    if ctx.claims:
        rows = ["| lesson | seed claim | measured here | verdict |", "|---|---|---|---|"]
        rows += [f"| {c['lesson']} | {c['claim']} | {c['measured']} | {c['verdict']} |" for c in ctx.claims]
        parts.append("## Seed claims and verdicts\n\n" + "\n".join(rows) + "\n")
    env = describe_environment()
    total = time.perf_counter() - t_start
    parts.append("## Run\n\n" + "\n".join(f"- {k}: {v}" for k, v in env.items())
                 + "\n" + "\n".join(f"- section `{t}`: {d:.1f} s" for t, d in timings) + f"\n- total: {total:.1f} s\n")
    path = out / "report.md"
    path.write_text("\n".join(parts))
    if failures:
        raise RuntimeError(f"report written to {path}, but these sections failed: {failures}")
    return path
