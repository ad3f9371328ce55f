"""In-namespace launcher (runs as root, pid 1 of a fresh pid/net/mount namespace).

Started by :func:`codex_lab.sandbox.run_python` as ``unshare ... python -I -S _launch.py CONFIG``.
It never imports codex_lab. Steps: private tmpfs over the world-writable folders (/tmp,
/var/tmp, /dev/shm, /run/lock) with the sandbox's own folder bound back at the same path;
empty read-only tmpfs over each hidden path; then fork the real child, which sets its
resource limits, drops to an unprivileged uid/gid and execs Python. This process stays
root (the child cannot signal it) and reaps orphans; when the child ends it exits, and the
kernel kills everything left in the namespace (no daemon survives).
"""

import ctypes
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
PRIVATE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(src: str, target: str, fstype: str, flags: int, data: str) -> None:
    rc = _libc.mount(src.encode(), target.encode(), fstype.encode(), flags, data.encode())
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _expose(path: str) -> None:
    """Make ``path`` reachable by any uid: the first folder on it that others cannot enter
    (say /root, mode 0700, holding a pyenv Python) is covered by an empty tmpfs (0755)
    into which only the one entry on the path is bound back. Repeats for deeper ones."""
    for _ in range(8):
        parts = os.path.realpath(path).split("/")[1:]
        cur, blocked = "/", None
        for i, part in enumerate(parts):
            st = os.stat(cur)
            if not st.st_mode & 0o001:
                blocked = (cur, part)
                break
            cur = os.path.join(cur, part)
        if blocked is None:
            return
        top, entry = blocked
        fd = os.open(os.path.join(top, entry), os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(os.path.join(top, entry)) else 0))
        isdir = os.path.isdir(os.path.join(top, entry))
        _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        target = os.path.join(top, entry)
        if isdir:
            os.mkdir(target, 0o755)
        else:
            open(target, "w").close()
        _mount(f"/proc/self/fd/{fd}", target, "", MS_BIND | MS_REC, "")
        os.close(fd)


def _setup(cfg: dict) -> None:
    for p in cfg.get("expose", []):
        _expose(p)
    work = cfg["workdir"]
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    # the interpreter, its virtual environment or the course's source may live under a folder
    # that is about to turn private (a clone in /tmp, as CI makes): hold them open to bind back
    keep = []
    for p in cfg.get("expose", []):
        rp = os.path.realpath(p)
        if os.path.exists(rp) and any(rp == d or rp.startswith(d + "/") for d in PRIVATE):
            keep.append((rp, os.open(rp, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(rp) else 0)), os.path.isdir(rp)))
    for d in PRIVATE:
        if os.path.isdir(d) and not os.path.islink(d):
            _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777")
    for rp, kfd, isdir in keep:  # bound back read-only at the same path
        if isdir:
            os.makedirs(rp, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(rp), mode=0o755, exist_ok=True)
            open(rp, "a").close()
        _mount(f"/proc/self/fd/{kfd}", rp, "", MS_BIND | MS_REC, "")
        _mount("none", rp, "", MS_BIND | MS_REMOUNT | MS_RDONLY, "")
        os.close(kfd)
    # the sandbox folder was under one of them: bind it back at its own path
    if not os.path.isdir(work):
        os.makedirs(work, mode=0o700)
        _mount(f"/proc/self/fd/{fd}", work, "", MS_BIND, "")
    os.close(fd)
    for p in cfg.get("hide", []):
        if os.path.isdir(p):
            _mount("tmpfs", p, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0555")
        elif os.path.isfile(p):
            _mount("/dev/null", p, "", MS_BIND, "")


def _child(cfg: dict) -> None:
    lim = cfg["limits"]
    for name, value in lim.items():
        resource.setrlimit(getattr(resource, name), (value, value))
    os.chdir(cfg["workdir"])
    if cfg.get("uid") is not None:
        os.setgroups([])
        os.setgid(cfg["gid"])
        os.setuid(cfg["uid"])
    os.setsid()
    os.umask(0o077)
    os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])


def main() -> None:
    cfg = json.loads(sys.argv[1])
    try:
        _setup(cfg)
    except OSError as exc:
        os.write(2, f"codex-lab sandbox: setup failed: {exc}\n".encode())
        os._exit(125)
    pid = os.fork()
    if pid == 0:
        try:
            _child(cfg)
        except BaseException as exc:  # noqa: BLE001 - report and leave
            os.write(2, f"codex-lab sandbox: could not start the child: {exc}\n".encode())
        os._exit(126)
    while True:  # pid 1: reap every orphan until the main child ends
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(125)
        if got == pid:
            os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main()
