"""The sandbox's own root filesystem, steps 1-4 of the launcher (:mod:`codex_lab.sandbox._launch`):
mount flags and calls, read-only binds of the system folders and exposed paths (symlinks on the
way recreated, submounts read-only too), a fresh /proc, a minimal /dev, /sys of the sandbox's
network namespace, a per-run /etc of copies, the one scratch tmpfs (the disk budget), empty
mounts over hidden paths; then entering it: joining the run's cgroup, ``pivot_root``, detaching
the old root.

/etc is not bound from the host: a file bound into two sandboxes running at once is one inode
in both, and an ``flock`` on it (allowed on a read-only file) is seen by the other, so
``/etc/hostname`` carried bits between two concurrent runs. The few /etc files a Python child
uses (:data:`ETC_FILES`, :data:`ETC_TREES`) are copied into a tmpfs of the run's own, read-only
once built; the rest of /etc (hostname, machine-id, the host's service configuration) is absent.
The links copied as links (alternatives, fontconfig's conf.d) lead where the host's do, mostly
into /usr, which like every other read-only bind (system folders, the Python installation, the
/dev nodes) is still one inode for all runs.
"""

import ctypes
import os
import platform
import shutil
import stat
import sys

from ._launch_base import SetupError, _libc

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
ST_FLAGS = ((1, MS_RDONLY), (2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC), (1024, MS_NOATIME),
            (2048, MS_NODIRATIME), (4096, MS_RELATIME))
MNT_DETACH = 2
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # not /etc: see ETC_FILES
# /etc files a child uses (traced: the dynamic linker, name-service and passwd lookups, the time
# zone, mimetypes, platform, ssl, socket's services and protocols), each copied (symlinks
# followed) into the run's own /etc; absent on the host, absent in the sandbox. shadow and
# gshadow are empty placeholders (see _copy_etc_file): the refusal to read them stays as it was.
ETC_FILES = ("ld.so.cache", "ld.so.preload", "nsswitch.conf", "passwd", "group", "shadow", "gshadow", "hosts",
             "host.conf", "gai.conf", "resolv.conf", "services", "protocols", "networks", "localtime", "timezone",
             "locale.alias", "mime.types", "os-release", "ssl/openssl.cnf")
# /etc folders copied whole: their symlinks recreated as symlinks (alternatives: /usr/bin/cc ->
# /etc/alternatives/cc -> the compiler; fonts: fontconfig's conf.d links), files copied
# (Debian's python3.X/sitecustomize.py, which the system Python's site imports)
ETC_TREES = ("alternatives", "fonts", "python3", "python%d.%d" % sys.version_info[:2])
ETC_MAX_FILE_BYTES = 16 << 20  # a config file; anything larger is not copied
SYS_MOUNT_SETATTR, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 442, 0x8000, 1  # same number on x86_64 and aarch64
DEVICES = ("null", "zero", "full", "random", "urandom")
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}


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


def _seal_parents(root: str, exposed, scratch_points, work: str) -> None:
    """Make the folders created above exposed paths that sit in a scratch folder read-only.

    An environment or clone under /tmp (as CI makes) is bound at its own path, so the folders
    above it (``/tmp/clone`` for ``/tmp/clone/.venv``) are created in the sandbox's writable
    /tmp. In ``userns`` mode the child owns them: it could write a module beside the bound
    package, on a path the checker imports from, or chmod them. Each topmost such folder is
    bound onto itself read-only (its binds below stay read-only): nothing can be created,
    renamed or chmod-ed there (EROFS), and a mount point cannot be removed (EBUSY)."""
    tops = set()
    for p in exposed:
        for at in scratch_points:
            rel = os.path.relpath(p, at)
            if rel.startswith("..") or rel == ".":
                continue
            first = rel.split("/")[0]
            top = os.path.join(at, first)
            if top != p and not (work + "/").startswith(top + "/"):  # a created folder, never the child's own
                tops.add(top)
    for top in sorted(tops):
        dst = _inside(root, top)
        _mount(dst, dst, None, MS_BIND | MS_REC, None)
        _mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _lock_flags(dst), None)
        _submounts_ro(dst)


