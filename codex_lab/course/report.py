"""``codex-lab report``: run every lesson's report section and write Markdown + PNG plots.

Sections are the ``report.py`` modules of the lessons (``codex_lab/lessons/lNN_topic/``), each with
``TITLE: str``, ``ORDER: int`` and ``run(ctx: ReportContext) -> str`` returning Markdown.
A section records each seed claim it checks with ``ctx.claim(...)``; the report ends with
a table of every claim beside the measured figure and a verdict.

The runner says up front which mode runs, why, and how long it should take here (recorded
per-section timings scaled by a matmul calibration, ``codex_lab.runtime``). ``report.md`` is
rewritten (atomically) after every section, so an interrupted run (Ctrl-C) leaves a valid
partial report that lists the finished, interrupted and skipped sections.

Every section runs in the mode the command line resolved (:class:`codex_lab.runtime.Mode`:
fast, standard or full), handed to it on the context (``ctx.mode``, ``ctx.pick``); the
header gives the expected time of each mode here. Standard mode (the CPU default) is sized
to finish within ``STANDARD_BUDGET_S`` (25 minutes) on 2 cores with converged quality
verdicts; full mode on a CPU runs the article's sizes and says it takes hours.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

from codex_lab.course.plugins import lesson_modules
from codex_lab.errors import InputError
from codex_lab.runtime import (calibrate_ms, compute_threads, describe_environment, expected_seconds, format_seconds,
                               progress, speed_factor, timing_table, use_compute_threads)
from codex_lab.runtime.mode import Mode


from codex_lab.stats import VERDICTS  # the one vocabulary: holds, fails, fails as stated, not resolved, under-trained
# the standard (default, converged) report on 2 CPU cores must finish within 25 minutes
STANDARD_BUDGET_S = 25 * 60


@dataclass
class ReportContext:
    """What a section gets: the output folder, the run's mode, and cached shared inputs."""

    out_dir: Path
    run_mode: Mode
    corpus_path: str | None = None
    progress: bool = True
    claims: list[dict[str, str]] = field(default_factory=list)
    measured: list[dict[str, str]] = field(default_factory=list)
    goals: list[dict[str, Any]] = field(default_factory=list)
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

    @property
    def mode(self) -> str:
        """``"fast"``, ``"standard"`` or ``"full"`` (``fast`` is True for the first two: laptop sizes)."""
        return self.run_mode.name

    @property
    def fast(self) -> bool:
        """Laptop sizes: fast and standard mode (``mode`` tells them apart)."""
        return self.run_mode.fast

    @property
    def pick(self) -> Callable[..., Any]:
        """The size for this run's mode: :meth:`codex_lab.runtime.Mode.pick` of ``run_mode``."""
        return self.run_mode.pick

    def claim(self, claim: str, measured: str, verdict: str, lesson: str = "", states: str = "") -> None:
        """Record one seed claim, the figure measured here, a verdict from ``codex_lab.stats.VERDICTS``
        and, for a quality claim, the arms' training states (``codex_lab.training_state.states_text``)."""
        if verdict not in VERDICTS:
            raise ValueError(f"verdict {verdict!r} must be one of {VERDICTS}")
        self.claims.append({"lesson": lesson, "claim": claim, "measured": measured, "verdict": verdict,
                            "states": states or "n/a (a cost or behaviour, not a trained quality)"})


    def measure(self, what: str, figure: str, lesson: str = "") -> None:
        """Record a figure that measures a definition (cache bytes per token, versions the
        registry keeps): a number, not a verdict, since no input of the course could make it
        come out the other way. It is listed apart from the claims table."""
        self.measured.append({"lesson": lesson, "what": what, "figure": figure})

    def goal(self, goal: str, measured: float, target: float, how: str, lesson: str = "") -> str:
        """Record one performance goal: a ratio ``measured`` here against ``target``
        (met when measured >= target), with ``how`` (sizes, command); returns a one-line summary."""
        met = measured >= target
        self.goals.append({"lesson": lesson, "goal": goal, "measured": measured, "target": target, "how": how, "met": met})
        return f"{goal}: {measured:.2f}x measured, goal {target:.2f}x: {'met' if met else 'missed'} ({how})."


