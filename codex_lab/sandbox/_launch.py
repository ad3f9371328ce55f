"""In-namespace launcher: builds the sandbox's own root filesystem, then runs the child.

Started by :func:`codex_lab.sandbox.run_python` as ``unshare ... python -I -S _launch.py CONFIG``
(root in a fresh pid/net/mount namespace; in ``userns`` mode root of a fresh user namespace
too). It never imports codex_lab. Steps:

1. A new root on an empty tmpfs. Into it, read-only bind mounts of exactly what the child
   needs: the system folders (/usr, /etc, /bin, /lib*, /sys), the Python installation and its
   environment (every ``expose`` path, each bound at its own path: folders above it are
   fresh 0755 folders of the new root, so a private home (0700) on the way is no obstacle and
   two exposed paths under one home never hide each other), a fresh /proc and a /dev with
   only null, zero, full, random and urandom. Symlinks on an exposed path are recreated.
   Nothing else of the machine exists there: no home folders, no /run or /var (no pathname
   socket), no checkout beyond the package folder, no caller's cache.
2. One size-capped tmpfs (``disk_mb``) holds the child's folder, /tmp, /var/tmp and /dev/shm:
   the disk budget of the sandbox as a whole. The caller's files for the child are copied in.
3. ``hide`` paths that exist in the new root are covered by empty read-only mounts.
4. Optionally join a cgroup (memory and process limits for the whole sandbox), then
   ``pivot_root`` into the new root and detach the old one: the caller's tree is gone, not
   covered, so no umount can reveal it. The new root is remounted read-only.
5. Fork the child: resource limits, no new privileges, every capability dropped from the
   bounding, effective, permitted and inheritable sets (in ``userns`` mode the child is uid
   0 of its namespace but can no longer mount, unmount or remount), an unprivileged uid in
   ``root`` mode, then exec Python.
6. This process stays as pid 1 of the namespace: it reaps orphans and enforces the shared
   memory budget (resident memory of every process in the namespace plus the scratch tmpfs,
   polled every 50 ms) by killing the whole namespace. When the child ends it exits, and the
   kernel kills everything left (no daemon survives).
"""

import ctypes
import json
import os
import platform
import resource
import shutil
import signal
import stat
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
ST_FLAGS = ((1, MS_RDONLY), (2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC), (1024, MS_NOATIME),
            (2048, MS_NODIRATIME), (4096, MS_RELATIME))
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_PDEATHSIG = 38, 24, 1
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
DEVICES = ("null", "zero", "full", "random", "urandom")
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(OSError):
    """The sandbox could not be built; the message names the step and the path."""


def _mount(src, target: str, fstype, flags: int, data) -> None:
    enc = (lambda s: s.encode() if isinstance(s, str) else s)
    rc = _libc.mount(enc(src), target.encode(), enc(fstype), ctypes.c_ulong(flags), enc(data))
    if rc != 0:
        err = ctypes.get_errno()
        raise SetupError(err, f"mount {src} on {target}: {os.strerror(err)}")


def _lock_flags(path: str) -> int:
    """Flags a read-only remount of a bind of ``path`` must keep (a user namespace may not
    clear nosuid/nodev/noexec/atime flags that the original mount carries)."""
    f = os.statvfs(path).f_flag
    return sum(ms for st, ms in ST_FLAGS if f & st)


def _inside(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _make_parents(root: str, path: str) -> None:
    """Create the folders above ``path`` inside ``root`` (0755), following symlinks already
    recreated there as the host has them."""
    os.makedirs(os.path.dirname(_inside(root, path)) or root, mode=0o755, exist_ok=True)


def _recreate_links(root: str, path: str, seen: set) -> None:
    """Recreate every symlink on the unresolved ``path`` (e.g. /bin -> usr/bin, a venv's
    bin/python -> /opt/...) inside ``root``; the targets are exposed separately."""
    cur = "/"
    for part in path.strip("/").split("/"):
        cur = os.path.join(cur, part)
        if cur in seen:
            continue
        if os.path.islink(cur):
            seen.add(cur)
            target = os.readlink(cur)
            dst = _inside(root, cur)
            if not os.path.lexists(dst):
                _make_parents(root, cur)
                os.symlink(target, dst)
            _recreate_links(root, os.path.normpath(os.path.join(os.path.dirname(cur), target)), seen)


def _bind_ro(root: str, src: str, recursive: bool = True) -> None:
    """Bind ``src`` (resolved) read-only at the same path inside ``root``."""
    dst = _inside(root, src)
    if os.path.isdir(src):
        os.makedirs(dst, mode=0o755, exist_ok=True)
    else:
        _make_parents(root, src)
        if not os.path.lexists(dst):
            open(dst, "w").close()
    _mount(src, dst, None, MS_BIND | (MS_REC if recursive else 0), None)
    _mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _lock_flags(src), None)


