"""Review round: memory the sandbox's pid 1 does not count (escapes of the memory budget).

Where no cgroup holds the sandbox (userns mode always; root mode on a machine where root
cannot make a memory cgroup, e.g. cgroup v2 without the memory controller delegated), the
budget rests on the launcher's poll of resident memory plus the scratch tmpfs. Two kinds of
memory are neither:

- ``memfd_create`` files (shmem pages not mapped by anyone: not in any process's RSS, not on
  the scratch tmpfs), each under RLIMIT_FSIZE, many of them under RLIMIT_NOFILE;
- a tmpfs the child mounts itself after ``unshare(CLONE_NEWUSER | CLONE_NEWNS)``: dropping
  every capability does not stop an unprivileged process from making a user namespace of its
  own, root there, where it may mount a tmpfs of any size.

- data queued in unix socket buffers (socketpair with SO_SNDBUF/SO_RCVBUF raised, nobody
  reading): kernel memory, up to ~8 MiB per pair, 120 pairs within RLIMIT_NOFILE.

Each test holds about 450 MiB against a budget of 160 MiB (128 memory + 32 disk) and expects the
sandbox to be stopped before it finishes. Root mode is tested with the cgroup disabled (what
such a machine gives); with the cgroup (this machine's v1 hierarchy) both are stopped.
"""

from __future__ import annotations

import pytest

import codex_lab.sandbox as sb
from codex_lab.sandbox import isolation_mode, run_python

MODE = isolation_mode()
needs_ns = pytest.mark.skipif(MODE == "plain", reason="no pid/net/mount namespaces here (plain mode)")

MEMFD = """
import os
chunk = b"\\1" * (1 << 20)
fds = []
for i in range(30):
    fd = os.memfd_create(f"m{i}")
    for _ in range(15):
        os.write(fd, chunk)
    fds.append(fd)
print("DONE", 30 * 15, "MiB", flush=True)
"""

NESTED_TMPFS = """
import ctypes, os
uid, gid = os.getuid(), os.getgid()
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000 | 0x20000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
    print("NO USERNS", ctypes.get_errno())
    raise SystemExit(0)
open("/proc/self/setgroups", "w").write("deny")
open("/proc/self/uid_map", "w").write(f"0 {uid} 1")
open("/proc/self/gid_map", "w").write(f"0 {gid} 1")
os.makedirs("/tmp/x", exist_ok=True)
assert libc.mount(b"none", b"/tmp/x", b"tmpfs", 0, b"size=2g") == 0, os.strerror(ctypes.get_errno())
chunk = b"\\1" * (1 << 20)
for i in range(30):
    with open(f"/tmp/x/f{i}", "wb") as f:
        for _ in range(15):
            f.write(chunk)
print("DONE", 30 * 15, "MiB", flush=True)
"""


SOCKETS = """
import socket
total, keep = 0, []
for i in range(120):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setblocking(False)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30)
    while total < 450 << 20:
        try:
            total += a.send(b"x" * 65536)
        except BlockingIOError:
            break
    keep.append((a, b))
    if total >= 450 << 20:
        print("DONE", total >> 20, "MiB", flush=True)
        break
print("queued", total >> 20, "MiB", flush=True)
"""


@needs_ns
@pytest.mark.parametrize("kind,code", [("memfd", MEMFD), ("nested user namespace tmpfs", NESTED_TMPFS),
                                       ("unix socket buffers", SOCKETS)])
def test_memory_outside_processes_and_scratch_counts_toward_the_budget(kind, code, monkeypatch):
    monkeypatch.setattr(sb, "_cgroups", lambda *a, **k: [])  # a machine where root gets no cgroup
    monkeypatch.setattr(sb, "_systemd_scope_ok", lambda: False)
    monkeypatch.setenv("CODEX_LAB_SANDBOX_MEMORY", "polled")  # the weaker (polled) budget, accepted
    r = run_python(code, guard=False, timeout_s=30, memory_mb=128, disk_mb=32)
    assert "DONE" not in r.stdout, f"{kind}: 450 MiB held against a 160 MiB budget: {r}"
    if kind == "memfd":  # refused by the sandbox's seccomp filter
        assert "PermissionError" in r.stderr and not r.ok, r
    elif kind == "nested user namespace tmpfs":  # no user namespace inside the sandbox
        assert "NO USERNS 1" in r.stdout, r  # EPERM
    else:  # socket buffers stay at the kernel's defaults: what one process can queue is bounded
        queued = int(r.stdout.split("queued")[-1].split()[0]) if "queued" in r.stdout else 0
        assert "PermissionError" in r.stderr or queued <= 160, r