class ReportInterrupted(KeyboardInterrupt):
    """Ctrl-C during a report; ``path`` is the valid partial ``report.md`` written before stopping."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"report interrupted; partial report written to {path}")
        self.path = path


def discover_sections() -> list[ModuleType]:
    """Every section module, sorted by ORDER then name."""
    mods = lesson_modules("report")
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", 99), m.__name__))


def section_key(mod: Any) -> str:
    """The two-digit lesson number of a section (``...lessons.l05_multitask.report`` -> ``"05"``)."""
    m = re.search(r"(?:^|\.)l(\d\d)_", mod.__name__)
    return m.group(1) if m else f"{int(getattr(mod, 'ORDER', 99)):02d}"


def select_sections(mods: Sequence[Any], wanted: Sequence[str] | None) -> list[Any]:
    """The sections named in ``wanted``, in report order: ``"05"``, ``"l05"``, ``"5"`` or a
    module-name fragment (``"multitask"``). An unknown name is an InputError listing the choices."""
    if not wanted:
        return list(mods)
    chosen: set[int] = set()
    for raw in wanted:
        w = raw.strip().lower()
        if not w:
            continue
        num = re.fullmatch(r"l?(\d{1,2})", w)
        hits = [i for i, m in enumerate(mods)
                if (num and section_key(m) == f"{int(num.group(1)):02d}") or (not num and w in m.__name__.lower())]
        if not hits:
            choices = ", ".join(f"{section_key(m)} ({m.__name__.split('.')[-2] if '.' in m.__name__ else m.__name__})" for m in mods)
            raise InputError(f"no report section matches {raw!r}; choose from: {choices} (e.g. --sections 02,05)")
        chosen.update(hits)
    return [m for i, m in enumerate(mods) if i in chosen]


def plan_modes(keys: Sequence[str], info: Mode) -> dict[str, str]:
    """Mode of each section: the mode in force, for every section. Full mode on a CPU runs the
    article's sizes everywhere (hours; the header says so with its estimate): no section is
    quietly kept small. Standard mode is the laptop's converged run."""
    return {k: info.name for k in keys}


def plan_estimate(plan: dict[str, str], device: str) -> tuple[float | None, str]:
    """Expected seconds of a planned run on this machine (None if any part is unrecorded) and
    the basis of the figure (where the recorded timings come from, the calibration factor)."""
    total, sources = 0.0, []
    for k, mode in plan.items():
        est = expected_seconds("report", [k], mode, device)
        if est.seconds is None:
            return None, est.basis
        total += est.seconds
        src = timing_table("report", mode, device)[1]
        if f"{mode} mode: {src}" not in sources:
            sources.append(f"{mode} mode: {src}")
    scale = "as recorded on a GPU" if device == "cuda" else f"x{speed_factor():.2f} for this machine by a matmul calibration"
    return total, "; ".join(sources) + f"; {scale}"


def header_lines(info: Mode, plan: dict[str, str]) -> list[str]:
    """The first lines of a report: mode, why, expected time here, how to choose the other modes."""
    keys = list(plan)
    secs, basis = plan_estimate(plan, info.device)
    est = f"about {format_seconds(secs)}" if secs is not None else "unknown"
    what = {"fast": "fast mode (CI's sizes: the quality experiments are too short to converge, so their verdicts "
                    "may read \"under-trained: no verdict\")",
            "standard": "standard mode (fast sizes; the quality experiments sized for a laptop CPU's budget, each "
                        "arm's training state saying whether it reached its plateau there: one that did not gives no "
                        "verdict)",
            "full": "full mode (the article's sizes"
                    + (": weeks on a 2-core CPU, by the lower bound below" if info.device != "cuda" else "") + ")"}[info.name]
    lines = [f"Mode: {what}, because {info.reason}.",
             f"Expected run time on this machine: {est} for {len(keys)} section(s) ({basis}; table: codex_lab/assets/timings.json).",
             f"Sections: {', '.join(keys)}.",
             _workers_line(info)]
    for other in (m for m in ("fast", "standard", "full") if m != info.name):
        o_secs, _ = plan_estimate(plan_modes(keys, Mode(other, "", "flag", info.device)), info.device)
        note = f"about {format_seconds(o_secs)} here" if o_secs is not None else "time not recorded for this device"
        lines.append(f"{other.capitalize()} mode: `codex-lab report --mode {other}` or CODEX_LAB_MODE={other} ({note}).")
    return lines