def _outermost(paths) -> list:
    """Resolved paths with those inside another one dropped (bound once, with their parent)."""
    out: list = []
    for p in sorted({os.path.realpath(p) for p in paths if os.path.exists(p)}):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def build_root(cfg: dict) -> None:
    """Steps 1-3 of the module docstring, into ``cfg['root']`` (an empty folder)."""
    root, work = cfg["root"], cfg["workdir"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    os.makedirs(_inside(root, "/proc"), mode=0o555, exist_ok=True)
    # hidepid=2: a process sees only its own uid's processes (root mode: not the launcher, whose
    # command line holds the sandbox's configuration)
    try:
        _mount("proc", _inside(root, "/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    except SetupError:  # kernels that refuse the option: plain proc (the pid namespace still holds)
        _mount("proc", _inside(root, "/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    dev = _inside(root, "/dev")
    os.makedirs(dev, mode=0o755, exist_ok=True)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            open(os.path.join(dev, name), "w").close()
            _mount(f"/dev/{name}", os.path.join(dev, name), None, MS_BIND, None)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, os.path.join(dev, name))
    # one scratch tmpfs: the child's folder, /tmp, /var/tmp, /dev/shm share its size (the disk budget)
    scratch = _inside(root, "/.scratch")
    os.makedirs(scratch, mode=0o700)
    uid = cfg.get("uid")
    owner = f",uid={uid},gid={cfg.get('gid')}" if uid is not None else ""
    _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(cfg['disk_mb'])}m,mode=0755{owner}")
    for sub, at, mode in (("tmp", "/tmp", 0o1777), ("var_tmp", "/var/tmp", 0o1777), ("shm", "/dev/shm", 0o1777),
                          ("work", work, 0o700)):
        src = os.path.join(scratch, sub)
        os.mkdir(src)
        os.chmod(src, mode)
        dst = _inside(root, at)
        os.makedirs(dst, mode=0o755, exist_ok=True)
        _mount(src, dst, None, MS_BIND, None)
    # after the scratch mounts: an environment or clone under /tmp (as CI makes) is bound on top
    seen: set = set()
    system = [p for p in SYSTEM if os.path.lexists(p)]
    for p in system + list(cfg.get("expose", [])):
        _recreate_links(root, p, seen)
    for p in _outermost(system + list(cfg.get("expose", []))):
        _bind_ro(root, p)
    shutil.copytree(cfg["host_workdir"], _inside(root, work), dirs_exist_ok=True, symlinks=True)
    if uid is not None:
        for dirpath, dirnames, filenames in os.walk(_inside(root, work)):
            os.chown(dirpath, uid, cfg["gid"])
            for n in filenames:
                os.chown(os.path.join(dirpath, n), uid, cfg["gid"], follow_symlinks=False)
    cfg["scratch_fd"] = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    _libc.umount2(scratch.encode(), MNT_DETACH)  # the binds above keep the tmpfs alive
    os.rmdir(scratch)
    for h in cfg.get("hide", []):
        dst = _inside(root, h)
        if os.path.isdir(dst) and not os.path.islink(dst):
            _mount("tmpfs", dst, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0555")
        elif os.path.isfile(dst) and not os.path.islink(dst):
            _mount(_inside(root, "/dev/null"), dst, None, MS_BIND, None)
            _mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
        elif not os.path.lexists(dst) and os.path.isdir(h):  # an empty read-only folder at its path
            os.makedirs(dst, mode=0o555)


def enter_root(cfg: dict) -> None:
    """Step 4: join the cgroup, pivot into the new root, detach the old one, remount / read-only."""
    for cg in cfg.get("cgroups") or []:
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write("0")
    root = cfg["root"]
    os.chdir(root)
    nr = SYS_PIVOT_ROOT.get(platform.machine())
    if nr is None or _libc.syscall(nr, b".", b".") != 0:
        err = ctypes.get_errno()
        raise SetupError(err, f"pivot_root into {root}: {os.strerror(err) if nr else 'unknown architecture'}")
    if _libc.umount2(b".", MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise SetupError(err, f"detach the old root: {os.strerror(err)}")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


# seccomp: syscalls whose memory no budget would see, refused for the child and all it starts
# (x86_64, aarch64): memfd_create (file memory outside the scratch tmpfs), a new user namespace
# via unshare/clone (its own tmpfs mounts), setns, clone3 (its flags cannot be inspected:
# ENOSYS makes the C library fall back to clone), and raising a socket's buffers (SO_SNDBUF,
# SO_RCVBUF and their FORCE forms: unread socket data is kernel memory; the defaults stay)
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
NR = {"x86_64": {"memfd_create": 319, "memfd_secret": 447, "setns": 308, "clone3": 435, "unshare": 272, "clone": 56,
                 "setsockopt": 54},
      "aarch64": {"memfd_create": 279, "memfd_secret": 447, "setns": 268, "clone3": 435, "unshare": 97, "clone": 220,
                  "setsockopt": 208}}
CLONE_NEWUSER, EPERM, ENOSYS = 0x10000000, 1, 38


def seccomp_filter() -> bool:
    """Install the filter above (needs no_new_privs); False on an architecture it does not know."""
    arch = platform.machine()
    if arch not in NR:
        return False
    nr = NR[arch]

    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]

    LD, JEQ, JSET, RET = 0x20, 0x15, 0x45, 0x06
    ALLOW, ERRNO = 0x7FFF0000, 0x00050000
    prog = [
        (LD, 0, 0, 4),                          # 0: arch
        (JEQ, 1, 0, AUDIT_ARCH[arch]),          # 1: our arch -> 3
        (RET, 0, 0, ERRNO | EPERM),             # 2: another ABI (x32, i386 via int 0x80): refused
        (LD, 0, 0, 0),                          # 3: syscall number
        (JEQ, 7, 0, nr["memfd_create"]),        # 4 -> 12
        (JEQ, 6, 0, nr["memfd_secret"]),        # 5 -> 12
        (JEQ, 5, 0, nr["setns"]),               # 6 -> 12
        (JEQ, 5, 0, nr["clone3"]),              # 7 -> 13
        (JEQ, 5, 0, nr["unshare"]),             # 8 -> 14
        (JEQ, 4, 0, nr["clone"]),               # 9 -> 14
        (JEQ, 7, 0, nr["setsockopt"]),          # 10 -> 18
        (RET, 0, 0, ALLOW),                     # 11
        (RET, 0, 0, ERRNO | EPERM),             # 12
        (RET, 0, 0, ERRNO | ENOSYS),            # 13: clone3
        (LD, 0, 0, 16),                         # 14: low word of args[0] (the flags)
        (JSET, 0, 1, CLONE_NEWUSER),            # 15: a new user namespace -> 16, else -> 17
        (RET, 0, 0, ERRNO | EPERM),             # 16
        (RET, 0, 0, ALLOW),                     # 17
        (LD, 0, 0, 24),                         # 18: args[1], the level
        (JEQ, 0, 6, 1),                         # 19: SOL_SOCKET -> 20, else -> 26 (allow)
        (LD, 0, 0, 32),                         # 20: args[2], the option
        (JEQ, 3, 0, 7),                         # 21: SO_SNDBUF -> 25
        (JEQ, 2, 0, 8),                         # 22: SO_RCVBUF -> 25
        (JEQ, 1, 0, 32),                        # 23: SO_SNDBUFFORCE -> 25
        (JEQ, 0, 1, 33),                        # 24: SO_RCVBUFFORCE -> 25, else -> 26
        (RET, 0, 0, ERRNO | EPERM),             # 25
        (RET, 0, 0, ALLOW),                     # 26
    ]
    arr = (Insn * len(prog))(*[Insn(*i) for i in prog])
    fprog = Prog(len(prog), arr)
    if _libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise SetupError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
    return True


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
    for name, value in cfg["limits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    os.chdir(cfg["workdir"])
    drop_privileges(cfg)
    os.setsid()
    os.umask(0o077)
    os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])


def _resident_bytes(page: int) -> int:
    """Resident memory of every process this pid namespace's /proc shows, in bytes."""
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/statm", "rb") as f:
                    total += int(f.read().split()[1]) * page
            except (OSError, IndexError, ValueError):
                pass
    return total


def supervise(pid: int, cfg: dict) -> int:
    """Step 6: reap orphans until the main child ends; kill everything past the memory budget."""
    budget = int(cfg["memory_budget_mb"]) * 1024 * 1024
    page = os.sysconf("SC_PAGE_SIZE")
    scratch_fd = cfg.get("scratch_fd")
    while True:
        try:
            got, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 125
        if got == pid:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        if got:
            continue
        used = _resident_bytes(page)
        if scratch_fd is not None:
            st = os.fstatvfs(scratch_fd)
            used += (st.f_blocks - st.f_bfree) * st.f_frsize
        if used > budget:
            os.write(2, (f"\n[codex-lab sandbox: the sandbox as a whole used {used >> 20} MiB, over its memory "
                         f"budget of {budget >> 20} MiB (all processes plus its files); every process was "
                         "stopped]\n").encode())
            os.kill(-1, signal.SIGKILL)  # pid 1 of the namespace: every other process in it
            os.waitpid(pid, 0)
            return 137
        time.sleep(0.05)


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
