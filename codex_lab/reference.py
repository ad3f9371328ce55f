"""Reference runs: long experiments at larger sizes, run once with the project's own commands,
shipped as data with their provenance and drawn beside a learner's run, labelled as reference.

A reference run is a set of *units* (one arm at one seed, say), each a few minutes to hours
of training. :class:`ResumableRun` keeps every finished unit in a JSON file, written
atomically after each one, so a run that is stopped (a session that ends, Ctrl-C, a crash)
loses at most the unit in progress and ``run()`` called again skips what is done.
:func:`save_reference` writes the finished data with its provenance (commit, command,
machine, date, duration) into ``codex_lab/assets/reference/<name>.json``;
:func:`load_reference` reads it back and :func:`draw_reference` draws its curves, dashed and
labelled "reference", on a learner's plot.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from codex_lab.errors import InputError
from codex_lab.stats import NOT_LEARNED

REFERENCE_DIR = Path(__file__).parent / "assets" / "reference"
REQUIRED_PROVENANCE = ("commit", "command", "machine", "date", "duration_s", "mode")


def _commit() -> str:
    """The checkout's commit (with ``+dirty`` when it has changes), or ``"unknown"`` outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def machine() -> str:
    """One line naming the machine: CPU model and cores, or the GPU."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (CUDA), {os.cpu_count()} CPU cores"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} CPU cores, torch {torch.__version__}, {torch.get_num_threads()} math thread(s)"


def provenance(command: str, duration_s: float, mode: str, **extra: Any) -> dict[str, Any]:
    """The provenance record of a reference run: commit, command, machine, date, duration, mode."""
    return {"commit": _commit(), "command": command, "machine": machine(),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "duration_s": round(float(duration_s), 1),
            "mode": mode, **extra}


def shown_path(path: str | Path, root: str | Path) -> str:
    """``path`` as a shipped provenance shows it: relative to ``root`` (the repository) when inside
    it, else with the home folder written ``~`` (no user's home path is shipped)."""
    p, r = Path(path).resolve(), Path(root).resolve()
    return str(p.relative_to(r)) if p.is_relative_to(r) else str(p).replace(str(Path.home()), "~", 1)


class ResumableRun:
    """Units of a long run, each kept in ``path`` (JSON) as soon as it finishes.

    ``run(key, fn)`` returns the stored result of ``key`` if a previous call finished it,
    else calls ``fn()`` (which returns JSON-serialisable data), stores the result with its
    seconds, and returns it. ``config`` is stored with the first unit and must be equal on a
    resume (a changed size would mix two experiments in one file).
    """

    def __init__(self, path: str | Path, config: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.config = json.loads(json.dumps(dict(config)))  # normalised (tuples -> lists)
        if self.path.exists():
            try:
                state = json.loads(self.path.read_text())
            except (OSError, ValueError) as exc:
                raise InputError(f"{self.path}: not a readable run state ({exc}); delete it to start over") from None
            if state.get("config") != self.config:
                raise InputError(f"{self.path}: was started with another configuration ({state.get('config')}); "
                                 "delete it, or resume with the same sizes")
            self.state = state
        else:
            # the code that runs the first unit is the code the provenance names (a later commit may land mid-run)
            self.state = {"config": self.config, "units": {}, "started": time.time(), "commit": _commit()}

    @property
    def done(self) -> dict[str, Any]:
        """Finished units: key -> {"result": ..., "seconds": ...}."""
        return self.state["units"]

    @property
    def commit(self) -> str:
        """The commit checked out when the run's first unit started (``"unknown"`` for older state files)."""
        return str(self.state.get("commit", "unknown"))

    def seconds(self) -> float:
        """Compute time of the finished units (what the run cost, whatever the pauses between sessions)."""
        return float(sum(u["seconds"] for u in self.done.values()))

    def run(self, key: str, fn: Callable[[], Any]) -> Any:
        """The result of unit ``key``, computed now only if no earlier call finished it."""
        if key in self.done:
            return self.done[key]["result"]
        t0 = time.perf_counter()
        result = fn()
        self.store(key, result, time.perf_counter() - t0)
        return result

    def store(self, key: str, result: Any, seconds: float) -> None:
        """Keep ``result`` of unit ``key`` computed elsewhere (a worker process) in ``seconds``, written at once."""
        self.done[key] = {"result": result, "seconds": round(float(seconds), 2)}
        self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.path)  # atomic: a kill between units never leaves half a file


def save_reference(name: str, data: Mapping[str, Any], prov: Mapping[str, Any], *,
                   directory: str | Path = REFERENCE_DIR) -> Path:
    """Write reference data with its provenance to ``<directory>/<name>.json`` (atomically)."""
    missing = [k for k in REQUIRED_PROVENANCE if k not in prov]
    if missing:
        raise InputError(f"reference {name!r}: provenance lacks {missing}; build it with codex_lab.reference.provenance")
    path = Path(directory) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"provenance": dict(prov), "data": dict(data)}, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def load_reference(name: str, *, directory: str | Path = REFERENCE_DIR) -> dict[str, Any] | None:
    """The shipped reference ``name`` (``{"provenance": ..., "data": ...}``), or None when none is shipped."""
    path = Path(directory) / f"{name}.json"
    if not path.is_file():
        return None
    ref = json.loads(path.read_text())
    missing = [k for k in REQUIRED_PROVENANCE if k not in ref.get("provenance", {})]
    if missing:
        raise InputError(f"{path}: reference data without provenance {missing}; regenerate it with its script")
    return ref


