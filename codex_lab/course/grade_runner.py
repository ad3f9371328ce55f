"""Grade one submission: a sandboxed run in which the checks and the learner's code live in
two different processes (:func:`codex_lab.sandbox.run_python`).

Parent side (:func:`grade_isolated`, trusted): reads the submission (``.py`` percent source,
or the code cells of an ``.ipynb``; a symlink out of its folder, an oversized or too deeply
nested file gets ``error`` rows, never an exception), and starts one sandboxed run with:
the submission text, the task, and copies of the lesson's checks, of the hidden checks and
of the real modules that hold the lesson's forbidden functions as files; the package it
shows is the *learner's view* (:mod:`codex_lab.course.learner_view`: those functions are
stubs, no lesson's ``checks.py``), mounted in place of the real package, which is not
mounted at all; hidden from it: the checkout (``.git``, ``solutions/``, tests, notebooks),
the folder of submissions and the hidden-check folder. A folder run gives each submission
its own run, which holds that submission's text alone.

In the sandbox, the *checker* (:mod:`codex_lab.course.checker`) reads those files into
memory and deletes them (the real modules first, before anything imports the package),
makes itself non-dumpable (so a process of the same uid cannot read its memory or its file
descriptors), starts the *submission's process* (:mod:`codex_lab.course.submission_server`:
the learner's view only, library built-ins that do an exercise's job replaced before the
file loads, the guard on, an audit hook as a second line) and runs each check with a proxy
for the learner's function: arguments go as data, values come back as data
(:mod:`codex_lab.course.wire`). Only the checker writes results, on stdout, tagged with a
per-run random token. Public exercises are graded by one submission process, hidden ones by
a fresh one afterwards (nothing a hidden check showed can reach public feedback).

When the checker itself dies mid-exercise, that exercise is scored ``error`` with a one-line
reason and a fresh run grades the rest.

The results come back one bounded frame per exercise (:func:`parse_results`): an oversize,
cut or malformed frame costs its own exercise, never the decoding of the frames that arrived
whole, and the run's overall output cap (:data:`MAX_OUTPUT_BYTES`) still bounds a flood.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from codex_lab.course.checker import MAX_RESULT_BYTES, SWITCHES, oversize
from codex_lab.course.checks import Exercise, exercises_for, load_hidden
from codex_lab.course.outcome import (ERROR, FAILED, MISSING, NOT_DONE, PARTIAL, PASSED, SUBMISSION_SUFFIXES, Result,
                                      lesson_of)

ROOT = Path(__file__).resolve().parents[2]  # the repository (editable install)
PKG = Path(__file__).resolve().parents[1]  # codex_lab/
STARTUP_S = 120.0  # importing torch and the checks, twice (checker and submission), on a loaded machine
CHECK_S = 600.0  # the checker's own work per exercise (lesson 08's scorecard: 295 s measured under heavy load)
MEMORY_MB = 3072  # per process: torch alone maps ~700 MiB of address space; the checks build small models
MAX_SUBMISSION_BYTES = 5 * 1024 * 1024
MAX_NESTING = 100  # arrays/objects deep in a notebook's JSON (nbformat is about 5); deeper code fails to parse in the run
MAX_OUTPUT_BYTES = 2 * 1024 * 1024  # the whole run's stdout: bounds a flood; each result frame is bounded on its own too
MAX_MESSAGE_CHARS = 2000  # of a result's message, kept in the report
_STATUSES = frozenset({PASSED, PARTIAL, NOT_DONE, FAILED, ERROR, MISSING})
# First the real modules, from memory (loaded from the view's file: importing codex_lab itself
# would import some of them from the view), then the checker.
# the checker's switches (codex_lab.course.checker.SWITCHES: no native kernel, no compile, no
# cache of compiled code) are set before anything imports torch or codex_lab, so what torch reads
# at import already has them; checker.isolate() then makes the private folders
_BOOT = ("import os as _os\n"
         "_os.environ.update({switches!r})\n"
         "import importlib.util as _u\n"
         "_spec = _u.spec_from_file_location('codex_lab_real_modules', {view!r} + '/codex_lab/course/learner_view.py')\n"
         "_m = _u.module_from_spec(_spec)\n_spec.loader.exec_module(_m)\n_m.install_real()\ndel _u, _spec, _m\n"
         "from codex_lab.course.checker import child_main\nchild_main()\n")


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


def json_nesting(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text`` (brackets inside strings ignored)."""
    depth = top = 0
    in_str = escape = False
    for ch in text:
        if in_str:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            top = max(top, depth)
        elif ch in "]}":
            depth -= 1
    return top


