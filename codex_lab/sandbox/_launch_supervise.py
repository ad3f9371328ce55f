"""Step 6 of the launcher (:mod:`codex_lab.sandbox._launch`): pid 1 of the namespace, which reaps
orphans and holds the memory budget: with a cgroup, by watching the kernel's out-of-memory
count; without one, by polling what it can see the kernel hold for the sandbox (proportional
process memory, the scratch tmpfs's blocks and inodes, unix socket buffers).
"""

import os
import signal
import socket
import struct
import time


INODE_BYTES = 1024  # kernel memory of one tmpfs inode with its dentry (~0.9 KiB measured on 6.x), rounded up


def _resident(page: int, only: frozenset | None = None) -> dict:
    """Resident bytes of every process this pid namespace's /proc shows, or of the pids in
    ``only`` (``statm``: cheap, but a page shared by N processes counts N times), keyed by pid."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (only is None or int(name) in only):
            try:
                with open(f"/proc/{name}/statm", "rb") as f:
                    out[int(name)] = int(f.read().split()[1]) * page
            except (OSError, IndexError, ValueError):
                pass
    return out


def _proportional(pid: int) -> int | None:
    """One process's proportional set size in bytes (``smaps_rollup``'s Pss: a page shared by N
    processes counts 1/N in each); None for kernel threads, a kernel before 4.14 or a process gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith(b"Pss:")) * 1024
    except (OSError, StopIteration, IndexError, ValueError):
        return None


class ProcessMemory:
    """Memory of the sandbox's processes, in bytes, counted so that forks sharing their parent's
    copy-on-write pages count them once (62 idle forks of a 10 MiB process are ~10 MiB, not 630).

    The proportional figure (Pss) is exact but slow: ~1 ms a process, ~20 ms for 18 of them on a
    busy machine, time in which a socket buffer bomb queues ~80 MiB unseen. So each reading takes
    every process's resident size (cheap) and refreshes the Pss of one process, in turn; a
    process counts as its last Pss plus whatever resident memory it gained since, never more than
    its resident size. A page a process unshares without growing (a copy-on-write write) shows at
    its next turn; :meth:`exact` refreshes them all, which the poll does before it ever stops a
    sandbox, so a stop never rests on an estimate."""

    def __init__(self, page: int, only: frozenset | None = None) -> None:
        """``page``: the page size in bytes; ``only``: the pids to count (None: every process
        /proc shows, which in the sandbox's pid namespace is the sandbox)."""
        self.page, self.turn, self.only = page, 0, only
        self.known: dict = {}  # pid -> (resident bytes when its Pss was read, that Pss)

    def _sum(self, rss: dict) -> int:
        total = 0
        for pid, r in rss.items():
            got = self.known.get(pid)
            # estimate = min(resident, Pss then + resident gained since)
            total += r if got is None else min(r, got[1] + max(0, r - got[0]))
        return total

    def reading(self) -> int:
        rss = _resident(self.page, self.only)
        self.known = {pid: v for pid, v in self.known.items() if pid in rss}
        if rss:
            pid = sorted(rss)[self.turn % len(rss)]
            self.turn += 1
            pss = _proportional(pid)
            if pss is not None:
                self.known[pid] = (rss[pid], pss)
        return self._sum(rss)

    def exact(self) -> int:
        rss = _resident(self.page, self.only)
        self.known = {}
        for pid, r in rss.items():
            pss = _proportional(pid)
            if pss is not None:
                self.known[pid] = (r, pss)
        return self._sum(rss)


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
                fast = _uniform_meminfo(data)
                if fast is not None:  # the common case, summed in C: the poll stays a few ms at thousands of sockets
                    total += fast
                    continue
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


