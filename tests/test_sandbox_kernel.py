"""Hardening round 3 (issue 42, items 2 and 3): kernel memory and kernel surfaces of the sandbox,
each case run as root (``root`` mode) and as a normal user (uid 65534 via ``setpriv``: ``userns``
mode), the normal user both without a cgroup (the polled budget, refused unless accepted) and
with a cgroup delegated to it (the kernel's bound, as systemd or a container would delegate one).

- kernel memory the old resident-memory poll never saw: unix socket buffers filled by 18
  processes (~0.9 GiB attempted) and an inode bomb in /tmp, /dev/shm, /var/tmp and the work folder
  (1,000,000 files, folders and hard links attempted) are stopped within a 224 MiB budget;
- where no kernel bound can be had the sandbox says so and refuses, unless accepted;
- 62 idle forks of a process with 10 MiB of private memory are not killed under a 576 MiB
  budget (resident memory counted each shared copy-on-write page 63 times);
- vsock, netlink, packet and AF_ALG sockets, add_key/keyctl, io_uring_setup, userfaultfd, bpf and
  SysV shmget fail; /sys/fs/cgroup holds nothing and nothing in /sys, /dev or / is writable;
  /sys/class/net shows only the sandbox's own loopback; tmpfs stops at its inode cap.

Every bomb is bounded (budget 224 MiB, attempts <= ~1 GiB, timeouts of 20 s) so that a failing
bound cannot take the machine down. Cases skip, saying why, where a mode is unavailable.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import codex_lab
import codex_lab.sandbox as sb
from codex_lab.sandbox import SandboxUnavailable, isolation_mode, memory_bound, run_python

PKG = Path(codex_lab.__file__).resolve().parent
BASE = os.path.realpath(sys.base_prefix)
NOBODY = 65534
MODE = isolation_mode()
BUDGET = dict(memory_mb=192, disk_mb=32)  # 224 MiB for the sandbox as a whole
ENV_SITE = next((p for p in sys.path if p.endswith("site-packages")), "")

needs_ns = pytest.mark.skipif(MODE == "plain", reason="no pid/net/mount namespaces here (plain mode)")

# what a driver prints: the SandboxResult, or the refusal, as one JSON line
DRIVER = r'''
import json, site, sys, time
site.addsitedir({env_site!r})
sys.path.insert(0, {course!r})
from codex_lab.sandbox import SandboxUnavailable, isolation_mode, memory_bound, run_python
t = time.monotonic()
try:
    r = run_python({code!r}, guard=False, **{kw!r})
    out = dict(ok=r.ok, rc=r.returncode, stdout=r.stdout, stderr=r.stderr[-3000:], timed_out=r.timed_out)
except SandboxUnavailable as e:
    out = dict(refused=str(e))
out.update(mode=isolation_mode(), bound=memory_bound(), secs=time.monotonic() - t)
print("RESULT" + json.dumps(out))
'''


def _delegated_cgroup() -> tuple[str, list[str]] | None:
    """As root: a cgroup handed to the normal user the way systemd or a container delegates one
    (the folder and its files owned by it, a 1 GiB limit above it), and the shell lines that move
    the user's shell into it. v1: a memory cgroup the user owns; v2: a subtree with memory enabled
    for children and the user's shell in a leaf of it. None where root cannot make one here."""
    name = f"codex-lab-delegated-{secrets.token_hex(4)}"
    v2 = sb._cgroup2_parents() if os.geteuid() == 0 else []
    try:
        if v2:
            d = v2[0] / name
            d.mkdir()
            (d / "memory.max").write_text(str(1 << 30))
            (d / "leaf").mkdir()
            (d / "cgroup.subtree_control").write_text("+memory")
            for p in [d, *d.iterdir(), d / "leaf", *(d / "leaf").iterdir()]:
                os.chown(p, NOBODY, NOBODY)
            return str(d), [f"echo $$ > {d}/leaf/cgroup.procs"]
        own = next((ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                    if "memory" in ln.split(":", 2)[1].split(",")), None)
        if own is None or not Path("/sys/fs/cgroup/memory").is_dir():
            return None
        d = Path("/sys/fs/cgroup/memory") / own.lstrip("/") / name
        d.mkdir()
        (d / "memory.limit_in_bytes").write_text(str(1 << 30))
        for p in [d, *d.iterdir()]:
            os.chown(p, NOBODY, NOBODY)
        return str(d), [f"echo $$ > {d}/cgroup.procs"]
    except OSError:
        return None