def describe_provenance(ref: Mapping[str, Any]) -> str:
    """One line for a plot caption or a report: what ran, where, when, how long."""
    p = ref["provenance"]
    hours = float(p["duration_s"]) / 3600
    took = f"{hours:.1f} h" if hours >= 1 else f"{float(p['duration_s']) / 60:.0f} min"
    return (f"reference run ({p['mode']} mode): `{p['command']}` at commit {str(p['commit'])[:12]} on {p['machine']}, "
            f"{p['date']}, {took} of compute")


def draw_reference(ax: Any, curves: Mapping[str, Sequence[Sequence[Sequence[float]]]], *, colors: Mapping[str, str] | None = None,
                   label: str = "reference") -> None:
    """Draw reference curves on ``ax``: per arm, the mean over seeds, dashed, labelled
    ``"<arm> (reference)"``. ``curves``: arm -> one ``[(step, value), ...]`` list per seed."""
    for i, (arm, seeds) in enumerate(curves.items()):
        if not seeds:
            continue
        steps = [p[0] for p in seeds[0]]
        mean = [sum(s[j][1] for s in seeds) / len(seeds) for j in range(len(steps))]
        color = (colors or {}).get(arm, f"C{i}")
        ax.plot(steps, mean, ls="--", lw=1.2, color=color, alpha=0.7, label=f"{arm} ({label})")


def rejudge(data: Mapping[str, Any]) -> list[Any] | None:
    """Every arm's training state, judged again from the shipped curves by today's rule
    (:func:`codex_lab.training_state.training_state`, with the metric's direction, ``min_change``
    and chance recorded in ``data["metric"]``, and the learning rate at each evaluation where
    ``data["rates"]`` records it); None when the data records no metric. Curves the data names
    in ``data["unjudged"]`` are drawn, not judged: a fixed-budget phase (a pre-training) that an
    arm continues to its own plateau is not an arm a verdict needs at one."""
    from codex_lab.training_state import training_state

    m = data.get("metric")
    if not m or "curves" not in data:
        return None
    rates = data.get("rates") or {}  # the learning rate at each evaluation, where the run recorded it
    skip = set(data.get("unjudged") or ())
    unknown = skip - set(data["curves"])
    if unknown:
        raise InputError(f"the reference names unjudged curves it does not hold: {sorted(unknown)}; regenerate it")
    return [training_state(c, higher_is_better=bool(m["higher_is_better"]), min_change=float(m["min_change"]),
                           chance=m.get("chance"), arm=arm, rates=rates.get(arm))
            for arm, c in data["curves"].items() if arm not in skip]


