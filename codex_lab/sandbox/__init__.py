"""Run untrusted code (generated programs, learners' submissions) in a sandboxed child process.

Used by the multi-task evaluation (do generated tests pass?), the release gates (does
generated code work?) and ``codex-lab grade`` (one child per submission). What holds:

Linux, started as root (mode ``"root"``) - the boundary:
  * a fresh pid, network and mount namespace (util-linux ``unshare``): no network at all
    (only a down loopback), the parent and every other process invisible, and when the
    child's main process ends or is killed the kernel kills everything left in the
    namespace (no forked or detached daemon survives ``run_python``);
  * the child runs as an unprivileged uid/gid of its own (no account, one per run), so it
    cannot write root's files, read ``/etc/shadow`` or another process's
    ``/proc/<pid>/environ``, or signal the parent (which it cannot even see);
  * private, empty tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock`` (its own
    folder is bound back at its path), and empty read-only mounts over ``hide`` paths.
Linux without root but with unprivileged user namespaces (mode ``"userns"``): the same
namespaces and mounts, without the uid switch (the child has the caller's file rights).
Everywhere (mode ``"plain"`` alone on macOS, Linux without namespaces): ``python -I`` in a
temporary folder with a minimal environment, its own session/process group killed on
return or timeout, rlimits (address space, CPU seconds, file size, open files, process
count; Linux/macOS), output read with a cap, and the guard of
:mod:`codex_lab.sandbox.guard` (``os.system``, ``os.kill``, ``subprocess``, sockets,
``shutil.rmtree`` outside its folder disabled). Plain mode is not a boundary: ``ctypes`` or
``posix`` reach the same calls. On Windows only the timeout, the temporary folder and the
output cap hold. Never run untrusted code on a laptop in plain mode; use a container.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# bound at import, before any guard: checks running inside a sandboxed grader child (where the
# guard disables subprocess for the submission) can still start a nested sandbox
_POPEN, _RUN, _KILLPG = subprocess.Popen, subprocess.run, getattr(os, "killpg", None)
_HERE = Path(__file__).resolve().parent
_GUARD = (_HERE / "guard.py").read_text()
_MB = 1024 * 1024


@dataclass
class SandboxResult:
    """Outcome: ok (exit code 0 within time), exit code, captured output (capped), timed_out.

    ``truncated`` is True when the output passed ``max_output_bytes`` (the child was then
    killed); ``mode`` names the isolation that held (``root``, ``userns`` or ``plain``).
    """

    ok: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool = False
    mode: str = "plain"


_MODE: str | None = None


def isolation_mode() -> str:
    """The strongest isolation this machine allows: ``root``, ``userns`` or ``plain``.

    ``CODEX_LAB_SANDBOX=plain`` forces the fallback (for tests of it).
    """
    global _MODE
    if os.environ.get("CODEX_LAB_SANDBOX") == "plain" or sys.platform != "linux":
        return "plain"
    if _MODE is None:
        _MODE = "plain"
        unshare = shutil.which("unshare")
        if unshare:
            flags = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
            try:
                probe = _RUN([unshare, *flags, "--net", "--pid", "--fork", "--kill-child", "--mount",
                                        "--mount-proc", "true"], capture_output=True, timeout=10)
                if probe.returncode == 0:
                    _MODE = "root" if os.geteuid() == 0 else "userns"
            except (OSError, subprocess.TimeoutExpired):
                pass
    return _MODE


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


def _limits_prelude(spec: dict[str, int]) -> str:
    """Plain mode: the child sets its own rlimits first thing (no preexec_fn, which is unsafe
    with the grader's threads); macOS refuses some (RLIMIT_AS) and keeps the others."""
    return ("import resource as _r\n"
            f"for _n, _v in {spec!r}.items():\n"
            "    try:\n        _r.setrlimit(getattr(_r, _n), (_v, _v))\n"
            "    except (ValueError, OSError, AttributeError):\n        pass\n"
            "del _r, _n, _v\n")


def run_python(code: str, *, timeout_s: float = 5.0, memory_mb: int = 512, nproc: int = 64,
               max_output_bytes: int = 1 * _MB, files: dict[str, str | bytes] | None = None,
               hide: tuple[str, ...] | list[str] = (), guard: bool = True, env: dict[str, str] | None = None,
               cpu_s: int | None = None) -> SandboxResult:
    """Execute ``code`` in a sandboxed child (see the module docstring); never raises for its failures.

    Args:
        code: Python source, run as ``main.py`` in a fresh temporary folder (its cwd).
        timeout_s: wall-clock limit in seconds; past it the child (and its namespace or
            process group) is killed and ``timed_out`` is True.
        memory_mb: address-space limit (RLIMIT_AS) in MiB; importing torch needs ~700.
        nproc: process/thread limit (RLIMIT_NPROC) of the child's uid.
        max_output_bytes: stdout and stderr are each kept up to this many bytes; more kills
            the child and sets ``truncated``.
        files: extra files written into the folder before the run (name -> text or bytes).
        hide: paths (folders or files) made empty and read-only for the child (namespace modes).
        guard: paste :mod:`codex_lab.sandbox.guard` in front of ``code``.
        env: extra environment variables (the parent's environment is never passed).
        cpu_s: CPU-seconds limit (RLIMIT_CPU); default ``timeout_s + 1``.
    """
    mode = isolation_mode()
    tmp = tempfile.mkdtemp(prefix="codex-lab-sandbox-")
    try:
        return _run(code, tmp, mode, timeout_s, memory_mb, nproc, max_output_bytes, files or {}, list(hide), guard,
                    env or {}, cpu_s)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(code, tmp, mode, timeout_s, memory_mb, nproc, cap, files, hide, guard, extra_env, cpu_s) -> SandboxResult:
    prelude = _GUARD + f"\ninstall({tmp!r})\ndel install\n" if guard else ""
    main = os.path.join(tmp, "main.py")
    for name, data in files.items():
        p = os.path.join(tmp, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
    cpu = int(cpu_s if cpu_s is not None else max(1, int(timeout_s) + 1))
    limits = {"RLIMIT_AS": memory_mb * _MB, "RLIMIT_CPU": cpu, "RLIMIT_FSIZE": 16 * _MB,
              "RLIMIT_NOFILE": 256, "RLIMIT_NPROC": nproc, "RLIMIT_CORE": 0}
    env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", **extra_env}
    boot = os.path.join(tmp, "_boot.py")
    argv = [sys.executable, "-I", boot]
    if mode == "plain" and sys.platform != "win32":
        prelude = _limits_prelude(limits) + prelude
    with open(main, "w") as f:  # the code keeps its own file: `from __future__` lines, tracebacks naming main.py
        f.write(code)
    with open(boot, "w") as f:
        f.write(prelude + f"\n__file__ = {main!r}\nimport sys as _s\n_s.argv[0] = __file__\ndel _s\n"
                f"exec(compile(open(__file__, encoding='utf-8').read(), __file__, 'exec'))\n")
    if mode == "plain":
        cmd = argv
    else:
        uid = gid = None
        if mode == "root":  # an unprivileged uid of its own, no account: per-run process limit and signals
            uid = gid = 100000 + secrets.randbelow(50000)
            os.chown(tmp, uid, gid)
            for dirpath, dirnames, filenames in os.walk(tmp):
                for n in dirnames + filenames:
                    os.chown(os.path.join(dirpath, n), uid, gid)
        os.chmod(tmp, 0o700)
        expose = sorted({os.path.realpath(sys.executable), sys.base_prefix, sys.prefix, str(_HERE.parents[1])})
        cfg = {"workdir": tmp, "expose": expose, "hide": [str(Path(h).resolve()) for h in hide], "uid": uid, "gid": gid,
               "limits": limits, "argv": argv, "env": env}
        flags = [] if mode == "root" else ["--user", "--map-root-user"]
        cmd = [shutil.which("unshare") or "unshare", *flags, "--net", "--pid", "--fork", "--kill-child", "--mount",
               "--mount-proc", sys.executable, "-I", "-S", str(_HERE / "_launch.py"), json.dumps(cfg)]
    proc = _POPEN(cmd, cwd=tmp, env=env if mode == "plain" else {"PATH": "/usr/bin:/bin"},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=sys.platform != "win32")
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
    return SandboxResult(rc == 0 and not over.is_set(), rc, out, err, timed_out, over.is_set(), mode)
