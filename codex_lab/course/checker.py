"""The checker: the sandboxed process that runs the checks and writes the results
(see :mod:`codex_lab.course.grade_runner`). It never imports the submission: the learner's
functions are proxies to the submission's own process (:mod:`codex_lab.course.remote`).
The sandbox shows it the learner's view of the package; the real modules the view changed
(its oracles) were read into its memory and deleted before anything else ran
(:func:`codex_lab.course.learner_view.install_real`), and the submission's process starts
only after that, with the view alone.

Results go to the parent on stdout, one *frame* per line: ``NONCE KIND LENGTH JSON``, where
``LENGTH`` is the byte length of the (ASCII) JSON body. Each exercise's ``RESULT`` frame is
bounded on its own (:data:`MAX_RESULT_BYTES`): a result that would be larger (a check's
message quoting a huge answer) is replaced here by an ``error`` row saying so, and the parent
(:func:`codex_lab.course.grade_runner.parse_results`) refuses an oversize, cut or malformed
frame for that exercise alone, so one exercise's output can never cost the others theirs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import types
from dataclasses import asdict
from pathlib import Path
from typing import Any

from codex_lab.course import wire
from codex_lab.course.outcome import ERROR, Result

#: The most bytes one exercise's ``RESULT`` frame body may have. A check's message is at
#: most a few hundred characters and the parent shows 2,000 of them; 64 KiB is far above
#: that, and 32 such frames still fit in the run's 2 MiB output cap
#: (:data:`codex_lab.course.grade_runner.MAX_OUTPUT_BYTES`), so a lesson's results always fit.
MAX_RESULT_BYTES = 64 * 1024


def frame(nonce: str, kind: str, payload: Any) -> bytes:
    """One line of the results channel: ``NONCE KIND LENGTH JSON`` (see the module docstring).
    The JSON is ASCII (``ensure_ascii``: no raw newline, bytes == characters), so ``LENGTH``
    lets the reader tell a whole frame from one the output cap cut."""
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=True)
    return f"{nonce} {kind} {len(body)} {body}\n".encode("ascii")


def oversize(size: int | None = None, head: str = "") -> str:
    """The reason given for an exercise whose result frame is over :data:`MAX_RESULT_BYTES`."""
    got = f" ({size:,} bytes)" if size is not None else ""
    msg = (f"answer over {MAX_RESULT_BYTES} bytes: this exercise's result{got} is larger than the grader reports "
           "for one exercise (a check's message quoting a huge value the function returned?); not graded")
    return msg + (f". It began: {head[:300]}" if head else "")


def result_frame(nonce: str, key: tuple[str, str, str] | list[str], r: Result) -> bytes:
    """The ``RESULT`` frame of exercise ``key``; over :data:`MAX_RESULT_BYTES`, an ``error``
    frame with 0 points and the :func:`oversize` reason instead (why: a frame over the
    run's output cap would stop the run and cost every exercise after this one)."""
    payload = {"key": list(key), **asdict(r)}
    size = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=True))
    if size > MAX_RESULT_BYTES:
        payload = {"key": list(key), **asdict(Result(r.lesson, r.name, ERROR, oversize(size, r.message), 0,
                                                     r.max_points, r.visibility))}
    return frame(nonce, "RESULT", payload)