def _remove_tree(d: str) -> None:
    for _ in range(100):
        try:
            for sub in sorted(Path(d).glob("*/"), reverse=True):
                if sub.is_dir():
                    sub.rmdir()
            os.rmdir(d)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


def _as_user(code: str, kw: dict, *, accept: bool, delegate: bool) -> dict:
    """Run ``code`` in a sandbox started by the normal user (uid 65534) with this environment,
    from a layout it can reach (the Python installation and the package bound into a world-
    readable folder, in a private mount namespace: nothing on the machine changes)."""
    if os.geteuid() != 0 or MODE == "plain" or not all(shutil.which(t) for t in ("unshare", "setpriv", "mount")):
        pytest.skip("running the sandbox as a normal user needs root (to build its layout), unshare, setpriv and mount")
    from test_sandbox_layouts import _others_can_reach

    if not ENV_SITE or not _others_can_reach(ENV_SITE):
        pytest.skip(f"the environment {ENV_SITE} sits in a folder other users cannot enter")
    deleg = _delegated_cgroup() if delegate else None
    if delegate and deleg is None:
        pytest.skip("root cannot make a cgroup to delegate to the normal user here")
    base = Path(tempfile.mkdtemp(prefix="codex-lab-kernel-"))
    os.chmod(base, 0o755)
    try:
        py_home, course = base / "py", base / "course"
        driver = DRIVER.format(env_site=ENV_SITE, course=str(course), code=code, kw=kw)
        env = "env -i PATH=/usr/bin:/bin HOME=/nonexistent" + (" CODEX_LAB_SANDBOX_MEMORY=polled" if accept else "")
        script = "\n".join([
            "set -e", f"mkdir -p {py_home} {course}/codex_lab",
            f"mount --bind {shlex.quote(BASE)} {py_home}", f"mount --bind {shlex.quote(str(PKG))} {course}/codex_lab",
            *(deleg[1] if deleg else []), f"cd {base}",
            f"setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups --inh-caps=-all --bounding-set=-all "
            f"{env} {py_home}/bin/python3 -c {shlex.quote(driver)}",
        ])
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                           capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if deleg:
            _remove_tree(deleg[0])
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line is not None, r.stdout + r.stderr
    out = json.loads(line[len("RESULT"):])
    if out["mode"] == "plain":
        pytest.skip("unprivileged user namespaces are not available: a normal user gets plain mode here")
    assert out["mode"] == "userns", out
    assert out["bound"] == ("cgroup" if delegate else "polled"), out
    return out


def _as_root(code: str, kw: dict, monkeypatch, *, polled: bool) -> dict:
    if MODE != "root":
        pytest.skip(f"isolation mode is {MODE!r}: needs root")
    if polled:  # a machine where root gets no cgroup (a container without delegation), the poll accepted
        monkeypatch.setattr(sb, "_cgroups", lambda *a, **k: [])
        monkeypatch.setenv("CODEX_LAB_SANDBOX_MEMORY", "polled")
    elif memory_bound() != "cgroup":
        pytest.skip("root cannot make a memory cgroup here")
    t = time.monotonic()
    r = run_python(code, guard=False, **kw)
    return dict(ok=r.ok, rc=r.returncode, stdout=r.stdout, stderr=r.stderr, timed_out=r.timed_out,
                secs=time.monotonic() - t, mode=r.mode)


WHO = ["root", "root_polled", "user_polled", "user_cgroup"]


def _run(who: str, code: str, kw: dict, monkeypatch) -> dict:
    if who.startswith("root"):
        return _as_root(code, kw, monkeypatch, polled=who == "root_polled")
    return _as_user(code, kw, accept=who == "user_polled", delegate=who == "user_cgroup")


SOCKET_BOMB = r'''
import errno, os, socket, time
N, PAIRS = 18, 120  # 18 processes x 120 unix socket pairs x ~440 KiB of default buffers: ~0.9 GiB at most
kids = []
for i in range(N - 1):
    pid = os.fork()
    if pid == 0:
        kids = None
        break
    kids.append(pid)
queued, keep = 0, []
try:
    for _ in range(PAIRS):
        a, b = socket.socketpair()
        a.setblocking(False)
        b.setblocking(False)
        for s in (a, b):
            while True:
                try:
                    queued += s.send(b"x" * 65536)
                except BlockingIOError:
                    break
        keep.append((a, b))
    print("DONE", queued >> 20, flush=True)
except OSError as e:
    print("REFUSED", errno.errorcode.get(e.errno), queued >> 20, flush=True)
time.sleep(4)
if kids is not None:
    for k in kids:
        os.waitpid(k, 0)
'''

