"""In-namespace launcher: builds the sandbox's own root filesystem, then runs the child.

Started by :func:`codex_lab.sandbox.run_python` as ``unshare ... python -I -S _launch.py CONFIG``
(root in a fresh pid/net/mount namespace; in ``userns`` mode root of a fresh user namespace
too). It never imports codex_lab. Steps:

1. A new root on an empty tmpfs. Into it, read-only bind mounts (submounts read-only too) of
   exactly what the child needs: the system folders (/usr, /bin, /lib*), a fresh
   read-only sysfs of the sandbox's network namespace (no host interface, no cgroupfs), a
   read-only /etc of per-run copies of the few files a child uses (not the host's: an
   ``flock`` on a file two concurrent runs share crosses between them), the
   Python installation and its
   environment (every ``expose`` path, each bound at its own path: folders above it are
   fresh 0755 folders of the new root, so a private home (0700) on the way is no obstacle and
   two exposed paths under one home never hide each other), a fresh /proc and a /dev with
   only null, zero, full, random and urandom (read-only). Symlinks on an exposed path are recreated.
   Nothing else of the machine exists there: no home folders, no /run or /var (no pathname
   socket), no checkout beyond the package folder, no caller's cache.
2. One tmpfs capped in size (``disk_mb``) and inodes (``disk_inodes``) holds the child's folder,
   /tmp, /var/tmp and /dev/shm: the disk budget of the sandbox as a whole. Every tmpfs has an
   inode cap. The caller's files for the child are copied in.
3. ``hide`` paths that exist in the new root are covered by empty read-only mounts.
4. Optionally join a cgroup (memory and process limits for the whole sandbox; its out-of-memory
   counter is kept open for step 6), then
   ``pivot_root`` into the new root and detach the old one: the caller's tree is gone, not
   covered, so no umount can reveal it. The new root is remounted read-only.
5. Fork the child: resource limits, no new privileges, every capability dropped from the
   bounding, effective, permitted and inheritable sets (in ``userns`` mode the child is uid
   0 of its namespace but can no longer mount, unmount or remount), an unprivileged uid in
   ``root`` mode, then exec Python.
6. This process stays as pid 1 of the namespace: it reaps orphans and, past the memory
   budget, kills the whole namespace (see :func:`supervise`: with a cgroup when the kernel
   stops a process at its limit; without one when its poll of proportional memory, tmpfs
   blocks and inodes and unix socket buffers passes the budget). When the child ends it
   exits, and the kernel kills everything left (no daemon survives).

The steps live in modules of their own, loaded from this folder (standard library only, never
codex_lab): ``_launch_root`` (steps 1-4), ``_launch_seccomp`` (step 5's system-call filter) and
``_launch_supervise`` (step 6); this module holds step 5's child and :func:`main` (import the
steps' names from their own modules).
"""

import ctypes
import json
import os
import resource
import sys

if not __package__:  # run as the launcher script (python -I -S _launch.py CONFIG): this folder is on no import
    # path and codex_lab is never imported, so the step modules below load as a package of their own made here,
    # from this folder alone, writing nothing into it (no bytecode)
    import types

    sys.dont_write_bytecode = True
    _steps = types.ModuleType("codex_lab_sandbox_launch")
    _steps.__path__ = [os.path.dirname(os.path.abspath(__file__))]
    sys.modules[_steps.__name__] = _steps
    __package__ = _steps.__name__

from ._launch_base import SetupError, _libc  # noqa: E402
from ._launch_root import build_root, enter_root  # noqa: E402
from ._launch_seccomp import seccomp_filter  # noqa: E402
from ._launch_supervise import supervise  # noqa: E402

PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_PDEATHSIG = 38, 24, 1


def drop_privileges(cfg: dict) -> None:
    """Step 5's privilege part: no new privileges, every capability gone, unprivileged uid."""
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SetupError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    for cap in range(64):  # EINVAL past the kernel's last capability: ignored
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    if cfg.get("uid") is not None:
        os.setgroups([])
        os.setgid(cfg["gid"])
        os.setuid(cfg["uid"])  # a non-root uid keeps no capability

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    hdr, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words
    if _libc.capset(ctypes.byref(hdr), data) != 0:
        raise SetupError(ctypes.get_errno(), "capset (drop every capability)")
    seccomp_filter()


def _report(msg: str) -> None:
    """Setup failures go to the caller on their own pipe (fd ``report_fd``), which the child
    never holds, so generated code cannot fake one; stderr gets the same line."""
    line = f"codex-lab sandbox: setup failed: {msg}\n".encode()
    fd = _REPORT_FD[0]
    if fd is not None:
        try:
            os.write(fd, line)
        except OSError:
            pass
    os.write(2, line)


_REPORT_FD = [None]


def _child(cfg: dict) -> None:
    # the kernel's out-of-memory killer picks the sandbox's processes first, never pid 1 (raising needs no privilege)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    for name, value in cfg["limits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    os.chdir(cfg["workdir"])
    drop_privileges(cfg)
    os.setsid()
    os.umask(0o077)
    os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])


def main() -> None:
    cfg = json.loads(sys.argv[1])
    _REPORT_FD[0] = cfg.get("report_fd")
    if _REPORT_FD[0] is not None:  # closed by the child's exec: generated code never holds it
        os.set_inheritable(_REPORT_FD[0], False)
    try:
        build_root(cfg)
        enter_root(cfg)
    except OSError as exc:
        _report(str(exc))
        os._exit(125)
    pid = os.fork()
    if pid == 0:
        try:
            _child(cfg)
        except BaseException as exc:  # noqa: BLE001 - report and leave (the report pipe closes on exec)
            _report(f"could not start the child: {exc}")
        os._exit(125)
    if _REPORT_FD[0] is not None:
        os.close(_REPORT_FD[0])
    os._exit(supervise(pid, cfg))


if __name__ == "__main__":
    main()
