"""On-disk building blocks of the model registry: version ids, manifests, checksums, atomic
writes, the writer lock, the state journal and the cleaning of dead processes' debris.

:mod:`codex_lab.serve.registry` composes them into :class:`~codex_lab.serve.registry.Registry`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from codex_lab.errors import InputError

try:  # POSIX; on Windows writers are not serialised across processes (documented limitation)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

MANIFEST, STATE, JOURNAL, LOCK = "manifest.json", "state.json", "journal.log", ".lock"
HASHED = ("model.safetensors", "config.json", "tokenizer.json")
# "v" and 4 to 18 digits: zero-padded to 4 below v10000, wider after (v999999999 is followed by
# v1000000000); ids sort by their number (vnum), never as strings; 18 digits keep int() cheap
VERSION_RE = re.compile(r"v[0-9]{4,18}")
MAX_VERSION = 10**18 - 1
_DEBRIS_RE = re.compile(r"^\.(?:staging|trash)-(\d+)-|^\.[^/]*\.tmp-(\d+)$|\.staging-(\d+)$")
STALE_AFTER_S = 24 * 3600  # debris of a live-looking pid older than this is cleaned too (pid reuse)
MAX_JSON_BYTES = 1 << 20
JOURNAL_COMPACT_BYTES = 1 << 16


class ChecksumError(InputError):
    """A version's files do not match the SHA-256 sums in its manifest."""


class RegistryFileError(InputError):
    """A registry file (state, journal, manifest) is truncated or garbage; the message names it."""


def check_version(version: Any) -> str:
    """``version`` if it is one of this registry's ids (``v0001``...); InputError otherwise."""
    if not isinstance(version, str) or not VERSION_RE.fullmatch(version):
        raise InputError(
            f"{str(version)[:80]!r} is not a registry version id (v0001, v0002, ...: 'v' and 4-18 digits, "
            "no paths); see `codex-lab registry list`"
        )
    return version


def vnum(version: str) -> int:
    """The number of a version id (``v0042`` -> 42): ids sort by it, not as strings."""
    return int(version[1:])


@dataclass
class Manifest:
    """What the registry records about one version."""

    version: str
    parent: str | None
    created: float  # seconds since the epoch (UTC)
    files: dict[str, str]  # file name -> sha256 hex
    sha256: str  # over the per-file sums, in HASHED order
    gates: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON)."""
        return dict(self.__dict__)


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes (hex), read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


def combined_sha256(files: dict[str, str]) -> str:
    """One checksum over the per-file sums: sha256("name=sum\\n" for each hashed file)."""
    return hashlib.sha256("".join(f"{n}={files[n]}\n" for n in HASHED).encode()).hexdigest()


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new file, never half.

    The temporary file is created afresh (a symlink planted under its name is removed, never
    followed) and renamed over ``path`` (a symlink at ``path`` is replaced, not written through)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # debris of an earlier crash of this pid, or a planted link
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """JSON of a small file; ValueError (short reason) when unreadable, too large or not JSON."""
    try:
        if path.is_symlink():
            raise ValueError("a symbolic link (the registry reads only real files inside its folder)")
        if not path.is_file():
            raise ValueError("not a regular file")
        with open(_open_regular(path, os.O_RDONLY), "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            raise ValueError("over the 1 MiB limit")
        return json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeError, RecursionError, ValueError) as exc:
        raise ValueError(" ".join(str(exc).split())[:160] or type(exc).__name__) from None


def valid_state(obj: Any) -> dict[str, Any]:
    """``obj`` as a state dict, or ValueError saying what is wrong with it."""
    if not isinstance(obj, dict) or not isinstance(obj.get("history"), list):
        raise ValueError("expected {\"current\": ..., \"history\": [...]}")
    hist, cur = obj["history"], obj.get("current")
    for v in [*hist, *([cur] if cur is not None else [])]:
        if not isinstance(v, str) or not VERSION_RE.fullmatch(v):
            raise ValueError(f"{str(v)[:40]!r} is not a version id")
    if len(set(hist)) != len(hist) or (cur is not None and cur not in hist) or (cur is None and hist):
        raise ValueError("current and history disagree")
    return {"current": cur, "history": list(hist)}


def os_error(exc: OSError, fix: str) -> RegistryFileError:
    """An OS error as one line naming the file and the fix (the CLI prints it and exits 2)."""
    return RegistryFileError(f"{exc.filename or '?'}: {exc.strerror or exc}; fix: {fix}")


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs (a zombie counts; one owned by another user too)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class WriterLock:
    """Exclusive, re-entrant writer lock: a thread lock in this process, ``flock`` across processes.

    The lock file is opened on the outermost acquire and closed (which releases the
    ``flock``) on the outermost release, so nested ``with lock:`` blocks never deadlock.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tlock = threading.RLock()
        self._depth, self._fd = 0, -1

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._tlock:
            if self._depth == 0:
                try:
                    fd = _open_regular(self.path, os.O_RDWR | os.O_CREAT)
                except OSError as exc:
                    raise os_error(exc, f"remove {self.path} if it is not a file, or fix the permissions") from None
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                self._fd = fd
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    os.close(self._fd)  # closing the descriptor releases the flock
                    self._fd = -1