INODE_BOMB = r'''
import errno, os, time
me = 0
for i in range(1, 4):  # four processes, up to 250,000 names each (files, folders, hard links): ~1 GiB of slab at most
    if os.fork() == 0:
        me = i
        break
made = 0
where = ("/tmp", "/dev/shm", os.getcwd(), "/var/tmp")[me]
try:
    os.mkdir(f"{where}/d{me}")
    first = f"{where}/d{me}/f"
    open(first, "w").close()
    while made < 250_000:
        p = f"{where}/d{me}/{made}"
        if made % 3 == 0:
            open(p, "w").close()
        elif made % 3 == 1:
            os.mkdir(p)
        else:
            os.link(first, p)
        made += 1
    print("DONE", made, flush=True)
except OSError as e:
    print("STOPPED", errno.errorcode.get(e.errno), made, flush=True)
time.sleep(1)
'''

IDLE_FORKS = r'''
import os, time
block = bytearray(10 << 20)  # ~10 MiB of private memory, shared copy-on-write with every fork
for i in range(0, len(block), 4096):
    block[i] = 1
kids = []
for _ in range(62):
    pid = os.fork()
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
print("ALL", len(kids), "FORKS ENDED")
'''

PROBE = r'''
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
X86 = os.uname().machine == "x86_64"
def call(name, nr, *args):
    r = libc.syscall(nr, *args)
    print("CALL", name, "OK" if r >= 0 else errno.errorcode.get(ctypes.get_errno()), flush=True)
for fam, typ, name in ((40, socket.SOCK_STREAM, "AF_VSOCK"), (16, socket.SOCK_RAW, "AF_NETLINK"),
                       (17, socket.SOCK_RAW, "AF_PACKET"), (38, socket.SOCK_SEQPACKET, "AF_ALG")):
    try:
        socket.socket(fam, typ)
        print("SOCKET", name, "OK")
    except OSError as e:
        print("SOCKET", name, errno.errorcode.get(e.errno))
call("add_key", 248 if X86 else 217, b"user", b"codex-lab", b"x", ctypes.c_size_t(1), ctypes.c_int(-4))
call("keyctl", 250 if X86 else 219, 0, -4, 0)
call("request_key", 249 if X86 else 218, b"user", b"codex-lab", None, 0)
call("io_uring_setup", 425, 4, ctypes.create_string_buffer(120))
call("userfaultfd", 323 if X86 else 282, 0)
call("bpf", 321 if X86 else 280, 0, 0, 0)
call("shmget", 29 if X86 else 194, 0, 1 << 20, 0o1000 | 0o600)
print("CGROUPFS", os.listdir("/sys/fs/cgroup") if os.path.isdir("/sys/fs/cgroup") else "absent")
print("NET", sorted(os.listdir("/sys/class/net")))
for d in ("/sys/fs/cgroup", "/sys", "/dev", "/"):
    try:
        open(d + "/planted", "w").close()
        print("WRITE", d, "OK")
    except OSError as e:
        print("WRITE", d, errno.errorcode.get(e.errno))
n = 0
try:
    while n < 100_000:
        open(f"/tmp/i{n}", "w").close()
        n += 1
    print("INODES", n, "NO CAP")
except OSError as e:
    print("INODES", n, errno.errorcode.get(e.errno))
'''


@needs_ns
@pytest.mark.parametrize("who", WHO)
def test_socket_buffer_bomb_is_stopped_within_the_budget(who, monkeypatch):
    r = _run(who, SOCKET_BOMB, dict(timeout_s=20, **BUDGET), monkeypatch)
    # each process reports what it queued (DONE when all its 120 pairs filled, ~53 MiB; REFUSED when
    # the kernel said no first). One process may finish before a poll strikes (CI saw "DONE 53"
    # under the polled bound); what must hold is the whole: all 18 together (~0.9 GiB attempted)
    # stopped near the budget. Where a cgroup holds it (root, user_cgroup) the kernel refuses at the
    # budget itself; the 64 MiB allowed there is its charge batching and the processes' own pages.
    # Where only the poll holds it, the allowance is half a budget (112 MiB): the bomb fills buffers
    # at ~3.4 GB/s here (measured: 169 MiB between two looks 50 ms apart), and on a busy machine the
    # poll's next look comes late by scheduling, not by its own pause (CI under load saw 292 MiB;
    # 4 busy loops beside it gave up to 290 MiB over 10 runs). A poll that did not count socket
    # buffers would let all 18 finish (~950 MiB): this still tells the two apart, with room.
    over = 64 if who in ("root", "user_cgroup") else 112
    queued = sum(int(m) for m in re.findall(r"(?:DONE|REFUSED \w+) (\d+)", r["stdout"]))
    assert queued <= 224 + over, f"{who}: the processes queued {queued} MiB of socket buffers: {r}"
    assert r["stdout"].count("DONE") < 18, f"{who}: all 18 processes queued their ~53 MiB: {r}"
    assert not r["ok"] and not r["timed_out"] and r["secs"] < 15, r  # stopped, in seconds, not at the timeout
    assert "memory budget of 224 MiB" in r["stderr"], r
    used = re.search(r"used (\d+) MiB", r["stderr"])
    if used:  # the poll's reading when it struck: over the budget by at most the allowance above
        assert int(used.group(1)) <= 224 + over, r


