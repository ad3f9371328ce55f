"""The run's cgroups: finding where this user may make one (cgroup v2 delegation, v1 memory
hierarchies), making the memory (and pids) cgroup of one run, reading how many processes the
kernel killed at its limit, and removing it afterwards."""

from __future__ import annotations

import os
import secrets
import sys
import time
from pathlib import Path

_MB = 1024 * 1024


def _cgroup2_mount() -> str | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` unified, ``/sys/fs/cgroup/unified``
    hybrid), from ``/proc/self/mountinfo``; None without one."""
    try:
        with open("/proc/self/mountinfo") as f:
            for ln in f:
                head, _, tail = ln.partition(" - ")
                if tail.split()[:1] == ["cgroup2"]:
                    return head.split()[4]
    except OSError:
        pass
    return None


def _cgroup2_parents() -> list[Path]:
    """cgroup v2 folders under which this user may make a run's cgroup with the memory
    controller: its own cgroup where ``memory`` is enabled for children (root's, or one delegated
    to it), else the parent of its own where that is writable by it (systemd's delegation: the
    user owns ``user@UID.service`` and the slices under it). Moving a process between two
    cgroups needs write access to their common ancestor's ``cgroup.procs``: checked here."""
    mnt = _cgroup2_mount()
    if mnt is None:
        return []
    try:
        own = next(ln.split("::", 1)[1] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                   if ln.startswith("0::"))
    except (OSError, StopIteration):
        return []
    base = Path(mnt) / own.lstrip("/")
    out = []
    for cand in (base, base.parent):
        if not str(cand).startswith(mnt) or not os.access(cand, os.W_OK) or \
                not os.access(cand / "cgroup.procs", os.W_OK):
            continue
        try:
            if "memory" in (cand / "cgroup.subtree_control").read_text().split():
                out.append(cand)
        except OSError:
            pass
    return out


def _cgroups(memory_mb: int, nproc: int) -> list[str]:
    """A memory (and where allowed pids) cgroup for one run, for root or for a user who was
    delegated one: v2 (a child of :func:`_cgroup2_parents`), else v1 hierarchies (a child of the
    caller's own memory cgroup, where the caller may make one). [] where no memory cgroup can
    be made; then :func:`run_python` needs the polled budget accepted (:func:`memory_bound`)."""
    if sys.platform != "linux":
        return []
    name = f"codex-lab-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
    made: list[str] = []
    v2_only = os.path.exists("/sys/fs/cgroup/cgroup.controllers")  # unified: no v1 hierarchies at all
    for parent in _cgroup2_parents():
        d = parent / name
        try:
            d.mkdir()
            made.append(str(d))
            (d / "memory.max").write_text(str(memory_mb * _MB))
            for f, v in (("memory.swap.max", "0"), ("pids.max", str(nproc)), ("memory.oom.group", "1")):
                try:  # swap and pids may not be delegated; oom.group: ask the kernel to stop them all
                    (d / f).write_text(v)
                except OSError:
                    pass
            return made
        except OSError:
            _remove_cgroups(made)
            made = []
    if v2_only:
        return []
    try:
        for ctrl, files in (("memory", {"memory.limit_in_bytes": str(memory_mb * _MB)}),
                            ("pids", {"pids.max": str(nproc)})):
            own = next((ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                        if ctrl in ln.split(":", 2)[1].split(",")), None)
            base = Path("/sys/fs/cgroup") / ctrl
            if own is None or not base.is_dir():
                continue
            d = base / own.lstrip("/") / name
            if not (base / own.lstrip("/")).is_dir():
                d = base / name
            try:
                d.mkdir()
            except OSError:
                if ctrl == "memory":
                    raise
                continue  # pids is a bonus (RLIMIT_NPROC holds anyway); memory is the point
            made.append(str(d))
            for f, v in files.items():
                (d / f).write_text(v)
            if ctrl == "memory":
                try:
                    (d / "memory.memsw.limit_in_bytes").write_text(str(memory_mb * _MB))  # no swap beyond it
                except OSError:
                    pass
        return made if any("/memory/" in p for p in made) else (_remove_cgroups(made) or [])
    except OSError:
        _remove_cgroups(made)
        return []


def _oom_kills(paths: list[str]) -> int:
    """Processes the kernel killed at the memory limit of the run's cgroups (v2 ``memory.events``,
    v1 ``memory.oom_control``: their ``oom_kill`` line; 0 where the kernel does not count)."""
    n = 0
    for p in paths:
        for name in ("memory.events", "memory.oom_control"):
            try:
                for line in Path(p, name).read_text().splitlines():
                    if line.startswith("oom_kill "):
                        n += int(line.split()[1])
            except (OSError, ValueError):
                pass
    return n


def _remove_cgroups(paths: list[str]) -> None:
    for d in paths:
        for _ in range(50):  # the kernel frees a cgroup a moment after its last process is reaped
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