def standing(data: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether a reference's verdicts stand: every judged arm at its plateau by today's rule
    (:func:`rejudge`) and no arm the budget-extension check found still learning. Returns
    (stands, why not: the arms that block it, "" when it stands)."""
    states = rejudge(data) or []
    failed = [s.arm for s in states if s.state == NOT_LEARNED]
    moving = [s.arm for s in states if not s.trained and s.state != NOT_LEARNED]
    unconfirmed = [a for a, e in (data.get("extension") or {}).items() if e.get("confirmed") is False]
    why = "; ".join(x for x in (f"did not learn the task: {', '.join(failed)}" if failed else "",
                                f"not at a plateau: {', '.join(moving)}" if moving else "",
                                f"still learning in the extension check: {', '.join(unconfirmed)}" if unconfirmed else "")
                    if x)
    return not why, why


def extension_lines(ext: Mapping[str, Mapping[str, Any]], min_change: float) -> list[str]:
    """One line per arm of a reference's budget-extension check (``data["extension"]``: per arm
    ``steps``/``extended_steps``, ``final``/``extended_final`` (mean over seeds), ``gain`` in the
    better direction, ``trained`` and ``confirmed``: True when the extension did not improve an arm
    called trained by ``min_change`` or more, False when it did, None for an arm not called trained)."""
    lines = []
    for arm, e in ext.items():
        what = (("confirmed: it had levelled off" if e["gain"] > -min_change else
                 "confirmed: the larger budget made it worse (past its plateau)") if e["confirmed"] else
                f"**not confirmed**: it gained {e['gain']:.4f} (>= {min_change:g}), still learning"
                ) if e["confirmed"] is not None else (
            "trained, no extension run (the arm stopped at its best checkpoint)" if e["trained"]
            else "not called trained: reported only")
        lines.append(f"- {arm}: {e['final']:.4f} at {e['steps']:g} steps, {e['extended_final']:.4f} at "
                     f"{e['extended_steps']:g} (gain {e['gain']:+.4f}); {what}")
    return lines


def article_reference_lines(section: str, *, directory: str | Path = REFERENCE_DIR) -> list[str]:
    """The shipped reference run of lesson ``section`` at the article's sizes
    (``scripts/reference_article.py``) as a Markdown block for the report, labelled as shipped:
    provenance, geometry, every arm's training state judged again from the shipped curves by
    today's rule, the results table and the verdicts as the run printed them. When today's rule
    finds an arm still moving, the block says that the shipped verdicts do not stand. When none
    is shipped, one line saying how to make it."""
    ref = load_reference(f"l{section}_article", directory=directory)
    command = f"python scripts/reference_article.py --section {section}"
    if ref is None:
        return [f"No reference run at the article's sizes is shipped for lesson {section}; `{command}` makes one "
                "(resumable, tens of minutes on 2 CPU cores).", ""]
    d = ref["data"]
    states = rejudge(d)
    head = ["### Reference run at the article's sizes (shipped, not this run)", "",
            f"{describe_provenance(ref)}. Geometry: {d['geometry']}. The lesson's own protocol and statistics at the "
            f"mechanism sizes the article names, with a model small enough for a CPU; rerun it with `{command}`.", ""]
    if states is None:
        return head + ["Training state of every arm, as the run judged it:", "", *[f"- {s}" for s in d["states"]], "",
                       *d["table"], "", *[f"- {k}: {v}" for k, v in d["verdicts"].items()], ""]
    failed = [s.arm for s in states if s.state == NOT_LEARNED]
    moving = [s.arm for s in states if not s.trained and s.state != NOT_LEARNED]
    ext = d.get("extension")
    unconfirmed = [a for a, e in (ext or {}).items() if e["confirmed"] is False]
    if moving or failed:
        why = [f"{', '.join(failed)}: {NOT_LEARNED} (its state above says why: a failed optimisation, which more "
               "steps do not settle; more seeds measure how often it happens)" if failed else "",
               f"{', '.join(moving)} {'has' if len(moving) == 1 else 'have'} not reached a plateau (`{command}` trains "
               "every arm to its own plateau at a held rate; raise its cap where an arm stopped at it)" if moving else ""]
        verdict_head = ("Verdicts as the run printed them. By today's rule " + "; ".join(w for w in why if w)
                        + (f"; and the budget-extension check found {', '.join(unconfirmed)} still learning, though the "
                           "rule as the run applied it called them trained" if unconfirmed else "")
                        + ". A verdict that compares any of these arms is a measurement of the run, **not a verdict** "
                          "(its line names its arms' states); one whose arms are all at a plateau stands:")
    elif unconfirmed:
        verdict_head = (f"Verdicts as the run printed them. The budget-extension check found {', '.join(unconfirmed)} "
                        "still learning, though the rule called every arm trained. A verdict that compares any of these "
                        "arms is a measurement of the run, **not a verdict** (its line names its arms); one whose arms "
                        "the check confirmed stands:")
    elif ext is None:
        verdict_head = ("Verdicts as the run printed them (every arm is at a plateau by today's rule; this run ships "
                        "no budget-extension check, so the plateaus are the rule's call alone):")
    else:
        verdict_head = ("Verdicts as the run printed them (they stand: every arm is at a plateau by today's rule, and "
                        "the budget-extension check confirmed each):")
    refuted = [a for a in unconfirmed if any(s.arm == a and s.trained for s in states)]
    # arms the run's own rule called trained that today's rule does not (the check judged them as the run did)
    demoted = [a for a, e in (ext or {}).items() if e.get("trained") and any(s.arm == a and not s.trained for s in states)]
    ext_lines = [] if ext is None else [
        "Budget-extension check (each arm's steps at the stopping point, then with the larger budget; gain in the "
        "better direction):", "",
        *extension_lines(ext, float(d["metric"]["min_change"])), "",
        *([f"The check refutes the rule here: it called {', '.join(refuted)} trained, and a larger budget on the same "
           "schedule still improved them by more than the claim's smallest change. A tail held flat at a decayed "
           "learning rate does not establish a plateau: where a live run judges its arms by the rule alone on such "
           "a schedule, its verdicts are measurements of its budget as well.", ""] if refuted else []),
        *([f"The check judged {', '.join(demoted)} as the run's rule did (trained); today's rule does not call "
           "them trained (each state above says why), so the check's lines are the run's, kept as evidence.", ""]
          if demoted else [])]
    return head + ["Training state of every arm, judged from the shipped curves by today's rule "
                   "(`codex_lab.training_state`):", "", *[f"- {s.describe()}" for s in states], "", *ext_lines,
                   *d["table"], "", verdict_head, "", *[f"- {k}: {v}" for k, v in d["verdicts"].items()], ""]


def plot_reference(name: str, *, ylabel: str | None = None, directory: str | Path = REFERENCE_DIR) -> Any:
    """A figure of the shipped reference ``name``'s held-out curves (mean over seeds, dashed,
    labelled "(reference)", titled with its date and commit), or None when none is shipped."""
    import matplotlib.pyplot as plt

    ref = load_reference(name, directory=directory)
    if ref is None:
        return None
    d, p = ref["data"], ref["provenance"]
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    draw_reference(ax, d["curves"])
    ax.set_xlabel(d.get("xlabel", "step"))
    ax.set_ylabel(ylabel or d.get("ylabel", "held-out value"))
    seeds = len(next(iter(d["curves"].values())))
    ax.set_title(f"shipped reference run {name} ({p['date'][:10]}, commit {str(p['commit'])[:7]}; mean of {seeds} "
                 "seeds)", fontsize=8)
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def article_reference_block(ctx: Any, section: str) -> list[str]:
    """For a report section: :func:`article_reference_lines` and, when shipped, the reference
    curves saved as a figure beside the live run's (``ctx.savefig``)."""
    lines = article_reference_lines(section)
    fig = plot_reference(f"l{section}_article")
    if fig is not None:
        lines += [ctx.savefig(fig, f"l{section}_article_reference"), ""]
    return lines
