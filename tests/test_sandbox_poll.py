"""The polled memory budget's two readers (:mod:`codex_lab.sandbox._launch_supervise`), each
held to its plain reference: the strided sum of a ``sock_diag`` reply to the message-by-message
parse, and the round-robin process estimate to the exact proportional reading."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from codex_lab.sandbox import _launch_supervise as sup

needs_diag = pytest.mark.skipif(sup.UnixSocketMemory().sock is None, reason="no sock_diag netlink here")


@needs_diag
def test_strided_socket_sum_equals_the_message_by_message_parse(monkeypatch):
    pairs = []
    for i in range(300):  # several reply buffers' worth of messages, each socket holding a different amount
        a, b = socket.socketpair()
        a.setblocking(False)
        a.send(b"x" * (100 + 37 * i))
        pairs.append((a, b))
    try:
        fast = sup.UnixSocketMemory().total()
        seen = []
        real = sup._uniform_meminfo
        monkeypatch.setattr(sup, "_uniform_meminfo", lambda data: seen.append(real(data)) or None)
        plain = sup.UnixSocketMemory().total()
    finally:
        for a, b in pairs:
            a.close()
            b.close()
    assert any(v is not None for v in seen), "the strided sum never took a buffer: the fast path is untested"
    # other processes' sockets in this network namespace may queue a few bytes between the two dumps
    assert fast is not None and plain is not None and abs(fast - plain) < 64 * 1024, (fast, plain)
    assert plain >= sum(100 + 37 * i for i in range(300))  # every queued byte counted (plus skb overhead)


def test_strided_socket_sum_refuses_a_buffer_it_cannot_read_in_strides():
    msg = struct.pack("=IHHII", 80, 20, 2, 1, 0) + bytes(16) + struct.pack("=HH", 40, 5) + struct.pack("=9I", *range(1, 10))
    msg += bytes(80 - len(msg))
    assert sup._uniform_meminfo(msg * 3) == 3 * (1 + 3)  # rmem_alloc 1 + wmem_alloc 3, three messages
    other = struct.pack("=IHHII", 84, 20, 2, 1, 0) + msg[16:] + bytes(4)  # one message 4 bytes longer
    assert sup._uniform_meminfo(msg + other) is None
    moved = msg[:32] + struct.pack("=HH", 5, 9) + bytes(4) + msg[32:76]  # meminfo after another attribute
    assert sup._uniform_meminfo(msg + moved) is None
    done = struct.pack("=IHHII", 20, 3, 2, 1, 0) + bytes(4)
    assert sup._uniform_meminfo(done) is None  # NLMSG_DONE goes to the plain parse, which ends the dump


def test_process_estimate_counts_shared_pages_once_and_sees_a_copy_on_write_burst():
    page = os.sysconf("SC_PAGE_SIZE")
    block = bytearray(os.urandom(64 << 20))  # 64 MiB of private pages
    r, w = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:  # the fork shares every page of the block until it writes one
        os.read(r, 1)
        block[::page] = b"y" * len(block[::page])  # one byte a page: all 64 MiB become its own
        os.write(w2, b"!")
        os.read(r, 1)
        os._exit(0)
    try:
        both = frozenset({os.getpid(), pid})  # this process and its fork: the machine's others move on their own
        mem = sup.ProcessMemory(page, both)
        shared = mem.exact()
        rss = sum(sup._resident(page, both).values())
        assert rss - shared > 48 << 20  # the resident sum counted the shared 64 MiB twice; Pss once
        for _ in range(3):  # each process's turn (two processes), nothing changed
            est = mem.reading()
        # the estimate after a full turn equals the exact reading (pytest's own allocations: a few MiB at most)
        assert abs(est - mem.exact()) < 8 << 20
        os.write(w, b"!")
        os.read(r2, 1)  # the fork now holds its own 64 MiB, its resident size unchanged
        assert mem.exact() - shared > 48 << 20  # the exact reading sees the copy-on-write burst
        for _ in range(3):
            est = mem.reading()
        assert est - shared > 48 << 20  # and so does the estimate once the fork's turn comes again
    finally:
        os.write(w, b"!")
        os.waitpid(pid, 0)