def notebook_code(text: str, name: str = "notebook") -> str:
    """The code cells of an ``.ipynb`` as percent-format Python (magics and shell lines commented out)."""
    if json_nesting(text) > MAX_NESTING:
        raise ValueError(f"{name} nests JSON more than {MAX_NESTING} levels deep; a notebook is about 5 deep")
    nb = json.loads(text)
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError(f"{name} is not a Jupyter notebook (no cells list)")
    out = []
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(str(s) for s in src) if isinstance(src, list) else str(src)
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


def outside(path: Path, folder: Path) -> bool:
    """True when ``path`` (symlinks resolved) is not inside ``folder`` (resolved)."""
    real, root = path.resolve(), folder.resolve()
    return real != root and root not in real.parents


def _hidden_paths(extra: list[Path], view: Path | None = None) -> list[str]:
    """What the sandbox must not show: the checkout beside the package, and every checks.py."""
    import sys

    keep = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.executable).resolve(), PKG}
    if view is not None:
        keep.add(view.resolve())
    # a folder holding the interpreter or the package stays (hiding it would hide them too)
    hide = [p for p in list(ROOT.iterdir()) + extra if not any(p.resolve() == k or p.resolve() in k.parents for k in keep)]
    hide += sorted(PKG.glob("lessons/*/checks.py")) + sorted(PKG.glob("lessons/*/__pycache__/checks.*"))
    return sorted({str(p) for p in hide if p.exists()})


def _checks_files(lesson: str, hidden: str | Path | None) -> dict[str, str | bytes]:
    """Copies of the lesson's checks (public, by module name) and of the hidden checks."""
    files: dict[str, str | bytes] = {}
    for p in sorted(PKG.glob(f"lessons/l{lesson}_*/checks.py")):
        files[f"checks/codex_lab.lessons.{p.parent.name}.checks.py"] = p.read_bytes()
    if hidden is not None:
        for p in sorted(Path(hidden).glob("*.py")):
            files[f"hidden/{p.name}"] = p.read_bytes()
    return files


Key = tuple[str, str, str]


def _frame_key(value: Any, by_key: dict[Key, Exercise]) -> Key | None:
    """``value`` (a frame's key list) as a key of this submission's exercises, or None."""
    if type(value) is not list or len(value) != 3 or not all(type(v) is str for v in value):
        return None
    key = (value[0], value[1], value[2])
    return key if key in by_key else None


def parse_results(stdout: str, nonce: str, by_key: dict[Key, Exercise]) -> tuple[dict[Key, Result], Key | None]:
    """The results in the checker's output: (results by key, the exercise that began last and
    whose result did not arrive, or None).

    Every ``NONCE RESULT LENGTH JSON`` frame (:func:`codex_lab.course.checker.frame`) is read
    on its own, so a bad one costs only its exercise (the one its key names, else the one its
    ``BEGIN`` frame named): a frame over :data:`~codex_lab.course.checker.MAX_RESULT_BYTES`
    gets ``error`` with the "answer over N bytes" reason, a malformed one (bad JSON, wrong
    fields, length not as declared) ``error`` with "malformed result". A frame shorter than
    its declared length was cut where the run stopped (its output cap, its time, a crash): it
    is left out, so the caller charges that exercise (the one begun last) with the run's
    reason and grades the rest afresh. Lines without the run's nonce are ignored (only the
    checker knows it). Points are clamped to the parent's own maximum, and the maximum and
    visibility are the parent's, whatever a frame says.
    """
    results: dict[Key, Result] = {}
    current: Key | None = None

    def err(key: Key, msg: str) -> None:
        e = by_key[key]
        results[key] = Result(e.lesson, e.name, ERROR, msg, 0, e.points, e.visibility)

    for line in stdout.split("\n"):  # not splitlines(): only "\n" ends a frame
        if not line.startswith(nonce + " "):
            continue
        parts = line.split(" ", 3)
        kind = parts[1] if len(parts) > 1 else ""
        length = parts[2] if len(parts) == 4 else ""
        declared = int(length) if length.isascii() and length.isdigit() and len(length) <= 18 else None
        body = parts[3] if len(parts) == 4 else ""
        size = len(body.encode("utf-8", "replace"))
        if kind == "BEGIN":
            try:
                current = _frame_key(json.loads(body), by_key) if declared == size else None
            except (ValueError, RecursionError):
                current = None  # (the checker writes these itself: never so in practice)
            continue
        if kind != "RESULT":
            continue
        if max(declared or 0, size) > MAX_RESULT_BYTES:  # refused unread, whatever it holds
            if current is not None:  # its key is inside the refused part: the exercise that began last
                err(current, oversize(max(declared or 0, size)))
            current = None
            continue
        if declared is not None and size < declared:
            continue  # cut: the caller charges `current` with the reason the run stopped
        data: Any = None
        if declared == size:
            try:
                data = json.loads(body)
            except (ValueError, RecursionError):
                data = None
        key = _frame_key(data.get("key"), by_key) if type(data) is dict else None
        target, current = key or current, None  # a frame answers the BEGIN before it, once
        if target is None:
            continue
        status, message, points = (data.get("status"), data.get("message"), data.get("points")) \
            if type(data) is dict else (None, None, None)
        if key is None or status not in _STATUSES or type(message) is not str or type(points) is not int:
            err(target, f"malformed result from the grading process (a frame of {size} bytes that does not read as "
                        "this exercise's result); not graded")
            continue
        e = by_key[key]  # the parent's own maximum and visibility; points clamped to them
        results[key] = Result(e.lesson, e.name, status, message[:MAX_MESSAGE_CHARS], max(0, min(points, e.points)),
                              e.points, e.visibility)
    return results, current


