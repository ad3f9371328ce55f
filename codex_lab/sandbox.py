"""Run untrusted generated code in a separate Python process with limits.

Used by the multi-task evaluation (lesson 05: do generated tests pass?) and the release
gates (lesson 07: does generated code work?). The child runs in a fresh temporary folder
(its working directory, deleted afterwards) with ``python -I`` (isolated: no user site,
no environment variables from PYTHON*), a wall-clock timeout, and on Linux/macOS resource
limits on memory, CPU time, file size and process count, plus a socket guard that refuses
network connections. This is a course sandbox, not a security boundary for hostile code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass

_PRELUDE = textwrap.dedent(
    """
    import socket as _s
    def _no_net(*a, **k):
        raise OSError("network access is disabled in the codex-lab sandbox")
    _s.socket.connect = _no_net
    _s.socket.connect_ex = _no_net
    _s.create_connection = _no_net
    del _s, _no_net
    """
)


@dataclass
class SandboxResult:
    """Outcome: ok (exit code 0 within time), the exit code, captured output, timed_out."""

    ok: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool


def _limits(memory_mb: int, cpu_s: int) -> None:  # runs in the child before exec
    import resource

    mem = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # 1 MiB per written file
    os.setsid()


def run_python(code: str, *, timeout_s: float = 5.0, memory_mb: int = 512) -> SandboxResult:
    """Execute ``code`` in a limited child process; never raises for the child's failures.

    Args:
        code: Python source to run.
        timeout_s: wall-clock limit in seconds (the child is killed after it).
        memory_mb: address-space limit of the child in MiB.
    """
    with tempfile.TemporaryDirectory(prefix="codex-lab-sandbox-") as tmp:
        path = os.path.join(tmp, "main.py")
        with open(path, "w") as f:
            f.write(_PRELUDE + "\n" + code)
        preexec = None
        if sys.platform != "win32":
            cpu = max(1, int(timeout_s) + 1)
            preexec = lambda: _limits(memory_mb, cpu)  # noqa: E731
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "TMPDIR": tmp}
        try:
            proc = subprocess.run(
                [sys.executable, "-I", path], cwd=tmp, env=env, capture_output=True, text=True,
                timeout=timeout_s, preexec_fn=preexec, stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            return SandboxResult(False, None, out, err, True)
        return SandboxResult(proc.returncode == 0, proc.returncode, proc.stdout, proc.stderr, False)