def clean_debris(places: list[Path]) -> list[str]:
    """Delete staging/trash folders and temporary files of dead processes in ``places``; return their names.

    Debris names carry the writer's pid (``.staging-PID-TOKEN``, ``.trash-PID-TOKEN-vNNNN``,
    ``.NAME.tmp-PID``); a live process's debris is kept unless older than a day (pid reuse).
    """
    removed, now = [], time.time()
    for place in places:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for e in entries:
            m = _DEBRIS_RE.search(e.name)
            if not e.name.startswith(".") or m is None:
                continue
            pid = int(next(g for g in m.groups() if g))
            try:
                old = now - e.stat(follow_symlinks=False).st_mtime > STALE_AFTER_S
            except OSError:
                continue
            if pid_alive(pid) and not old:
                continue  # another process is writing it right now
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(e.path)
            removed.append(e.name)
    return removed


NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _open_regular(path: Path, flags: int) -> int:
    """``os.open`` that never blocks on a FIFO, never follows a symlink (a ``journal.log`` or
    ``.lock`` planted as a link to a file elsewhere is refused, nothing is written through it) and
    refuses anything but a regular file (OSError naming the file)."""
    try:
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0) | NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (NOFOLLOW and os.path.islink(path)):
            raise OSError(errno.ELOOP, "a symbolic link, refused (the registry writes only real files in its "
                                       "folder)", str(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(errno.EINVAL, "not a regular file", str(path))
    return fd


def journal_append(path: Path, state: dict[str, Any]) -> None:
    """Append one state record to the journal and fsync it (compacting a journal over 64 KiB)."""
    line = json.dumps(state, separators=(",", ":"))
    # a leading newline: a line torn by a crash never swallows the next record
    fd = _open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"\n{line}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if path.stat().st_size > JOURNAL_COMPACT_BYTES:
        atomic_write_text(path, line + "\n")


def journal_last(path: Path, on_disk: set[str]) -> dict[str, Any] | None:
    """The last valid state in the journal with versions missing on disk dropped, or None."""
    try:
        with open(_open_regular(path, os.O_RDONLY), "rb") as f:  # the tail only: compacted at 64 KiB
            f.seek(max(0, os.fstat(f.fileno()).st_size - MAX_JSON_BYTES))
            lines = f.read(MAX_JSON_BYTES).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            st = valid_state(json.loads(line))
        except (ValueError, RecursionError):
            continue  # a torn or garbage line
        hist = [v for v in st["history"] if v in on_disk]
        return {"current": hist[-1] if hist else None, "history": hist}
    return None


def read_manifest(mp: Path, version: str) -> Manifest:
    """The manifest at ``mp`` of ``version``; :class:`RegistryFileError` naming the file if it is corrupt."""
    try:
        d = read_json(mp)
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        man = Manifest(**d)
        ok = (man.version == version and (man.parent is None or isinstance(man.parent, str))
              and isinstance(man.created, (int, float)) and isinstance(man.files, dict)
              and all(isinstance(man.files.get(n), str) for n in HASHED) and isinstance(man.sha256, str)
              and isinstance(man.gates, dict) and isinstance(man.note, str))
        if not ok:
            raise ValueError("fields missing or of the wrong type")
    except (ValueError, TypeError) as exc:
        raise RegistryFileError(
            f"{mp}: corrupt manifest ({' '.join(str(exc).split())[:160]}); fix: delete {mp.parent} "
            "and `codex-lab registry add` the checkpoint again"
        ) from None
    return man
