"""The child process seen from the parent: the process calls bound before any guard, the
threads that read its output up to a cap, and the wait that kills its whole group and turns
what it left into a :class:`~codex_lab.sandbox._result.SandboxResult`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from ._result import _FIX, SandboxResult, SandboxUnavailable

# bound at import, before any guard: checks running inside a sandboxed grader child (where the
# guard disables subprocess for the submission) can still start a nested sandbox
_POPEN, _RUN, _KILLPG = subprocess.Popen, subprocess.run, getattr(os, "killpg", None)


def _reader(stream, cap: int, buf: bytearray, over: threading.Event, on_over) -> None:
    """Read ``stream`` into ``buf`` up to ``cap`` bytes; past it, flag and call ``on_over``."""
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            return
        room = cap - len(buf)
        if room > 0:
            buf += chunk[:room]
        if len(chunk) > room:
            if not over.is_set():
                over.set()
                on_over()


def _kill_group(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    try:
        if _KILLPG is not None:
            _KILLPG(proc.pid, signal.SIGKILL)
    except OSError:  # already gone
        pass


def _collect(proc, mode, timeout_s, cap, report_r) -> SandboxResult:
    """Wait for the child (killing its group at the timeout), read its capped output, and
    raise :class:`SandboxUnavailable` when the launcher reported a setup failure."""
    bufs = (bytearray(), bytearray())
    over = threading.Event()
    kill = (lambda: _kill_group(proc)) if sys.platform != "win32" else proc.kill
    readers = [threading.Thread(target=_reader, args=(s, cap, b, over, kill), daemon=True)
               for s, b in zip((proc.stdout, proc.stderr), bufs)]
    for t in readers:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    kill()  # the whole group, always: nothing the child started outlives the call
    proc.wait()
    deadline = time.monotonic() + 5.0
    for t in readers:  # pipes close once every holder is dead
        t.join(max(0.0, deadline - time.monotonic()))
    for s in (proc.stdout, proc.stderr):
        s.close()
    out, err = (bytes(b).decode("utf-8", "replace") for b in bufs)
    if over.is_set():
        err += f"\n[codex-lab sandbox: output over {cap} bytes; the child was stopped]"
    rc = None if timed_out else proc.returncode
    if report_r is not None:
        os.set_blocking(report_r, False)
        try:
            report = os.read(report_r, 4096).decode("utf-8", "replace").strip()
        except (BlockingIOError, OSError):
            report = ""
        if report:
            raise SandboxUnavailable(f"{report.splitlines()[0]} (python {sys.executable}); {_FIX}")
    return SandboxResult(rc == 0 and not over.is_set(), rc, out, err, timed_out, over.is_set(), mode)
