"""Grade one submission in its own sandboxed child process (:func:`codex_lab.sandbox.run_python`).

Parent side (:func:`grade_isolated`): reads the submission (``.py`` percent source, or the
code cells of an ``.ipynb``), writes it with a task file (and copies of the hidden checks)
into the sandbox folder, and starts a fresh interpreter there: unprivileged uid, no
network, ``solutions/`` and the hidden-check folder hidden, memory/process/CPU limits,
capped output, the whole process tree killed at the end. The child (:func:`child_main`)
imports the checks, deletes the task and hidden files from disk, turns on the guard,
loads the submission and runs one exercise after another, each under a watchdog that ends
the process after ``timeout_s``. Progress comes back on stdout as lines tagged with a
per-run random token (the learner's own prints go to a capped sink, not to stdout).
When the child dies mid-exercise (timeout, ``os._exit``, too much output, a crash), that
exercise is scored ``error`` with a one-line reason and a fresh child grades the rest.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from codex_lab.course.checks import HIDDEN, Exercise, exercises_for, load_hidden
from codex_lab.course.outcome import ERROR, SUBMISSION_SUFFIXES, Result, lesson_of

ROOT = Path(__file__).resolve().parents[2]  # the repository (editable install)
STARTUP_S = 120.0  # importing torch and the checks, on a loaded machine
MEMORY_MB = 3072  # torch alone maps ~700 MiB of address space; the checks build small models
MAX_SUBMISSION_BYTES = 5 * 1024 * 1024
_BOOT = "from codex_lab.course.grade_runner import child_main\nchild_main()\n"


def exercises_of(lesson: str, hidden: str | Path | None = None) -> list[Exercise]:
    """Public exercises of ``lesson``, then the hidden ones from ``hidden`` (if given)."""
    exs = list(exercises_for(lesson))
    if hidden is not None:
        exs += [e for (les, _), e in load_hidden(hidden).items() if les == lesson]
    return exs


def submissions_in(folder: Path) -> list[Path]:
    """Every ``NN_*.py`` and ``NN_*.ipynb`` below ``folder``; of a jupytext pair, the ``.py``."""
    found = []
    for p in sorted(folder.rglob("[0-9][0-9]_*")):
        if p.suffix not in SUBMISSION_SUFFIXES or not p.is_file() or ".ipynb_checkpoints" in p.parts:
            continue
        if p.suffix == ".ipynb" and p.with_suffix(".py").is_file():
            continue
        found.append(p)
    return found


def notebook_code(text: str, name: str = "notebook") -> str:
    """The code cells of an ``.ipynb`` as percent-format Python (magics and shell lines commented out)."""
    nb = json.loads(text)
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError(f"{name} is not a Jupyter notebook (no cells list)")
    out = []
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        lines = [("# " + ln if ln.lstrip().startswith(("%", "!")) else ln) for ln in src.splitlines()]
        out.append("# %%\n" + "\n".join(lines) + "\n")
    return "\n".join(out)


def submission_text(path: Path) -> str:
    """The submission as Python source (reads ``.py``; converts ``.ipynb``)."""
    if path.stat().st_size > MAX_SUBMISSION_BYTES:
        raise ValueError(f"{path.name} is over {MAX_SUBMISSION_BYTES // 2**20} MiB")
    text = path.read_text(encoding="utf-8", errors="replace")
    return notebook_code(text, path.name) if path.suffix == ".ipynb" else text


def _code_lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def is_lesson_notebook(text: str, lesson: str) -> bool:
    """True when ``text`` is (the code of) the course's own lesson notebook ``notebooks/NN_*``."""
    mine = _code_lines(text)
    for nb in sorted((ROOT / "notebooks").glob(f"{lesson}_*")):
        try:
            other = submission_text(nb)
        except (OSError, ValueError):
            continue
        if _code_lines(other) == mine:
            return True
    return False


def _reason(res: Any, timeout_s: float) -> str:
    if res.truncated:
        return "the submission printed more than the output cap; stopped"
    if res.timed_out:
        return "the grading process ran past its time budget; stopped"
    last = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    tail = f": {last[-1][:200]}" if last else ""
    return f"the grading process ended (exit code {res.returncode}) while this ran, e.g. os._exit or a crash{tail}"


