"""In-namespace launcher: builds the sandbox's own root filesystem, then runs the child.

Started by :func:`codex_lab.sandbox.run_python` as ``unshare ... python -I -S _launch.py CONFIG``
(root in a fresh pid/net/mount namespace; in ``userns`` mode root of a fresh user namespace
too). It never imports codex_lab. Steps:

1. A new root on an empty tmpfs. Into it, read-only bind mounts (submounts read-only too) of
   exactly what the child needs: the system folders (/usr, /etc, /bin, /lib*), a fresh
   read-only sysfs of the sandbox's network namespace (no host interface, no cgroupfs), the
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
"""

import ctypes
import json
import os
import platform
import resource
import shutil
import signal
import socket
import stat
import struct
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
ST_FLAGS = ((1, MS_RDONLY), (2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC), (1024, MS_NOATIME),
            (2048, MS_NODIRATIME), (4096, MS_RELATIME))
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_PDEATHSIG = 38, 24, 1
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
SYS_MOUNT_SETATTR, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 442, 0x8000, 1  # same number on x86_64 and aarch64
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
    if recursive:
        _submounts_ro(dst)


def _submounts_ro(dst: str) -> None:
    """Make every mount below ``dst`` read-only too (a read-only remount of a recursive bind
    covers only its top mount: /etc/hosts bound by a container runtime, or anything mounted
    under an exposed path, would stay writable). ``mount_setattr`` (Linux 5.12) does it at
    once; older kernels get each submount of /proc/self/mountinfo remounted."""
    class Attr(ctypes.Structure):
        _fields_ = [("set", ctypes.c_uint64), ("clr", ctypes.c_uint64), ("prop", ctypes.c_uint64),
                    ("userns", ctypes.c_uint64)]

    attr = Attr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    if _libc.syscall(SYS_MOUNT_SETATTR, -100, dst.encode(), AT_RECURSIVE, ctypes.byref(attr),
                     ctypes.sizeof(attr)) == 0:
        return
    with open("/proc/self/mountinfo") as f:
        points = [ln.split()[4].encode().decode("unicode_escape") for ln in f]
    for mp in points:
        if mp.startswith(dst.rstrip("/") + "/"):
            _mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _lock_flags(mp), None)


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
    # every tmpfs has an inode cap (nr_inodes): an empty file takes no block but ~1 KiB of kernel memory
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096,mode=0755")
    os.makedirs(_inside(root, "/proc"), mode=0o555, exist_ok=True)
    # hidepid=2: a process sees only its own uid's processes (root mode: not the launcher, whose
    # command line holds the sandbox's configuration)
    try:
        _mount("proc", _inside(root, "/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    except SetupError:  # kernels that refuse the option: plain proc (the pid namespace still holds)
        _mount("proc", _inside(root, "/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    dev = _inside(root, "/dev")
    os.makedirs(dev, mode=0o755, exist_ok=True)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755")
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
    _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={int(cfg['disk_mb'])}m,nr_inodes={int(cfg.get('disk_inodes') or 4096)},mode=0755{owner}")
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
    _mount_sys(root)
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
            _mount("tmpfs", dst, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,nr_inodes=16,mode=0555")
        elif os.path.isfile(dst) and not os.path.islink(dst):
            _mount(_inside(root, "/dev/null"), dst, None, MS_BIND, None)
            _mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
        elif not os.path.lexists(dst) and os.path.isdir(h):  # an empty read-only folder at its path
            os.makedirs(dst, mode=0o555)
    # /dev holds only the device binds and the links: read-only (in userns mode the child is its owner)
    _mount(None, dev, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC, None)


def _mount_sys(root: str) -> None:
    """/sys: a sysfs of the sandbox's own network namespace, read-only (its class/net shows only
    the sandbox's down loopback, and nothing is mounted under it: no cgroup hierarchy). Where the
    kernel refuses a fresh sysfs, the host's /sys bound read-only without its submounts (no
    cgroupfs), its network folders covered by empty read-only mounts."""
    dst = _inside(root, "/sys")
    os.makedirs(dst, mode=0o555, exist_ok=True)
    flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    try:
        _mount("sysfs", dst, "sysfs", flags, None)
        return
    except SetupError:
        pass
    if not os.path.isdir("/sys"):
        return
    _bind_ro(root, "/sys", recursive=False)
    for sub in ("/sys/class/net", "/sys/devices/virtual/net", "/sys/fs/cgroup"):
        if os.path.isdir(_inside(root, sub)):
            _mount("tmpfs", _inside(root, sub), "tmpfs", flags, "size=4k,nr_inodes=16,mode=0555")


def _own_cgroup2() -> str | None:
    """The cgroup v2 folder this process is in (``/proc/self/cgroup``'s ``0::`` line under the
    cgroup2 mount of ``/proc/self/mountinfo``), or None."""
    try:
        own = next(ln.split("::", 1)[1] for ln in open("/proc/self/cgroup").read().splitlines()
                   if ln.startswith("0::"))
        mnt = next(ln.split(" - ")[0].split()[4] for ln in open("/proc/self/mountinfo")
                   if ln.split(" - ")[1].split()[0] == "cgroup2")
    except (OSError, StopIteration, IndexError):
        return None
    return os.path.join(mnt, own.lstrip("/"))


def enter_root(cfg: dict) -> None:
    """Step 4: join the cgroup, pivot into the new root, detach the old one, remount / read-only.

    The files in which the kernel counts the run's out-of-memory kills (v2 ``memory.events``,
    v1 ``memory.oom_control``) are opened first, for :func:`supervise` (the child never holds
    them: Python opens files non-inheritable)."""
    fds = []
    for cg in cfg.get("cgroups") or []:
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write("0")
    dirs = list(cfg.get("cgroups") or [])
    if cfg.get("cgroup_self"):  # a systemd scope made for this run holds the launcher already
        own = _own_cgroup2()
        if own is None:
            raise SetupError(0, "find the systemd scope's cgroup of this run")
        dirs.append(own)
    for cg in dirs:
        for name in ("memory.events", "memory.oom_control"):
            try:
                fds.append(os.open(os.path.join(cg, name), os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                continue
    cfg["oom_fds"] = fds
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


# seccomp (x86_64, aarch64): what the child and everything it starts may not call. Reference:
# Docker's default profile (moby profiles/seccomp/default.json) and systemd-nspawn's default
# filter; both are allow-lists, this is a deny-list of the kernel surfaces a course's code never
# needs, so anything not named here stays allowed. The differences from Docker's default are
# listed in docs/INSTRUCTORS.md ("The sandbox's seccomp filter"). Four groups:
# - memory no budget would see: memfd_create/memfd_secret (file memory outside the scratch
#   tmpfs), SysV shmget/msgget and POSIX mq_open (IPC memory, in the host's IPC namespace before
#   ``--ipc``), a new user namespace via unshare/clone (its own tmpfs mounts), setns, clone3 (its
#   flags cannot be inspected: ENOSYS makes the C library fall back to clone), raising a socket's
#   buffers (SO_SNDBUF, SO_RCVBUF and their FORCE forms: unread socket data is kernel memory);
# - state that outlives the run or crosses it: the kernel keyrings (add_key, keyctl, request_key:
#   a key added to the per-uid keyring in root mode outlived the run), socket families other
#   than AF_UNIX, AF_INET and AF_INET6 (AF_VSOCK is not network-namespaced: a VM-wide port space;
#   AF_NETLINK, AF_PACKET, AF_ALG, AF_XDP, AF_BLUETOOTH, ... are kernel surface only);
# - kernel surfaces with a record of exploits and no use in course code: io_uring_*,
#   userfaultfd, bpf, perf_event_open, ptrace, process_vm_readv/writev, kcmp, pidfd_getfd,
#   name_to_handle_at/open_by_handle_at, fanotify_init, personality;
# - what needs a capability the child no longer has (refused by the kernel anyway; named so that
#   a kernel bug in a capability check is not the only wall): mount and the new mount API,
#   pivot_root, chroot, modules, kexec, reboot, swap, acct, quotas, clocks, syslog, host names.
# Refused calls fail with EPERM (EAFNOSUPPORT for a refused socket family); another ABI (x32,
# i386 through int 0x80) is refused as a whole.
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_DENY = {  # name: (x86_64, aarch64); None where the architecture has no such call
    "memfd_create": (319, 279), "memfd_secret": (447, 447), "shmget": (29, 194), "msgget": (68, 186),
    "mq_open": (240, 180), "setns": (308, 268), "unshare": (272, 97),
    "add_key": (248, 217), "keyctl": (250, 219), "request_key": (249, 218),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "userfaultfd": (323, 282), "bpf": (321, 280), "perf_event_open": (298, 241), "ptrace": (101, 117),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kcmp": (312, 272),
    "pidfd_getfd": (438, 438), "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
    "fanotify_init": (300, 262), "personality": (135, 92),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "move_mount": (429, 429), "open_tree": (428, 428), "mount_setattr": (442, 442),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "reboot": (169, 142), "swapon": (167, 224),
    "swapoff": (168, 225), "acct": (163, 89), "quotactl": (179, 60), "quotactl_fd": (443, 443),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "clock_adjtime": (305, 266),
    "adjtimex": (159, 171), "syslog": (103, 116), "sethostname": (170, 161), "setdomainname": (171, 162),
    "vhangup": (153, 58), "lookup_dcookie": (212, 18), "nfsservctl": (180, 42), "uselib": (134, None),
    "ustat": (136, None), "sysfs": (139, None), "_sysctl": (156, None), "iopl": (172, None),
    "ioperm": (173, None),
}
_SPECIAL = {"clone": (56, 220), "clone3": (435, 435), "socket": (41, 198), "socketpair": (53, 199),
            "setsockopt": (54, 208)}
NR = {arch: {name: nrs[i] for name, nrs in {**_DENY, **_SPECIAL}.items() if nrs[i] is not None}
      for i, arch in enumerate(("x86_64", "aarch64"))}
# every namespace flag of clone(2): CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
# (CLONE_NEWTIME, 0x80, shares clone's exit-signal byte: unshare/clone3 only, both refused)
CLONE_NEW_ANY = 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
CLONE_NEWUSER, EPERM, ENOSYS, EAFNOSUPPORT = 0x10000000, 1, 38, 97
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
X32_SYSCALL_BIT = 0x40000000


def seccomp_program(arch: str) -> list:
    """The filter as classic BPF (code, jt, jf, k) tuples, jumps resolved from labels."""
    nr = NR[arch]
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, ERRNO = 0x7FFF0000, 0x00050000
    deny = sorted({nr[n] for n in _DENY if n in nr})
    prog: list = [
        (LD, 0, 0, 4),                                # arch
        (JEQ, 0, "eperm", AUDIT_ARCH[arch]),          # another ABI (x32, i386 via int 0x80): refused
        (LD, 0, 0, 0),                                # syscall number
    ]
    if arch == "x86_64":  # x32 calls carry the x86_64 audit arch and numbers with bit 30 set
        prog.append((JGE, "eperm", 0, X32_SYSCALL_BIT))
    prog += [(JEQ, "eperm", 0, n) for n in deny]
    prog += [(JEQ, "enosys", 0, nr["clone3"]), (JEQ, "clone", 0, nr["clone"]), (JEQ, "socket", 0, nr["socket"]),
             (JEQ, "socketpair", 0, nr["socketpair"]), (JEQ, "setsockopt", "allow", nr["setsockopt"])]
    labels: dict = {}
    labels["clone"] = len(prog)
    prog += [(LD, 0, 0, 16),                          # low word of args[0], the flags
             (JSET, "eperm", "allow", CLONE_NEW_ANY)]  # any new namespace: refused
    labels["socket"] = len(prog)
    prog += [(LD, 0, 0, 16),                          # args[0], the family (an int)
             (JEQ, "allow", 0, AF_UNIX), (JEQ, "allow", 0, AF_INET), (JEQ, "allow", "eafnosupport", AF_INET6)]
    labels["socketpair"] = len(prog)
    prog += [(LD, 0, 0, 16), (JEQ, "allow", "eafnosupport", AF_UNIX)]
    labels["setsockopt"] = len(prog)
    prog += [(LD, 0, 0, 24),                          # args[1], the level
             (JEQ, 0, "allow", 1),                    # SOL_SOCKET
             (LD, 0, 0, 32),                          # args[2], the option
             (JEQ, "eperm", 0, 7), (JEQ, "eperm", 0, 8),  # SO_SNDBUF, SO_RCVBUF
             (JEQ, "eperm", 0, 32),                   # SO_SNDBUFFORCE
             (JEQ, "eperm", "allow", 33)]             # SO_RCVBUFFORCE
    for name, ret in (("allow", ALLOW), ("eperm", ERRNO | EPERM), ("enosys", ERRNO | ENOSYS),
                      ("eafnosupport", ERRNO | EAFNOSUPPORT)):  # the verdicts, last: BPF jumps only forward
        labels[name] = len(prog)
        prog.append((RET, 0, 0, ret))
    out = []
    for i, (code, jt, jf, k) in enumerate(prog):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        assert 0 <= jt < 256 and 0 <= jf < 256, (i, jt, jf)
        out.append((code, jt, jf, k))
    return out


def seccomp_filter() -> bool:
    """Install the filter above (needs no_new_privs); False on an architecture it does not know."""
    arch = platform.machine()
    if arch not in NR:
        return False

    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]

    prog = seccomp_program(arch)
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


INODE_BYTES = 1024  # kernel memory of one tmpfs inode with its dentry (~0.9 KiB measured on 6.x), rounded up


def _process_bytes(page: int, precise: bool) -> int:
    """Memory of every process this pid namespace's /proc shows, in bytes: resident pages
    (``statm``, cheap, counts a page shared by N processes N times) or, ``precise``, the
    proportional set size (``smaps_rollup``'s Pss: a page shared by N processes counts 1/N in
    each, so forks that share their parent's copy-on-write pages count once in all)."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if precise:
                try:
                    with open(f"/proc/{name}/smaps_rollup", "rb") as f:
                        total += next(int(ln.split()[1]) for ln in f if ln.startswith(b"Pss:")) * 1024
                    continue
                except (FileNotFoundError, StopIteration):  # kernel threads, or a kernel before 4.14
                    pass
            with open(f"/proc/{name}/statm", "rb") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    return total


class UnixSocketMemory:
    """Kernel memory queued in this network namespace's unix sockets (data sent, not yet read:
    the ``wmem_alloc``/``rmem_alloc`` of each socket, skb overhead included), read from the
    kernel with one ``sock_diag`` dump. Unix sockets are per network namespace, so the dump
    holds exactly the sandbox's own. ``total()`` is None where the kernel has no unix_diag."""

    def __init__(self) -> None:
        self.seq = 0
        try:
            self.sock: socket.socket | None = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4)  # NETLINK_SOCK_DIAG
        except OSError:
            self.sock = None

    def total(self) -> int | None:
        if self.sock is None:
            return None
        self.seq += 1
        # nlmsghdr (len, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, pid) + unix_diag_req
        # (AF_UNIX, protocol, pad, every state, any inode, UDIAG_SHOW_MEMINFO, cookie)
        req = struct.pack("=IHHII", 40, 20, 0x301, self.seq, 0) + struct.pack("=BBHIIIII", 1, 0, 0, 0xFFFFFFFF, 0,
                                                                              0x20, 0xFFFFFFFF, 0xFFFFFFFF)
        total = 0
        try:
            self.sock.send(req)
            while True:
                data = self.sock.recv(1 << 16)
                off = 0
                while off + 16 <= len(data):
                    ln, typ = struct.unpack_from("=IH", data, off)
                    if typ == 3:  # NLMSG_DONE
                        return total
                    if typ == 2 or ln < 16:  # NLMSG_ERROR (no unix_diag in this kernel)
                        self.sock.close()
                        self.sock = None
                        return None
                    a, end = off + 16 + 16, off + ln  # after nlmsghdr + unix_diag_msg: the attributes
                    while a + 4 <= end:
                        alen, atyp = struct.unpack_from("=HH", data, a)
                        if alen < 4:
                            break
                        if atyp == 5 and alen >= 4 + 12:  # UNIX_DIAG_MEMINFO: rmem_alloc, rcvbuf, wmem_alloc, ...
                            rmem, _, wmem = struct.unpack_from("=III", data, a + 4)
                            total += rmem + wmem
                        a += (alen + 3) & ~3
                    off += (ln + 3) & ~3
        except OSError:
            return None


def _oom_count(fds: list) -> int:
    """Processes the kernel killed at the memory limit of the run's cgroups (the ``oom_kill``
    line of v2 ``memory.events`` / v1 ``memory.oom_control``)."""
    n = 0
    for fd in fds:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            for line in os.read(fd, 4096).decode().splitlines():
                if line.startswith("oom_kill "):
                    n += int(line.split()[1])
        except (OSError, ValueError):
            pass
    return n


def _stop_all(pid: int, msg: str) -> int:
    os.write(2, msg.encode())
    os.kill(-1, signal.SIGKILL)  # pid 1 of the namespace: every other process in it
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    return 137


def supervise(pid: int, cfg: dict) -> int:
    """Step 6: reap orphans until the main child ends; stop everything past the memory budget.

    With a cgroup (``oom_fds``) the kernel holds the budget: it charges every page and every
    kernel object the sandbox allocates (anonymous and file memory, tmpfs, socket buffers,
    inodes and dentries, pipes, page tables) and stops a process at the limit; pid 1 then stops
    all the others too (what ``memory.oom.group`` asks of a v2 kernel, done here for v1).
    Without one, pid 1 polls every 50 ms what it can see the kernel hold for the sandbox:
    resident memory of every process (its proportional share, PSS, when the cheap resident sum
    passes the budget), the scratch tmpfs's blocks and inodes, and the unix socket buffers of
    the sandbox's network namespace, and stops the whole sandbox past the budget. That poll is
    not a kernel bound (a burst between two polls, pipe buffers and other kernel objects are
    not seen): :func:`codex_lab.sandbox.run_python` says so and runs only where accepted."""
    budget = int(cfg["memory_budget_mb"]) * 1024 * 1024
    page = os.sysconf("SC_PAGE_SIZE")
    scratch_fd = cfg.get("scratch_fd")
    oom_fds = cfg.get("oom_fds") or []
    oom0 = _oom_count(oom_fds)
    sockets = None if oom_fds else UnixSocketMemory()
    kernel_msg = (f"\n[codex-lab sandbox: the kernel stopped a process at the sandbox's memory budget of "
                  f"{budget >> 20} MiB (all processes plus its files and kernel memory; the run's cgroup limit); "
                  "every process was stopped]\n")
    while True:
        try:
            got, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 125
        if got == pid:
            if oom_fds and _oom_count(oom_fds) > oom0:
                return _stop_all(pid, kernel_msg)
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        if got:
            continue
        if oom_fds:
            if _oom_count(oom_fds) > oom0:
                return _stop_all(pid, kernel_msg)
            time.sleep(0.05)
            continue
        files = 0
        if scratch_fd is not None:
            st = os.fstatvfs(scratch_fd)
            files = (st.f_blocks - st.f_bfree) * st.f_frsize + (st.f_files - st.f_ffree) * INODE_BYTES
        queued = sockets.total() or 0
        procs = _process_bytes(page, precise=False)
        if procs + files + queued > budget:  # resident pages over-count shared ones: look closer
            procs = _process_bytes(page, precise=True)
            if procs + files + queued > budget:
                used = procs + files + queued
                return _stop_all(pid, (
                    f"\n[codex-lab sandbox: the sandbox as a whole used {used >> 20} MiB, over its memory budget of "
                    f"{budget >> 20} MiB (processes {procs >> 20} MiB proportional, files {files >> 20} MiB, "
                    f"unix socket buffers {queued >> 20} MiB); every process was stopped]\n"))
        time.sleep(0.05 if procs + files + queued < budget // 2 else 0.01)  # closer looks near the budget


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