@needs_ns
@pytest.mark.parametrize("who", WHO)
def test_inode_bomb_stops_at_the_tmpfs_inode_cap(who, monkeypatch):
    r = _run(who, INODE_BOMB, dict(timeout_s=20, **BUDGET), monkeypatch)
    assert "DONE" not in r["stdout"], f"{who}: 250,000 names made in one of the sandbox's folders: {r}"
    made = [int(m) for m in re.findall(r"STOPPED \w+ (\d+)", r["stdout"])]
    # one tmpfs (its cap 256 inodes per MiB of disk: 8192) holds /tmp, /dev/shm, /var/tmp and the folder
    assert len(made) == 4 and sum(made) <= 256 * BUDGET["disk_mb"], r
    assert "STOPPED ENOSPC" in r["stdout"] and not r["timed_out"], r


@needs_ns
@pytest.mark.parametrize("who", WHO)
def test_idle_forks_are_not_killed_for_memory_they_share(who, monkeypatch):
    # 63 processes sharing one parent's ~20 MiB: resident memory summed per process said ~1.2 GiB
    r = _run(who, IDLE_FORKS, dict(timeout_s=30, memory_mb=512, disk_mb=64), monkeypatch)
    assert r["ok"] and "ALL 62 FORKS ENDED" in r["stdout"], r
    assert "memory budget" not in r["stderr"], r


@needs_ns
@pytest.mark.parametrize("who", ["root", "user_polled"])
def test_kernel_surfaces_are_closed(who, monkeypatch):
    r = _run(who, PROBE, dict(timeout_s=30, **BUDGET), monkeypatch)
    out = r["stdout"]
    for fam in ("AF_VSOCK", "AF_NETLINK", "AF_PACKET", "AF_ALG"):
        assert re.search(rf"SOCKET {fam} (EAFNOSUPPORT|EPERM|EACCES)\b", out), (fam, r)
    for call in ("add_key", "keyctl", "request_key", "io_uring_setup", "userfaultfd", "bpf", "shmget"):
        assert re.search(rf"CALL {call} (EPERM|EACCES)\b", out), (call, r)
    assert "CGROUPFS []" in out or "CGROUPFS absent" in out, r  # no hierarchy mounted inside
    assert "NET ['lo']" in out, r  # the sandbox's own down loopback, none of the host's interfaces
    assert "WRITE" in out and " OK" not in "".join(ln for ln in out.splitlines() if ln.startswith("WRITE")), r
    m = re.search(r"INODES (\d+) (\w+)", out)
    assert m and m.group(2) == "ENOSPC" and int(m.group(1)) <= 256 * BUDGET["disk_mb"], r


@needs_ns
def test_without_a_kernel_bound_the_sandbox_refuses_unless_accepted(monkeypatch):
    if MODE == "root":
        monkeypatch.setattr(sb, "_cgroups", lambda *a, **k: [])
        monkeypatch.setattr(sb, "_systemd_scope_ok", lambda: False)
        monkeypatch.delenv("CODEX_LAB_SANDBOX_MEMORY", raising=False)
        with pytest.raises(SandboxUnavailable) as info:
            run_python("print(1)")
        assert "CODEX_LAB_SANDBOX_MEMORY=polled" in str(info.value) and "\n" not in str(info.value)
        assert run_python("print(1)", accept_polled_memory=True).ok
        monkeypatch.setenv("CODEX_LAB_SANDBOX_MEMORY", "polled")
        assert run_python("print(1)").ok
    r = _as_user("print(1)", {}, accept=False, delegate=False)  # the normal user: no cgroup here, nothing accepted
    assert "CODEX_LAB_SANDBOX_MEMORY=polled" in r.get("refused", ""), r