def _submounts_ro(dst: str) -> None:
    """Make every mount below ``dst`` read-only too (a read-only remount of a recursive bind
    covers only its top mount: a file bound by a container runtime, or anything mounted
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


def _etc_plan() -> list:
    """What the run's /etc holds: ``(path inside /etc, kind, source)`` with kind ``"dir"``,
    ``"link"`` (source: the link's target, recreated as it is) or ``"file"`` (source: the host
    file to copy, symlinks followed), for :data:`ETC_FILES` and :data:`ETC_TREES` as the host has them."""
    plan: list = []
    made: set = set()

    def parents(rel: str) -> None:
        d = os.path.dirname(rel)
        if d and d not in made:
            parents(d)
            made.add(d)
            plan.append((d, "dir", None))

    for rel in ETC_FILES:
        src = os.path.join("/etc", rel)
        if os.path.isfile(src):  # follows a symlink (os-release -> ../usr/lib/os-release): the content is copied
            parents(rel)
            plan.append((rel, "file", src))
    for top in ETC_TREES:
        base = os.path.join("/etc", top)
        if os.path.islink(base) or not os.path.isdir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):  # never follows links into other folders
            rel_dir = os.path.relpath(dirpath, "/etc")
            parents(os.path.join(rel_dir, "x"))
            for name in sorted(dirnames + filenames):
                src = os.path.join(dirpath, name)
                rel = os.path.join(rel_dir, name)
                if os.path.islink(src):
                    plan.append((rel, "link", os.readlink(src)))
                elif name in filenames and os.path.isfile(src):
                    plan.append((rel, "file", src))
    return plan


def _copy_etc_file(src: str, dst: str) -> None:
    """Copy one /etc file for the child: content and permission bits, owned by the launcher. A file
    the child could not read on the host (not world-readable: shadow, gshadow) becomes an empty
    placeholder with the same bits, so no byte of it enters the sandbox and reading it is refused
    as before; so does a file over :data:`ETC_MAX_FILE_BYTES` or one the launcher cannot read."""
    st = os.stat(src)
    data = b""
    if st.st_mode & stat.S_IROTH and st.st_size <= ETC_MAX_FILE_BYTES:
        try:
            with open(src, "rb") as f:
                data = f.read(ETC_MAX_FILE_BYTES)
        except OSError:
            data = b""
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o755)  # never set-id or writable by others
    finally:
        os.close(fd)


def _size(path: str) -> int:
    """Bytes of ``path`` (symlinks followed), 0 if it vanished since it was listed."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _build_etc(root: str) -> str:
    """The run's own /etc (:data:`ETC_FILES`, :data:`ETC_TREES`) on a tmpfs sized for it; returns
    its path. Left writable here (exposed paths and hide mounts may still add to it);
    :func:`build_root` makes it read-only once the root is complete."""
    plan = _etc_plan()
    page = 4096
    # every file takes whole pages of the tmpfs; 256 KiB and 256 inodes spare for the links
    # and mount points that exposed and hidden paths may still add under /etc
    size = sum(-(-min(_size(src), ETC_MAX_FILE_BYTES) // page) * page for _, kind, src in plan if kind == "file")
    size += 256 << 10
    etc = _inside(root, "/etc")
    os.makedirs(etc, mode=0o755, exist_ok=True)
    _mount("tmpfs", etc, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},nr_inodes={len(plan) + 256},mode=0755")
    for rel, kind, src in plan:
        dst = os.path.join(etc, rel)
        if kind == "dir":
            os.makedirs(dst, mode=0o755, exist_ok=True)
        elif kind == "link":
            os.symlink(src, dst)
        elif os.path.isfile(src):  # still there (a file removed on the host meanwhile is left out)
            _copy_etc_file(src, dst)
    return etc


def _outermost(paths) -> list:
    """Resolved paths with those inside another one dropped (bound once, with their parent)."""
    out: list = []
    for p in sorted({os.path.realpath(p) for p in paths if os.path.exists(p)}):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def build_root(cfg: dict) -> None:
    """Steps 1-3 of the launcher's docstring (:mod:`codex_lab.sandbox._launch`), into ``cfg['root']``
    (an empty folder)."""
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
    # /etc: per-run copies, not the host's inodes (an flock on a shared one crosses between runs)
    etc = _build_etc(root)
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
    # last (the hidden paths above may need folders made there first): the folders above exposed paths in /tmp
    _seal_parents(root, _outermost(system + list(cfg.get("expose", []))), ("/tmp", "/var/tmp", "/dev/shm"), work)
    # /etc holds only the copies: read-only like the host's (in userns mode the child is its owner)
    _mount(None, etc, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
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
