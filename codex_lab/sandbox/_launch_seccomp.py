"""The seccomp filter of the sandbox's child (part of step 5 of :mod:`codex_lab.sandbox._launch`):
the system calls and socket families refused to the child and everything it starts, as a
classic BPF program built per architecture, and its installation.
"""

import ctypes
import platform

from ._launch_base import SetupError, _libc


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
# - state that outlives the run or crosses it: whatever lets one run observe another through a file
#   both can open (a read-only bind of /usr, /dev/null): file locks (flock, and fcntl's record and
#   open-file-description locks, F_GETLK/F_SETLK/F_SETLKW and their OFD forms), leases and directory
#   notifications (fcntl F_SETLEASE/F_GETLEASE/F_NOTIFY) and inotify watches (an IN_OPEN or
#   IN_ACCESS event on a shared file fires for the other run's reads); the kernel keyrings (add_key, keyctl, request_key:
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
    "fanotify_init": (300, 262), "personality": (135, 92), "flock": (73, 32),
    "inotify_init": (253, None), "inotify_init1": (294, 26), "inotify_add_watch": (254, 27),
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
            "setsockopt": (54, 208), "fcntl": (72, 25)}
# fcntl's lock commands, F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW, then the
# lease and notification ones, F_SETLEASE, F_GETLEASE, F_NOTIFY (the same numbers on both architectures)
FCNTL_LOCKS = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)
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
             (JEQ, "socketpair", 0, nr["socketpair"]), (JEQ, "fcntl", 0, nr["fcntl"]),
             (JEQ, "setsockopt", "allow", nr["setsockopt"])]
    labels: dict = {}
    labels["clone"] = len(prog)
    prog += [(LD, 0, 0, 16),                          # low word of args[0], the flags
             (JSET, "eperm", "allow", CLONE_NEW_ANY)]  # any new namespace: refused
    labels["socket"] = len(prog)
    prog += [(LD, 0, 0, 16),                          # args[0], the family (an int)
             (JEQ, "allow", 0, AF_UNIX), (JEQ, "allow", 0, AF_INET), (JEQ, "allow", "eafnosupport", AF_INET6)]
    labels["socketpair"] = len(prog)
    prog += [(LD, 0, 0, 16), (JEQ, "allow", "eafnosupport", AF_UNIX)]
    labels["fcntl"] = len(prog)
    prog += [(LD, 0, 0, 24)]                          # args[1], the command
    prog += [(JEQ, "eperm", 0, c) for c in FCNTL_LOCKS[:-1]] + [(JEQ, "eperm", "allow", FCNTL_LOCKS[-1])]
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