def _reason(res: Any) -> str:
    if res.truncated:
        return "the grading process printed more than the output cap; stopped"
    if res.timed_out:
        return "the grading process ran past its time budget; stopped"
    last = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    tail = f": {last[-1][:200]}" if last else ""
    return f"the grading process ended (exit code {res.returncode}) while this ran{tail}"


def grade_isolated(path: Path, hidden: str | Path | None = None, timeout_s: float = 30.0,
                   memory_mb: int = MEMORY_MB, folder: Path | None = None) -> list[Result]:
    """Grade one submission file; see the module docstring. ``folder``: the submissions'
    root in a folder run (hidden from the sandbox; the file must lie inside it)."""
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

    if outside(path, path.parent):
        return [err(k, f"{path.name} is a link to a file outside its own folder: not graded (submit the file itself)")
                for k in keys]
    if not path.is_file():
        return [err(k, f"{path.name} is not a regular file: not graded") for k in keys]
    try:
        text = submission_text(path)
        if is_lesson_notebook(text, lesson):
            return [err(k, "this is the course's lesson notebook, not an exercise submission: it earns nothing") for k in keys]
    except (OSError, ValueError, UnicodeError, RecursionError, MemoryError) as exc:
        return [err(k, f"could not read {path.name}: {type(exc).__name__}: {exc}"[:500]) for k in keys]
    sub_name = path.with_suffix(".py").name
    files: dict[str, str | bytes] = {sub_name: text, **_checks_files(lesson, hidden)}
    extra = [path.parent.resolve(), path.resolve()] + ([folder.resolve()] if folder is not None else [])
    if hidden is not None:
        extra.append(Path(hidden).resolve())
    forbid = {vis: sorted({f for e in exs if e.visibility == vis for f in e.forbid}) for vis in ("public", "hidden")}
    from codex_lab.course.learner_view import real_files, view_for

    every = forbid["public"] + forbid["hidden"]
    try:  # the package the submission's process sees: the lesson's forbidden functions absent
        view = view_for(every)
        files.update(real_files(every))
    except (OSError, ValueError, SyntaxError) as exc:
        return [err(k, f"not graded: the learner's view of the package could not be built: {exc}"[:500]) for k in keys]
    hide = _hidden_paths(extra, view)
    results: dict[tuple[str, str, str], Result] = {}
    todo = list(keys)
    for _ in range(len(keys) + 1):
        nonce = secrets.token_hex(16)
        task = {"nonce": nonce, "submission": sub_name, "lesson": lesson, "todo": todo, "timeout_s": timeout_s,
                "forbid": forbid, "check_s": CHECK_S, "startup_s": STARTUP_S, "view": str(view)}
        budget = STARTUP_S * 2 + (timeout_s + CHECK_S) * len(todo)
        res = run_python(_BOOT.format(view=str(view), switches=SWITCHES), timeout_s=budget, memory_mb=memory_mb, nproc=128,
                         max_output_bytes=MAX_OUTPUT_BYTES, files={**files, "task.json": json.dumps(task)}, hide=hide,
                         guard=False, cpu_s=int(budget) + 1, package=str(view))
        got, current = parse_results(res.stdout, nonce, by_key)
        results.update({k: r for k, r in got.items() if k in todo})
        before, todo = len(todo), [k for k in todo if k not in results]
        if not todo:
            break
        reason = _reason(res)
        if current is not None and current in todo:  # it died in that exercise: charge it, grade the rest afresh
            results[current] = err(current, reason)
            todo.remove(current)
            continue
        if len(todo) < before:  # it stopped after results of this run (one refused, say): the rest afresh
            continue
        for k in todo:
            results[k] = err(k, f"before grading started: {reason}")
        break
    for k in keys:  # the retries ran out
        results.setdefault(k, err(k, "the grading process kept ending between exercises; not graded"))
    return [results[k] for k in keys]