def grade_isolated(path: Path, hidden: str | Path | None = None, timeout_s: float = 30.0,
                   memory_mb: int = MEMORY_MB) -> list[Result]:
    """Grade one submission file in sandboxed children; see the module docstring."""
    from codex_lab.sandbox import run_python

    lesson = lesson_of(path)
    exs = exercises_of(lesson, hidden)
    if not exs:
        raise ValueError(f"lesson {lesson} has no graded exercises")
    keys = [(e.lesson, e.name, e.visibility) for e in exs]
    by_key = dict(zip(keys, exs))

    def err(key: tuple[str, str, str], msg: str) -> Result:
        e = by_key[key]
        return Result(e.lesson, e.name, ERROR, msg, 0, e.points, e.visibility)

    try:
        text = submission_text(path)
    except (OSError, ValueError, UnicodeError) as exc:
        return [err(k, f"could not read {path.name}: {type(exc).__name__}: {exc}") for k in keys]
    if is_lesson_notebook(text, lesson):
        return [err(k, "this is the course's lesson notebook, not an exercise submission: it earns nothing") for k in keys]
    sub_name = path.with_suffix(".py").name
    files: dict[str, str | bytes] = {sub_name: text}
    hide = [str(ROOT / "solutions")]
    if hidden is not None:
        hide.append(str(Path(hidden).resolve()))
        for p in sorted(Path(hidden).glob("*.py")):
            files[f"hidden/{p.name}"] = p.read_bytes()
    results: dict[tuple[str, str, str], Result] = {}
    todo = list(keys)
    for _ in range(len(keys) + 1):
        nonce = secrets.token_hex(16)
        task = {"nonce": nonce, "submission": sub_name, "lesson": lesson, "todo": todo,
                "hidden": hidden is not None, "timeout_s": timeout_s}
        res = run_python(_BOOT, timeout_s=STARTUP_S + timeout_s * len(todo), memory_mb=memory_mb, nproc=64,
                         max_output_bytes=2 * 1024 * 1024, files={**files, "task.json": json.dumps(task)},
                         hide=hide, guard=False, cpu_s=int(STARTUP_S + timeout_s * len(todo)) + 1)
        current, loading = None, False
        for line in res.stdout.splitlines():
            if not line.startswith(nonce + " "):
                continue
            _, kind, payload = line.split(" ", 2)
            data = json.loads(payload)
            if kind == "LOADING":
                loading = True
            elif kind == "BEGIN":
                current = tuple(data)
            elif kind in ("RESULT", "TIMEOUT") and tuple(data["key"]) in by_key:
                key = tuple(data["key"])
                if kind == "TIMEOUT":
                    results[key] = err(key, f"timed out after {timeout_s:g} s (an endless loop?)")
                else:
                    e = by_key[key]  # the parent's own maximum and visibility; points clamped to them
                    pts = max(0, min(int(data["points"]), e.points))
                    results[key] = Result(e.lesson, e.name, str(data["status"]), str(data["message"])[:2000], pts,
                                          e.points, e.visibility)
        todo = [k for k in todo if k not in results]
        if not todo:
            break
        reason = _reason(res, timeout_s)
        if current is not None:  # it died in (or right after) that exercise: charge it, grade the rest afresh
            if current in todo:
                results[current] = err(current, reason)
                todo.remove(current)
            continue
        where = "while loading the file" if loading else "before grading started"
        for k in todo:
            results[k] = err(k, f"{where}: {reason}")
        break
    for k in keys:  # the retries ran out (a child that keeps dying between exercises)
        results.setdefault(k, err(k, "the grading process kept ending between exercises; not graded"))
    return [results[k] for k in keys]


class _Sink:
    """A text stream that keeps at most ``cap`` characters (the learner's prints)."""

    def __init__(self, cap: int = 65536) -> None:
        self.cap, self.size = cap, 0

    def write(self, s: str) -> int:
        self.size += len(s)
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def child_main() -> None:
    """Sandbox side: run the task in ``task.json`` (cwd) and report on stdout; see the module docstring."""
    task = json.loads(Path("task.json").read_text())
    os.remove("task.json")
    nonce = task.pop("nonce")
    chan = os.dup(1)
    lock = threading.Lock()

    def emit(kind: str, payload: Any) -> None:
        with lock:
            os.write(chan, f"{nonce} {kind} {json.dumps(payload)}\n".encode())

    import torch  # noqa: F401  (warm: the checks and most submissions need it)

    from codex_lab.course.checks import load_lesson
    from codex_lab.course.exercises import load_definitions
    from codex_lab.course.outcome import run_check

    registry = {(les, n, e.visibility): e for (les, n), e in load_lesson(task["lesson"]).items()}
    if task["hidden"]:
        registry.update({(les, n, HIDDEN): e for (les, n), e in load_hidden("hidden").items()})
        shutil.rmtree("hidden")
    todo = [registry[tuple(k)] for k in task["todo"] if tuple(k) in registry]
    from codex_lab.sandbox.guard import install

    install(os.getcwd())
    sys.stdout = sys.stderr = _Sink()  # type: ignore[assignment]
    emit("LOADING", None)
    try:
        module = load_definitions(task["submission"])
    except BaseException as exc:  # noqa: BLE001 - a broken submission, whatever it raised
        msg = f"could not load {task['submission']}: {type(exc).__name__}: {exc}"
        for e in todo:
            emit("RESULT", {"key": [e.lesson, e.name, e.visibility], "status": ERROR, "message": msg, "points": 0})
        os._exit(0)
    for e in todo:
        key = [e.lesson, e.name, e.visibility]
        emit("BEGIN", key)

        def expire(key: list[str] = key) -> None:
            emit("TIMEOUT", {"key": key})
            os._exit(3)

        timer = threading.Timer(float(task["timeout_s"]), expire)
        timer.daemon = True
        timer.start()
        try:
            r = run_check(e, getattr(module, e.name, None))
        except BaseException as exc:  # noqa: BLE001 - e.g. KeyboardInterrupt raised by the submission
            r = Result(e.lesson, e.name, ERROR, f"{type(exc).__name__}: {exc}", 0, e.points, e.visibility)
        timer.cancel()
        emit("RESULT", {"key": key, **asdict(r)})
    os._exit(0)  # skip atexit handlers the submission may have registered
