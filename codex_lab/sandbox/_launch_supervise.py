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