def _private() -> None:
    """Linux: make this process non-dumpable, so a process of the same uid (the submission's)
    can neither ptrace it nor open its /proc/PID/mem, environ or fd entries."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4


def _read_folder(name: str) -> dict[str, str]:
    folder = Path(name)
    if not folder.is_dir():
        return {}
    out = {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.py"))}
    shutil.rmtree(folder)
    return out


def _load_checks(sources: dict[str, str], pkg_root: Path) -> None:
    """Import each lesson checks module from its copy (the real file is hidden in the sandbox)."""
    import importlib

    for fname, text in sources.items():
        mod = fname[: -len(".py")]
        parent = mod.rpartition(".")[0]
        importlib.import_module(parent)
        module = types.ModuleType(mod)
        module.__file__ = str(pkg_root.joinpath(*mod.split(".")[1:])) + ".py"  # the real path: tracebacks, forbid
        module.__package__ = parent
        sys.modules[mod] = module
        exec(compile(text, module.__file__, "exec"), module.__dict__)


def _load_hidden(sources: dict[str, str]) -> dict[tuple[str, str], Any]:
    from codex_lab.course import checks

    reg: dict[tuple[str, str], Any] = {}
    checks._target.append(reg)
    checks._visibility.append(checks.HIDDEN)
    try:
        for i, (fname, text) in enumerate(sources.items()):
            name = f"codex_lab_hidden_checks_{i}_{fname[:-3]}"
            module = types.ModuleType(name)
            module.__file__ = f"hidden/{fname}"
            sys.modules[name] = module
            exec(compile(text, module.__file__, "exec"), module.__dict__)
    finally:
        checks._target.pop()
        checks._visibility.pop()
    return reg


def child_main() -> None:
    """Run ``task.json`` (cwd); report on stdout as ``NONCE KIND JSON`` lines."""
    task = json.loads(Path("task.json").read_text())
    os.remove("task.json")
    nonce = task.pop("nonce")
    checks_src, hidden_src = _read_folder("checks"), _read_folder("hidden")
    sub_name = task["submission"]
    sub_text = Path(sub_name).read_text(encoding="utf-8")
    os.remove(sub_name)
    _private()
    # the classes the submission's answers may name, loaded now from the view (before the
    # submission's process exists): decoding its answers looks them up and never imports
    wire.preload()
    chan = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # the checks' own prints must not mix with the results
    lock = threading.Lock()

    def emit(data: bytes) -> None:
        with lock:
            view = memoryview(data)
            while view:  # a short write must not leave half a frame for the next one to follow
                view = view[os.write(chan, view):]

    from codex_lab.course.remote import SubmissionGone, SubmissionProcess, SubmissionTimeout

    servers: dict[str, SubmissionProcess | None] = {}

    def server(vis: str) -> SubmissionProcess:
        for other, s in servers.items():  # one submission process at a time: hidden never overlaps public
            if other != vis and s is not None:
                s.close()
                servers[other] = None
        if servers.get(vis) is None:
            work = Path(f"work-{vis}")
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            (work / sub_name).write_text(sub_text, encoding="utf-8")
            servers[vis] = SubmissionProcess(sub_name, task["forbid"].get(vis, []), cwd=str(work),
                                             startup_s=float(task["startup_s"]), view=task.get("view"))
        return servers[vis]  # type: ignore[return-value]

    todo_keys = [tuple(k) for k in task["todo"]]
    if todo_keys:
        server(todo_keys[0][2])  # loads torch and the file while the checks load here
    import torch  # noqa: F401

    from codex_lab.course import checks
    from codex_lab.course.outcome import run_check

    _load_checks(checks_src, Path(checks.__file__).resolve().parents[1])
    registry = {(les, n, e.visibility): e for (les, n), e in checks.REGISTRY.items() if les == task["lesson"]}
    registry.update({(les, n, checks.HIDDEN): e for (les, n), e in _load_hidden(hidden_src).items()})
    sys.stdout = sys.stderr = wire.Discard()  # type: ignore[assignment]
    timeout_s = float(task["timeout_s"])
    for key in todo_keys:
        e = registry.get(key)
        if e is None:
            continue
        emit(frame(nonce, "BEGIN", list(key)))
        timer = threading.Timer(timeout_s + float(task["check_s"]), lambda: os._exit(3))
        timer.daemon = True
        timer.start()
        proc = server(e.visibility)

        def res(status: str, msg: str) -> Result:
            return Result(e.lesson, e.name, status, msg, 0, e.points, e.visibility)

        if proc.load_error is not None:
            r = res(ERROR, f"could not load {sub_name}: {proc.load_error}")
        else:
            proc.budget(timeout_s)
            try:
                r = run_check(e, proc.function(e.name) if e.name in proc.names else None)
            except SubmissionTimeout:
                r = res(ERROR, f"timed out after {timeout_s:g} s (an endless loop?)")
            except SubmissionGone as exc:
                r = res(ERROR, str(exc))
            except BaseException as exc:  # noqa: BLE001 - a check defect must not stop the others
                r = res(ERROR, f"{type(exc).__name__}: {exc}"[:500])
            if proc.dead:
                servers[e.visibility] = None
        timer.cancel()
        emit(result_frame(nonce, key, r))
    for s in servers.values():
        if s is not None:
            s.close()
    os._exit(0)
