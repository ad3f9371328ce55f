"""Run untrusted code (generated programs, learners' submissions) in a sandboxed child process.

Used by the multi-task evaluation (do generated tests pass?), the release gates (does
generated code work?) and ``codex-lab grade`` (one child per submission). What holds:

Linux, started as root (mode ``"root"``) - the boundary:
  * a fresh pid, network, IPC and mount namespace (util-linux ``unshare``): no network at all
    (only a down loopback; abstract unix sockets are per network namespace), the parent and
    every other process invisible, and when the child's main process ends or is killed the
    kernel kills everything left in the namespace (no forked or detached daemon survives);
  * a root filesystem of its own (``_launch_root.py``): read-only system folders, the Python
    installation, its environment and the installed package, each at its own path, and
    nothing else of the machine: no home folders, no checkout beyond the package folder
    (no .git, no solutions), no /run or /var (no pathname socket of the caller), no
    caller's cache. It works for every ordinary layout (system Python, pyenv, conda, a venv
    inside the clone or elsewhere in a private home, user-site installs): exposed paths are
    bound one by one, so private folders on the way and several paths under one home are
    no obstacle. Everything bound is read-only, submounts included; /sys is a sysfs of the
    sandbox's own network namespace (no host interface, no cgroupfs); /dev is read-only. The
    old root is detached (``pivot_root``), not covered, so nothing can be unmounted to reveal it;
  * limits for the sandbox as a whole: one tmpfs capped in size (``disk_mb``) and inodes
    (``disk_inodes``) holds its folder, /tmp, /var/tmp and /dev/shm; a memory budget
    (``memory_mb`` + ``disk_mb``) held by the run's cgroup, which the kernel charges with
    everything the sandbox allocates, kernel memory included (socket buffers, inodes, pipes);
    at the limit pid 1 of the namespace stops every process (see :func:`memory_bound` for
    machines where no cgroup can be made); a process limit per run (a uid of its own with
    RLIMIT_NPROC, and the cgroup's pids.max);
  * a seccomp filter (``_launch_seccomp.py``): socket families other than unix/IPv4/IPv6 (vsock,
    netlink, packet, ...), keyrings, io_uring, userfaultfd, bpf, perf, ptrace, memfd, SysV
    shared memory, new namespaces and the calls that need a dropped capability are refused;
  * the child runs as an unprivileged uid/gid of its own (no account, one per run), with no
    capabilities and no new privileges, so it cannot write root's files, read
    ``/etc/shadow`` or another process's ``/proc/<pid>/environ``, or signal the parent;
  * empty read-only mounts over ``hide`` paths that would otherwise be visible.
Linux without root but with unprivileged user namespaces (mode ``"userns"``): the same
namespaces, root filesystem, tmpfs caps, rlimits and seccomp filter; the child is uid 0 of its
own user namespace with every capability dropped (it cannot mount, unmount or remount) and
the caller's file rights on the few read-only paths it sees. Memory is held by the kernel where
the user can have a cgroup (a delegated v2 subtree, an owned v1 memory cgroup, or a
``systemd-run --user`` scope); where none can be had, only pid 1's poll holds it, which is not
a kernel bound, and :func:`run_python` refuses unless accepted (``CODEX_LAB_SANDBOX_MEMORY=polled``
or ``accept_polled_memory=True``): :func:`memory_bound` says which holds.
If the sandbox cannot be built (a layout it does not know), :func:`run_python` raises
:class:`SandboxUnavailable` with one line naming the step and the fix, instead of a failed
run that callers would read as "the code is wrong".
Everywhere (mode ``"plain"`` alone on macOS, Linux without namespaces): ``python -I`` in a
temporary folder with a minimal environment, its own session/process group killed on
return or timeout, rlimits (address space, CPU seconds, file size, open files, process
count; Linux/macOS), output read with a cap, and the guard of
:mod:`codex_lab.sandbox.guard` (``os.system``, ``os.kill``, ``subprocess``, sockets,
``shutil.rmtree`` outside its folder disabled). Plain mode is not a boundary: ``ctypes`` or
``posix`` reach the same calls. On Windows only the timeout, the temporary folder and the
output cap hold. Never run untrusted code on a laptop in plain mode; use a container.

This module holds the entry point (:func:`run_python`) and what this machine allows
(:func:`isolation_mode`, :func:`memory_bound`); the parts live in modules of their own:
``_result`` (what a run returns or raises), ``_process`` (the child seen from the parent: its
capped output, its timeout), ``_paths`` (the host paths the child sees), ``_cgroup`` (the run's
cgroups) and the in-namespace launcher ``_launch`` with its steps (``_launch_root``,
``_launch_seccomp``, ``_launch_supervise``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ._cgroup import _MB, _cgroup2_mount, _cgroup2_parents, _cgroups, _oom_kills, _remove_cgroups
from ._paths import _PKG, _site_paths, exposed_paths
# importing _process binds Popen, run and killpg now, before any guard (see there)
from ._process import _KILLPG, _POPEN, _RUN, _collect, _kill_group, _reader
from ._result import _FIX, SandboxResult, SandboxUnavailable

# the public API, then the names of the modules above that are still importable from here
# although nothing in this module uses them (the functions that use the others look them up
# here, so a test that patches ``codex_lab.sandbox._cgroups`` reaches :func:`run_python`)
__all__ = ["ACCEPT_POLLED", "SandboxResult", "SandboxUnavailable", "exposed_paths", "isolation_mode",
           "memory_bound", "run_python", "_FIX", "_KILLPG", "_PKG", "_cgroup2_parents", "_kill_group", "_reader"]

_HERE = Path(__file__).resolve().parent
_GUARD = (_HERE / "guard.py").read_text()


_MODE: str | None = None


def isolation_mode() -> str:
    """The strongest isolation this machine allows: ``root``, ``userns`` or ``plain``.

    ``CODEX_LAB_SANDBOX=plain`` forces the fallback (for tests of it).
    """
    global _MODE
    if os.environ.get("CODEX_LAB_SANDBOX") == "plain" or sys.platform != "linux":
        return "plain"
    if _MODE is None:
        # decided in a local and published once: two threads' first runs at once (the grader's
        # pool) must not see a "plain" set only while the probe runs, which ran one unsandboxed
        mode = "plain"
        unshare = shutil.which("unshare")
        if unshare:
            flags = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
            try:
                probe = _RUN([unshare, *flags, "--net", "--ipc", "--pid", "--fork", "--kill-child", "--mount",
                              "--mount-proc", "true"], capture_output=True, timeout=10)
                if probe.returncode == 0:
                    mode = "root" if os.geteuid() == 0 else "userns"
            except (OSError, subprocess.TimeoutExpired):
                pass
        _MODE = mode
    return _MODE


def _limits_prelude(spec: dict[str, int]) -> str:
    """Plain mode: the child sets its own rlimits first thing (no preexec_fn, which is unsafe
    with the grader's threads); macOS refuses some (RLIMIT_AS) and keeps the others."""
    return ("import resource as _r\n"
            f"for _n, _v in {spec!r}.items():\n"
            "    try:\n        _r.setrlimit(getattr(_r, _n), (_v, _v))\n"
            "    except (ValueError, OSError, AttributeError):\n        pass\n"
            "del _r, _n, _v\n")


_SCOPE: bool | None = None


def _systemd_scope_ok() -> bool:
    """A systemd user manager that can run the sandbox in a transient scope with ``MemoryMax``
    enforced (memory delegated to the user: the default of current systemd on cgroup v2).
    Checked once by running ``cat`` of the scope's own ``memory.max`` under a 64 MiB limit."""
    global _SCOPE
    if _SCOPE is None:
        ok = False  # published once decided, as in isolation_mode: no interim answer for other threads
        tool, mnt = shutil.which("systemd-run"), _cgroup2_mount()
        if tool and mnt and os.geteuid() != 0 and os.environ.get("XDG_RUNTIME_DIR"):
            probe = f"cat {mnt}$(sed -n 's/^0:://p' /proc/self/cgroup)/memory.max"
            try:
                r = _RUN([tool, "--user", "--scope", "--quiet", "--collect", "-p", "MemoryMax=64M", "--",
                          "sh", "-c", probe], capture_output=True, text=True, timeout=20,
                         env={"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": os.environ["XDG_RUNTIME_DIR"],
                              **({"DBUS_SESSION_BUS_ADDRESS": os.environ["DBUS_SESSION_BUS_ADDRESS"]}
                                 if "DBUS_SESSION_BUS_ADDRESS" in os.environ else {})})
                ok = r.returncode == 0 and r.stdout.strip() == str(64 * _MB)
            except (OSError, subprocess.TimeoutExpired):
                pass
        _SCOPE = ok
    return _SCOPE


_BOUND: str | None = None
ACCEPT_POLLED = "CODEX_LAB_SANDBOX_MEMORY"  # =polled: run where only the polled budget holds


def memory_bound() -> str:
    """What holds the sandbox's memory budget on this machine, said up front:

    - ``"cgroup"``: a cgroup of its own per run (root, or a user with a delegated cgroup v2
      subtree or an owned v1 memory cgroup): the kernel charges every page and kernel object
      (socket buffers, inodes, pipes included) and stops the sandbox at the budget;
    - ``"systemd-scope"``: a user without such a cgroup but with a systemd user manager: each
      run is a transient scope with ``MemoryMax`` (the same kernel bound);
    - ``"polled"``: no cgroup can be had (a container without delegation, or memory not
      delegated): only the namespace's pid 1 polls memory (every 10-20 ms) and stops the sandbox
      past the budget. Hard kernel caps still hold (tmpfs size and inodes, open files,
      processes, socket buffers at their defaults), but a burst between polls and kernel
      memory the poll cannot see (pipe buffers, page tables) escape it, so
      :func:`run_python` refuses to run unless the caller accepts it (``accept_polled_memory=True``
      or ``CODEX_LAB_SANDBOX_MEMORY=polled``);
    - ``"none"``: plain mode (no namespaces): per-process rlimits only.
    """
    global _BOUND
    if isolation_mode() == "plain":
        return "none"
    if _BOUND is None:
        made = _cgroups(64, 8)
        _remove_cgroups(made)
        _BOUND = "cgroup" if made else ("systemd-scope" if _systemd_scope_ok() else "polled")
    return _BOUND


def run_python(code: str, *, timeout_s: float = 5.0, memory_mb: int = 512, nproc: int = 64,
               max_output_bytes: int = 1 * _MB, files: dict[str, str | bytes] | None = None,
               hide: tuple[str, ...] | list[str] = (), guard: bool = True, env: dict[str, str] | None = None,
               cpu_s: int | None = None, disk_mb: int = 64, package: str | None = None,
               disk_inodes: int | None = None, accept_polled_memory: bool = False) -> SandboxResult:
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
        disk_mb: namespace modes: size in MiB of the one tmpfs holding the child's folder,
            /tmp, /var/tmp and /dev/shm (the sandbox's whole disk budget; it counts toward
            the memory budget too).
        disk_inodes: namespace modes: files and folders that tmpfs may hold (its ``nr_inodes``;
            each costs ~1 KiB of kernel memory whatever its size); default ``256 * disk_mb``.
        package: a folder holding a ``codex_lab`` package to show the child *instead of* the
            real one (the grader's learner's view, :mod:`codex_lab.course.learner_view`): in
            the namespace modes the real package folder is then not mounted at all and this
            folder is, read-only, first on the child's import path. Plain mode only puts it
            first on the import path (the real files stay readable there).
        accept_polled_memory: run even where no kernel bound holds the memory budget (see
            :func:`memory_bound`: ``"polled"``); the same as ``CODEX_LAB_SANDBOX_MEMORY=polled``.

    Raises:
        SandboxUnavailable: the sandbox could not be built here, or only the polled memory budget
            would hold and it was not accepted (one line: cause and fix).
    """
    mode = isolation_mode()
    tmp = tempfile.mkdtemp(prefix="codex-lab-sandbox-")
    try:
        return _run(code, tmp, mode, timeout_s, memory_mb, nproc, max_output_bytes, files or {}, list(hide), guard,
                    env or {}, cpu_s, disk_mb, package, disk_inodes, accept_polled_memory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _polled_refusal(mode: str) -> SandboxUnavailable:
    why = ("root could not make a memory cgroup" if mode == "root" else
           "no cgroup this user may create (no delegated cgroup v2 subtree, no owned v1 memory cgroup) and no "
           "systemd user manager to run it in a scope")
    return SandboxUnavailable(
        f"codex-lab sandbox: no kernel bound on the sandbox's memory here ({mode} mode: {why}); only pid 1's "
        "poll (every 10-20 ms) of its processes, files and unix socket buffers would hold the budget, which a fast burst and "
        "kernel memory the poll cannot see (pipe buffers, page tables) escape; to run anyway set "
        f"{ACCEPT_POLLED}=polled (or pass accept_polled_memory=True), or give this user a cgroup (a delegated "
        "cgroup v2 subtree, or a systemd user session)")


def _run(code, tmp, mode, timeout_s, memory_mb, nproc, cap, files, hide, guard, extra_env, cpu_s,
         disk_mb=64, package=None, disk_inodes=None, accept_polled=False) -> SandboxResult:
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
    if mode == "userns":  # counted in the sandbox's user namespace, where unshare and pid 1 are two of them
        limits["RLIMIT_NPROC"] = nproc + 2
    env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", **extra_env}
    boot = os.path.join(tmp, "_boot.py")
    argv = [sys.executable, "-I", boot]
    if mode == "plain" and sys.platform != "win32":
        prelude = _limits_prelude(limits) + prelude
    with open(main, "w") as f:  # the code keeps its own file: `from __future__` lines, tracebacks naming main.py
        f.write(code)
    paths = "" if mode == "plain" else (
        f"import sys as _s, site as _site\nfor _p in {_site_paths()!r}:\n"
        "    if _p not in _s.path:\n        _site.addsitedir(_p)\ndel _s, _site\n")
    if package:  # the given codex_lab first on the import path (in the namespace modes the only one there)
        paths += f"import sys as _s\n_s.path.insert(0, {str(package)!r})\ndel _s\n"
    with open(boot, "w") as f:
        f.write(paths + prelude + f"\n__file__ = {main!r}\nimport sys as _s\n_s.argv[0] = __file__\ndel _s\n"
                f"exec(compile(open(__file__, encoding='utf-8').read(), __file__, 'exec'))\n")
    root = report_r = report_w = None
    groups: list[str] = []
    if mode == "plain":
        cmd = argv
    else:
        uid = gid = None
        if mode == "root":  # an unprivileged uid of its own, no account: per-run process limit and signals
            uid = gid = 100000 + secrets.randbelow(50000)
        groups = _cgroups(memory_mb + disk_mb, nproc)
        scope = not groups and mode == "userns" and _systemd_scope_ok()
        if not groups and not scope and not (accept_polled or os.environ.get(ACCEPT_POLLED) == "polled"):
            raise _polled_refusal(mode)
        root = tempfile.mkdtemp(prefix="codex-lab-root-")  # an empty mount point for the new root
        report_r, report_w = os.pipe()
        cfg = {"workdir": tmp, "host_workdir": tmp, "root": root, "expose": exposed_paths(package),
               "hide": [str(Path(h).resolve()) for h in hide], "uid": uid, "gid": gid, "limits": limits,
               "argv": argv, "env": env, "disk_mb": disk_mb, "memory_budget_mb": memory_mb + disk_mb,
               "disk_inodes": int(disk_inodes if disk_inodes is not None else max(1024, 256 * disk_mb)),
               "cgroups": groups, "cgroup_self": scope, "report_fd": report_w}
        flags = [] if mode == "root" else ["--user", "--map-root-user"]
        cmd = [shutil.which("unshare") or "unshare", *flags, "--net", "--ipc", "--pid", "--fork", "--kill-child",
               "--mount", "--propagation", "private", sys.executable, "-I", "-S", str(_HERE / "_launch.py"),
               json.dumps(cfg)]
        if scope:  # the whole sandbox in a transient systemd scope whose MemoryMax the kernel enforces
            cmd = [shutil.which("systemd-run") or "systemd-run", "--user", "--scope", "--quiet", "--collect",
                   "-p", f"MemoryMax={memory_mb + disk_mb}M", "-p", "MemorySwapMax=0", "-p", f"TasksMax={nproc + 4}",
                   "--", *cmd]
    try:
        outer = {"PATH": "/usr/bin:/bin", **{k: os.environ[k] for k in ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")
                                               if cmd[0].endswith("systemd-run") and k in os.environ}}
        proc = _POPEN(cmd, cwd=tmp, env=env if mode == "plain" else outer,
                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      start_new_session=sys.platform != "win32", pass_fds=() if report_w is None else (report_w,))
    finally:
        if report_w is not None:
            os.close(report_w)
    try:
        res = _collect(proc, mode, timeout_s, cap, report_r)
        if _oom_kills(groups) and "memory budget" not in res.stderr:
            # the cgroup's limit struck before pid 1's poll saw the budget passed: say so all the same,
            # and the run failed even where a surviving process exited 0 (no oom.group on v1)
            res.ok = False
            res.stderr += (f"\n[codex-lab sandbox: the kernel stopped a process at the sandbox's memory budget of "
                           f"{memory_mb + disk_mb} MiB (all processes plus its files; the run's cgroup limit)]\n")
        return res
    finally:
        if report_r is not None:
            os.close(report_r)
        _remove_cgroups(groups)
        if root is not None:
            try:
                os.rmdir(root)
            except OSError:
                pass