def _uniform_meminfo(data: bytes) -> int | None:
    """rmem_alloc + wmem_alloc summed over one ``sock_diag`` reply buffer, in bytes, where every
    message in it has the same length and carries UNIX_DIAG_MEMINFO at the same offset (what
    the kernel sends for a dump asking only for meminfo); None otherwise (the caller parses the
    buffer message by message). Strided slices of the buffer as 32-bit words do the sum in C:
    parsing thousands of messages in Python took the poll ~20 ms, time in which a socket
    buffer bomb queues tens of MiB past the budget."""
    if len(data) < 16 or len(data) % 4:
        return None
    words = memoryview(data).cast("I")
    ln, typ = words[0], struct.unpack_from("=H", data, 4)[0]
    if typ != 20 or ln < 40 or ln % 4 or len(data) % ln:  # SOCK_DIAG_BY_FAMILY messages of one length
        return None
    step, a = ln // 4, 32  # the attributes start after nlmsghdr (16 bytes) + unix_diag_msg (16 bytes)
    while a + 4 <= ln:  # find UNIX_DIAG_MEMINFO (type 5) in the first message
        alen, atyp = struct.unpack_from("=HH", data, a)
        if alen < 4:
            return None
        if atyp == 5 and alen >= 16:
            break
        a += (alen + 3) & ~3
    else:
        return None
    n = len(data) // ln
    head, attr = words[0::step], words[a // 4::step]
    if head.tolist().count(ln) != n or attr.tolist().count(words[a // 4]) != n:
        return None
    types = memoryview(data).cast("H")[2::ln // 2]  # nlmsg_type of every message
    if types.tolist().count(20) != n:
        return None
    # sk_meminfo: rmem_alloc, rcvbuf, wmem_alloc, ... (the words after the attribute's header)
    return sum(words[a // 4 + 1::step]) + sum(words[a // 4 + 3::step])


def _files(scratch_fd: int | None) -> int:
    """Bytes the scratch tmpfs holds: its blocks plus its inodes at :data:`INODE_BYTES` each."""
    if scratch_fd is None:
        return 0
    st = os.fstatvfs(scratch_fd)
    return (st.f_blocks - st.f_bfree) * st.f_frsize + (st.f_files - st.f_ffree) * INODE_BYTES


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
    Without one, pid 1 polls what it can see the kernel hold for the sandbox: the memory of
    every process (:class:`ProcessMemory`: proportional, read exactly before any stop), the
    scratch tmpfs's blocks and inodes, and the unix socket buffers of the sandbox's network
    namespace (:class:`UnixSocketMemory`), and stops the whole sandbox past the budget. It polls
    every 20 ms below half the budget, every 10 ms above, and without a pause while the use
    grows fast enough to pass the budget before the next look. Each look costs ~1 ms however
    many processes and sockets there are, so a burst gets little time unseen. That poll is
    not a kernel bound (a burst between two polls, pipe buffers and other kernel objects are
    not seen): :func:`codex_lab.sandbox.run_python` says so and runs only where accepted."""
    budget = int(cfg["memory_budget_mb"]) * 1024 * 1024
    scratch_fd = cfg.get("scratch_fd")
    oom_fds = cfg.get("oom_fds") or []
    oom0 = _oom_count(oom_fds)
    sockets = None if oom_fds else UnixSocketMemory()
    memory = ProcessMemory(os.sysconf("SC_PAGE_SIZE"))
    kernel_msg = (f"\n[codex-lab sandbox: the kernel stopped a process at the sandbox's memory budget of "
                  f"{budget >> 20} MiB (all processes plus its files and kernel memory; the run's cgroup limit); "
                  "every process was stopped]\n")
    last = (0, time.monotonic())  # the previous reading (bytes) and when it was taken
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
        files, queued, procs = _files(scratch_fd), sockets.total() or 0, memory.reading()
        if procs + files + queued > budget:  # an estimate passed the budget: read every process exactly, then
            procs = memory.exact()  # the files and sockets again (they kept growing while it read)
            files, queued = _files(scratch_fd), sockets.total() or 0
            if procs + files + queued > budget:
                used = procs + files + queued
                return _stop_all(pid, (
                    f"\n[codex-lab sandbox: the sandbox as a whole used {used >> 20} MiB, over its memory budget of "
                    f"{budget >> 20} MiB (processes {procs >> 20} MiB proportional, files {files >> 20} MiB, "
                    f"unix socket buffers {queued >> 20} MiB); every process was stopped]\n"))
        # closer looks near the budget, and none skipped while it grows fast enough to pass it before the next one
        used, now = procs + files + queued, time.monotonic()
        pause = 0.02 if used < budget // 2 else 0.01
        rate = max(0.0, (used - last[0]) / max(now - last[1], 1e-6))  # bytes/s since the previous reading
        last = (used, now)
        if used + rate * (pause + 0.01) > budget:
            continue
        time.sleep(pause)