def _workers_line(info: Mode) -> str:
    """How the quality experiments' seeds and arms run (codex_lab.parallel)."""
    from codex_lab.parallel import JOBS_ENV, unit_workers

    n = unit_workers(64)
    how = (f"{n} worker processes side by side" if n > 1 else "one after another in this process")
    return (f"Seeds and arms of the training experiments: {how}, {compute_threads()} math thread(s) each "
            f"({JOBS_ENV}=N to change; the numbers are the same either way).")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_report(out_dir: str | Path | None = None, *, mode: Mode, sections: list[str] | None = None,
               corpus: str | None = None, progress: bool = True, modules: Sequence[Any] | None = None) -> Path:
    """Run the report in ``mode`` (resolved by the caller: :func:`codex_lab.runtime.resolve_mode`);
    return the path of ``report.md``.

    ``sections`` selects lessons (``["02", "l05"]``; see ``select_sections``); ``modules``
    replaces the discovered sections (tests inject fakes). A section that crashes is reported
    as such (with its traceback) and the run raises RuntimeError at the end; the other sections
    still run. Ctrl-C raises ``ReportInterrupted`` after writing the partial report.
    """
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path(out_dir) if out_dir else Path("reports") / stamp
    mods = select_sections(list(modules) if modules is not None else discover_sections(), sections)
    if not mods:
        raise InputError("no report sections found")
    out.mkdir(parents=True, exist_ok=True)
    info = mode
    keys = [section_key(m) for m in mods]
    plan = plan_modes(keys, info)
    head = header_lines(info, plan)
    for line in head:
        print(f"[report] {line}", flush=True)
    ctx = ReportContext(out_dir=out, run_mode=info, corpus_path=corpus, progress=progress)
    t_start = time.perf_counter()
    done: list[tuple[str, str, float, str]] = []  # key, title, seconds, mode
    bodies: list[str] = []
    failures: list[str] = []
    path = out / "report.md"
    interrupted: str | None = None
    bar = _section_bar(keys, plan, info, progress)
    quiet_before = os.environ.get("CODEX_LAB_PROGRESS")
    if not progress:
        os.environ["CODEX_LAB_PROGRESS"] = "0"  # every bar in the sections (runtime.progress) stays quiet too
    try:
        for mod, key in zip(mods, keys):
            title = getattr(mod, "TITLE", mod.__name__)
            bar.set_description(f"report {key}")
            if progress:
                bar.write(f"[report] {key}: {title}")
            t0 = time.perf_counter()
            expected = expected_seconds("report", [key], plan[key], info.device).seconds
            beat = Heartbeat(key, expected, bar.write if progress else print)
            try:
                with use_compute_threads(), beat:
                    body = mod.run(ctx)
            except KeyboardInterrupt:
                interrupted = title
                raise
            except Exception:
                failures.append(title)
                body = f"**This section failed:**\n\n```\n{traceback.format_exc()}\n```\n"
            dt = time.perf_counter() - t0
            done.append((key, title, dt, plan[key]))
            bodies.append(f"## {title}\n\n{body.strip()}\n\n_Section time: {dt:.1f} s ({plan[key]} sizes)._\n")
            bar.update(1)
            _bar_left(bar, keys[len(done):], plan, info)
            _write_atomic(path, _assemble(stamp, head, bodies, ctx, done, mods, keys, None, time.perf_counter() - t_start, info))
    except KeyboardInterrupt:
        bar.close()
        _write_atomic(path, _assemble(stamp, head, bodies, ctx, done, mods, keys, interrupted or "(between sections)",
                                      time.perf_counter() - t_start, info))
        _write_timings(out, done, info)
        raise ReportInterrupted(path) from None
    finally:
        if not progress:
            if quiet_before is None:
                os.environ.pop("CODEX_LAB_PROGRESS", None)
            else:
                os.environ["CODEX_LAB_PROGRESS"] = quiet_before
    bar.close()
    _write_timings(out, done, info)
    if failures:
        raise RuntimeError(f"report written to {path}, but these sections failed: {failures}")
    return path


