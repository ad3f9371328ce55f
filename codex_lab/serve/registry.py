"""Model versions on disk: add, verify, promote, roll back, prune; safe under crashes and concurrency.

Layout under ``root``::

    versions/v0001/  model.safetensors config.json tokenizer.json meta.json manifest.json
    versions/v0002/  ...
    state.json       {"current": "v0002", "history": ["v0001", "v0002"]}
    journal.log      one JSON state per line, appended (and fsynced) before state.json is replaced
    .lock            writers hold an exclusive ``flock`` on it

- Version ids are the registry's own (``v`` + at least 4 digits); anything else (``../../x``,
  an absolute path, a separator, an empty name) is refused with :class:`InputError`.
- Writers (add, promote, rollback, prune, set_gates, repair) serialise on the file lock, so
  concurrent processes never pick the same version number or interleave state updates.
- A version is written into a per-process staging folder (``.staging-PID-TOKEN``) and renamed
  into place only when complete, so a crash (even ``kill -9``) leaves no half version. Staging
  and trash folders and temporary files of *dead* processes are cleaned when a registry is
  opened; a live process's staging folder is never touched.
- ``state.json`` is replaced atomically. If it is found truncated or garbage, it is rebuilt
  from the last good record in ``journal.log``; without one it is refused with one line naming
  the file and the fix (``codex-lab registry repair``).
- The manifest holds the version, its parent, the creation time, a SHA-256 per file and over
  all files, and the gate results. Loading re-hashes the files: a tampered or corrupted
  checkpoint is refused with :class:`ChecksumError`; every error names the broken file.
- Pruning keeps the current version, the ``keep_previous`` (>= 2) versions promoted before
  it, and every version added after it (candidates not yet decided). Pruned folders are
  renamed to a trash name first, so a crash mid-delete leaves no half version under a real id.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

try:  # POSIX; on Windows writers are not serialised across processes (documented limitation)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.errors import InputError, MissingFileError
from codex_lab.nn.model import CodexModel
from codex_lab.training.checkpoint import Checkpoint, load_checkpoint, write_checkpoint_files

MANIFEST, STATE, JOURNAL, LOCK = "manifest.json", "state.json", "journal.log", ".lock"
HASHED = ("model.safetensors", "config.json", "tokenizer.json")
VERSION_RE = re.compile(r"v[0-9]{4,9}")
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
            f"{str(version)[:80]!r} is not a registry version id (v0001, v0002, ...: 'v' and 4-9 digits, "
            "no paths); see `codex-lab registry list`"
        )
    return version


def _vnum(version: str) -> int:
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
    """Write ``text`` to ``path`` so that readers see the old or the new file, never half."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    """JSON of a small file; ValueError (short reason) when unreadable, too large or not JSON."""
    try:
        if not path.is_file():
            raise ValueError("not a regular file")
        if path.stat().st_size > MAX_JSON_BYTES:
            raise ValueError(f"{path.stat().st_size:,} bytes, over the 1 MiB limit")
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, RecursionError, ValueError) as exc:
        raise ValueError(" ".join(str(exc).split())[:160] or type(exc).__name__) from None


def _valid_state(obj: Any) -> dict[str, Any]:
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


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class Registry:
    """A folder of model versions with a current pointer and a promotion history.

    Args:
        root: the registry folder (created if missing).
        keep_previous: previously promoted versions kept besides the current one (>= 2).
    """

    def __init__(self, root: str | Path, *, keep_previous: int = 2) -> None:
        if keep_previous < 2:
            raise ValueError(f"keep_previous={keep_previous}: keep at least 2 previous versions (the seed's rule)")
        self.root = Path(root)
        self.keep_previous = keep_previous
        if self.root.exists() and not self.root.is_dir():
            raise InputError(f"registry root {str(self.root)!r} is not a folder; pass --root with a folder")
        (self.root / "versions").mkdir(parents=True, exist_ok=True)
        self._tlock = threading.RLock()
        self._depth, self._fd = 0, -1
        with self._locked():
            self.clean_debris()

    # ---- locking and debris -------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive writer lock: a thread lock in this process, ``flock`` across processes (re-entrant)."""
        with self._tlock:
            if self._depth == 0:
                fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
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

    def clean_debris(self) -> list[str]:
        """Delete staging/trash folders and temporary files left by dead processes; return their names."""
        removed = []
        places = [self.root, self.root / "versions"]
        places += [self.root / "versions" / v for v in self._version_dirs()]
        now = time.time()
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
                if _pid_alive(pid) and not old:
                    continue  # another process is writing it right now
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
                removed.append(e.name)
        return removed

    # ---- state -------------------------------------------------------------------------
    def _from_journal(self) -> dict[str, Any] | None:
        """The last valid state recorded in the journal (versions missing on disk dropped), or None."""
        p = self.root / JOURNAL
        try:
            lines = p.read_bytes().decode("utf-8", "replace").splitlines()
        except OSError:
            return None
        on_disk = set(self.versions())
        for line in reversed(lines):
            try:
                st = _valid_state(json.loads(line))
            except (ValueError, RecursionError):
                continue  # a torn or garbage line
            hist = [v for v in st["history"] if v in on_disk]
            return {"current": hist[-1] if hist else None, "history": hist}
        return None

    def _state(self) -> dict[str, Any]:
        p = self.root / STATE
        if not p.exists() and not p.is_symlink():
            return self._from_journal() or {"current": None, "history": []}
        try:
            return _valid_state(_read_json(p))
        except ValueError as why:
            with self._locked():
                try:  # another process may have repaired it while we waited for the lock
                    return _valid_state(_read_json(p))
                except ValueError:
                    pass
                st = self._from_journal()
                if st is None:
                    raise RegistryFileError(
                        f"{p}: registry state is corrupt ({why}) and {self.root / JOURNAL} has no usable record; "
                        f"fix: `codex-lab registry repair --root {self.root}` rebuilds it from the versions on disk, "
                        "or restore state.json from a backup"
                    ) from None
                self._write_state(st)
                warnings.warn(f"{p} was corrupt ({why}); rebuilt from {self.root / JOURNAL}: current {st['current']}",
                              stacklevel=2)
                return st

    def _write_state(self, state: dict[str, Any]) -> None:
        """Append the state to the journal (fsync), then replace state.json atomically."""
        line = json.dumps(state, separators=(",", ":"))
        jp = self.root / JOURNAL
        with self._locked():
            # a leading newline: a line torn by a crash never swallows the next record
            fd = os.open(jp, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"\n{line}\n".encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            atomic_write_text(self.root / STATE, json.dumps(state, indent=2) + "\n")
            if jp.stat().st_size > JOURNAL_COMPACT_BYTES:
                atomic_write_text(jp, line + "\n")

    # ---- reading -----------------------------------------------------------------------
    def _version_dirs(self) -> list[str]:
        """Names under versions/ that are version ids and real folders (no symlinks), oldest first."""
        try:
            entries = list(os.scandir(self.root / "versions"))
        except OSError:
            return []
        names = [e.name for e in entries if VERSION_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
        return sorted(names, key=_vnum)

    def path(self, version: str) -> Path:
        """Folder of ``version``; MissingFileError naming the known versions if absent."""
        p = self.root / "versions" / check_version(version)
        if p.is_symlink() or not (p / MANIFEST).is_file():
            raise MissingFileError(f"no version {version!r} in {str(self.root)!r}; known: {self.versions()}")
        return p

    def versions(self) -> list[str]:
        """Complete versions (a manifest present), oldest first."""
        return [v for v in self._version_dirs() if (self.root / "versions" / v / MANIFEST).is_file()]

    def current(self) -> str | None:
        """The version serving now (``None`` before the first promotion)."""
        return self._state()["current"]

    def history(self) -> list[str]:
        """Versions in the order they were promoted (the last is the current one)."""
        return list(self._state()["history"])

    def manifest(self, version: str) -> Manifest:
        """The manifest of ``version``; :class:`RegistryFileError` naming the file if it is corrupt."""
        mp = self.path(version) / MANIFEST
        try:
            d = _read_json(mp)
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

    # ---- writing -----------------------------------------------------------------------
    def add(self, model: CodexModel, tokenizer: CodeTokenizer, *, parent: str | None = None,
            gates: dict[str, Any] | None = None, note: str = "", meta: dict[str, Any] | None = None) -> str:
        """Store a new version (not yet serving); return its name (``v0001``, ``v0002``, ...).

        The files are written and hashed outside the lock (in a staging folder of this
        process); only numbering and the rename into place hold it.
        """
        if parent is not None:
            check_version(parent)
        vroot = self.root / "versions"
        staging = vroot / f".staging-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            staging.mkdir()
            write_checkpoint_files(staging, model, tokenizer, meta)
            files = {name: file_sha256(staging / name) for name in HASHED}
            with self._locked():
                taken = [_vnum(v) for v in [*self._version_dirs(), *self._state()["history"]]]
                version = f"v{max(taken, default=0) + 1:04d}"
                man = Manifest(version=version, parent=parent or self.current(), created=time.time(), files=files,
                               sha256=combined_sha256(files), gates=gates or {}, note=note)
                atomic_write_text(staging / MANIFEST, json.dumps(man.to_dict(), indent=2, default=str) + "\n")
                os.replace(staging, vroot / version)  # the commit point
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return version

    def set_gates(self, version: str, gates: dict[str, Any]) -> None:
        """Record gate results in a version's manifest (atomically)."""
        with self._locked():
            man = self.manifest(version)
            man.gates = gates
            atomic_write_text(self.path(version) / MANIFEST, json.dumps(man.to_dict(), indent=2, default=str) + "\n")

    def verify(self, version: str) -> Manifest:
        """Re-hash the files of ``version``; raise :class:`ChecksumError` naming what differs."""
        p, man = self.path(version), self.manifest(version)
        bad = []
        for name in HASHED:
            if not (p / name).is_file():
                bad.append(f"{p / name} (missing)")
            elif file_sha256(p / name) != man.files.get(name):
                bad.append(str(p / name))
        if bad or combined_sha256(man.files) != man.sha256:
            raise ChecksumError(
                f"version {version} fails its checksum ({', '.join(bad) or str(p / MANIFEST) + ' sum'}): the checkpoint "
                "was changed or corrupted after it was registered; refuse it and roll back or re-add the model"
            )
        return man

    def load(self, version: str | None = None, device: Any = None) -> Checkpoint:
        """Verify then load ``version`` (default: the current one)."""
        version = self.current() if version is None else check_version(version)
        if version is None:
            raise InputError(f"registry {str(self.root)!r} has no current version; promote one first")
        self.verify(version)
        ck = load_checkpoint(self.path(version), device=device)
        ck.meta = {**ck.meta, "version": version}
        return ck

    def promote(self, version: str) -> None:
        """Make ``version`` current (it must pass its checksum), then prune old versions."""
        check_version(version)
        with self._locked():
            self.verify(version)
            st = self._state()
            st["history"] = [v for v in st["history"] if v != version] + [version]
            st["current"] = version
            self._write_state(st)
            self.prune()

    def rollback(self) -> str:
        """Go back to the newest previously promoted version that passes its checksum.

        Versions that fail (corrupt files or manifest, missing folder) are skipped. The
        abandoned version stays on disk (for inspection) but leaves the history.
        Returns the version now current.
        """
        with self._locked():
            st = self._state()
            hist = list(st["history"])
            if len(hist) < 2:
                raise InputError(f"nothing to roll back to: history is {hist}")
            abandoned = hist.pop()
            skipped = []
            while hist:
                try:
                    self.verify(hist[-1])
                    break
                except (InputError, OSError) as exc:
                    skipped.append(f"{hist.pop()} ({str(exc)[:120]})")
            if not hist:
                raise ChecksumError(f"no earlier version of {abandoned} passes its checksum; cannot roll back: "
                                    + "; ".join(skipped))
            self._write_state({"current": hist[-1], "history": hist})
            return hist[-1]

    def prune(self) -> list[str]:
        """Delete versions outside the keep set; return the deleted names."""
        with self._locked():
            st = self._state()
            cur = st["current"]
            keep = set(st["history"][-(self.keep_previous + 1):])
            if cur:
                keep.add(cur)
            newest_kept = max((_vnum(v) for v in keep), default=0)
            removed = [v for v in self._version_dirs() if v not in keep and _vnum(v) < newest_kept]
            if st["history"] != [v for v in st["history"] if v in keep]:
                st["history"] = [v for v in st["history"] if v in keep]
                self._write_state(st)  # the pointer first: a crash below leaves only unused folders
            for v in removed:
                trash = self.root / "versions" / f".trash-{os.getpid()}-{secrets.token_hex(4)}-{v}"
                os.replace(self.root / "versions" / v, trash)  # gone from the ids at once
                shutil.rmtree(trash, ignore_errors=True)
            return removed

    def repair(self) -> dict[str, Any]:
        """Rebuild a corrupt or missing ``state.json``: from the journal if it has a record, else the
        newest version that passes its checksum becomes current (history = that version). Returns the state."""
        with self._locked():
            with contextlib.suppress(ValueError):
                return _valid_state(_read_json(self.root / STATE))  # nothing to repair
            st = self._from_journal()
            if st is None or st["current"] is None:
                good = [v for v in self.versions() if self._passes(v)]
                st = {"current": good[-1], "history": [good[-1]]} if good else {"current": None, "history": []}
            self._write_state(st)
            return st

    def _passes(self, version: str) -> bool:
        try:
            self.verify(version)
            return True
        except (InputError, OSError):
            return False

    def table(self) -> list[dict[str, Any]]:
        """One flat record per version (for ``codex-lab registry list``); a corrupt manifest shows as BROKEN."""
        cur, hist = self.current(), self.history()
        rows = []
        for v in self.versions():
            try:
                m = self.manifest(v)
            except InputError as exc:
                rows.append({"version": v, "parent": "-", "current": v == cur, "promoted": v in hist,
                             "created": "-", "sha256": "BROKEN", "gates": "-", "note": str(exc)[:100]})
                continue
            passed = m.gates.get("passed") if m.gates else None
            rows.append({"version": v, "parent": m.parent or "-", "current": v == cur,
                         "promoted": v in hist,
                         "created": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(m.created)),
                         "sha256": m.sha256[:12], "gates": "-" if passed is None else ("pass" if passed else "FAIL"),
                         "note": m.note})
        return rows