class Heartbeat:
    """While a section runs past ``first_s`` (20 s), a line every ``every_s`` seconds: elapsed
    against expected, the load average, and "this machine is busier than expected" when the
    section overruns on a loaded machine, so a long section never looks frozen."""

    def __init__(self, key: str, expected_s: float | None, write: Any, *, first_s: float = 20.0,
                 every_s: float = 20.0) -> None:
        self.key, self.expected_s, self.write = key, expected_s, write
        self.first_s, self.every_s = first_s, every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lines: list[str] = []

    def line(self, elapsed: float) -> str:
        """The progress line after ``elapsed`` seconds."""
        cores = os.cpu_count() or 1
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        exp = f"expected ~{format_seconds(self.expected_s)}" if self.expected_s else "no recorded time"
        text = f"[report] {self.key}: still running, {format_seconds(elapsed)} elapsed ({exp}; load average {load:.1f} on {cores} cores)"
        if self.expected_s and elapsed > self.expected_s:
            busy = load > cores
            text += ("; this machine is busier than expected" if busy else
                     "; past the recorded time on a machine that is not busy: slower hardware, or a larger size")
        return text

    def _run(self) -> None:
        t0 = time.perf_counter()
        wait = self.first_s
        while not self._stop.wait(wait):
            msg = self.line(time.perf_counter() - t0)
            self.lines.append(msg)
            self.write(msg)
            wait = self.every_s

    def __enter__(self) -> "Heartbeat":
        self._thread = threading.Thread(target=self._run, name=f"report-heartbeat-{self.key}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def _section_bar(keys: list[str], plan: dict[str, str], info: Mode, enabled: bool) -> Any:
    """One bar over the sections; its postfix carries the expected time left (recorded timings)."""
    bar = progress(total=len(keys), desc="report", enabled=enabled, unit="section", leave=True)
    _bar_left(bar, keys, plan, info)
    return bar


def _bar_left(bar: Any, keys: list[str], plan: dict[str, str], info: Mode) -> None:
    secs, _ = plan_estimate({k: plan[k] for k in keys}, info.device)
    bar.set_postfix_str(f"expected left: {format_seconds(secs) if secs is not None else 'unknown'}" if keys else "done")


# Where each lesson's claims sit in the article (SEED.md sections).
SEED_SECTION = {
    "00": "set-up", "01": "1. sparse attention", "02": "1. sparse attention", "03": "3. inference acceleration",
    "04": "3. inference acceleration", "05": "2. multi-task fine-tuning", "06": "3. inference acceleration",
    "07": "4. monitoring and rollback", "08": "all (capstone)",
}


SHORT = 120  # characters of the measured figure a table row shows; the whole text follows in its details


def short_measured(text: str, limit: int = SHORT) -> str:
    """The head of a claim's measured text for one table row: cut at the last clause boundary
    ("; ", ". ", ", ") before ``limit`` characters, marked with an ellipsis when cut."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    cut = max(head.rfind(sep) for sep in ("; ", ". ", ", "))
    return (head[:cut] if cut > limit // 3 else head.rstrip()) + " ..."


def claims_table(claims: Sequence[dict[str, str]]) -> str:
    """Every recorded claim, one short row each (article section, lesson, claim, verdict, the
    head of the measured figure), ordered by the article's section; then, per claim, the whole
    measured text and the arms' training states in a collapsible block."""
    rows = sorted(claims, key=lambda c: (SEED_SECTION.get(c["lesson"], "~"), c["lesson"]))
    table = ["| article section | lesson | seed claim | verdict | measured (head; details below) |", "|---|---|---|---|---|"]
    table += [f"| {SEED_SECTION.get(c['lesson'], '?')} | {c['lesson']} | {c['claim']} | {c['verdict']} | "
              f"{short_measured(c['measured'])} |" for c in rows]
    details = [f"<details><summary>{c['lesson']}: {c['claim']}</summary>\n\n{c['measured']}\n\nTraining states: "
               f"{c.get('states', 'n/a')}\n\n</details>" for c in rows]
    return "\n".join(table) + "\n\n" + "\n".join(details)


def _assemble(stamp: str, head: list[str], bodies: list[str], ctx: ReportContext, done: list[tuple[str, str, float, str]],
              mods: Sequence[Any], keys: list[str], interrupted: str | None, total: float, info: Mode) -> str:
    """The whole Markdown text from what has run so far."""
    parts = [f"# codex-lab report\n\nGenerated {stamp} UTC.\n\n" + "\n".join(f"- {h}" for h in head) + "\n"]
    finished = {k for k, *_ in done}
    pending = [(k, getattr(m, "TITLE", m.__name__)) for m, k in zip(mods, keys) if k not in finished]
    if pending:
        state = f"**Interrupted** during `{interrupted}`" if interrupted else "**In progress**"
        parts.append(f"{state}: {len(done)} of {len(keys)} sections finished "
                     f"({', '.join(k for k, *_ in done) or 'none'}); not run: "
                     + ", ".join(f"{k} ({t})" for k, t in pending) + ".\n")
    parts += bodies
    if ctx.claims:
        parts.append("## Seed claims and verdicts\n\n" + claims_table(ctx.claims) + "\n")
    if ctx.measured:
        parts.append("## Measured (definitions the course checks, not verdicts)\n\n"
                     + "\n".join(f"- lesson {m['lesson']}: {m['what']}: {m['figure']}" for m in ctx.measured) + "\n")
    if ctx.goals:
        rows = ["| lesson | performance goal | measured | goal | met | how (sizes, command) |", "|---|---|---|---|---|---|"]
        rows += [f"| {g['lesson']} | {g['goal']} | {g['measured']:.2f}x | {g['target']:.2f}x | {'yes' if g['met'] else 'no'} | {g['how']} |"
                 for g in ctx.goals]
        parts.append("## Performance goals (ratios measured in this run, on this machine)\n\n" + "\n".join(rows) + "\n")
    env = describe_environment(info)
    parts.append("## Run\n\n" + "\n".join(f"- {k}: {v}" for k, v in env.items())
                 + "\n" + "\n".join(f"- section `{t}`: {d:.1f} s ({m} sizes)" for _, t, d, m in done)
                 + (f"\n- skipped (not run): {', '.join(k for k, _ in pending)}" if pending else "")
                 + f"\n- total: {total:.1f} s\n")
    return "\n".join(parts)


def _write_timings(out: Path, done: list[tuple[str, str, float, str]], info: Mode) -> None:
    """``timings.json`` beside the report: seconds per section, to update ``assets/timings.json``."""
    data = {"device": info.device, "matmul_ms": round(calibrate_ms(), 4),
            "sections": {k: {"seconds": round(d, 1), "mode": m} for k, _, d, m in done}}
    _write_atomic(out / "timings.json", json.dumps(data, indent=2) + "\n")


__all__ = ["ReportContext", "ReportInterrupted", "discover_sections", "plan_modes", "run_report",
    "section_key", "select_sections"]
