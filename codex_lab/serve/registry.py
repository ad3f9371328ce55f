"""Model versions on disk: add, verify, promote, roll back, prune; safe under crashes and concurrency.

Layout under ``root``::

    versions/v0001/  model.safetensors config.json tokenizer.json meta.json manifest.json
    versions/v0002/  ...
    state.json       {"current": "v0002", "history": ["v0001", "v0002"]}
    journal.log      one JSON state per line, appended (and fsynced) before state.json is replaced
    .lock            writers hold an exclusive ``flock`` on it

- Version ids are the registry's own (``v`` + 4 to 18 digits, sorted by number:
  ``v999999999`` < ``v1000000000``); anything else (``../../x``,
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
import json
import os
import secrets
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.errors import InputError, MissingFileError
from codex_lab.nn.model import CodexModel
from codex_lab.serve.registry_files import (
    HASHED, JOURNAL, LOCK, MANIFEST, MAX_VERSION, STATE, VERSION_RE, ChecksumError, Manifest, RegistryFileError, WriterLock,
    atomic_write_text, check_version, clean_debris, combined_sha256, file_sha256, journal_append, journal_last,
    os_error, read_json, read_manifest, valid_state, vnum,
)
from codex_lab.training.checkpoint import Checkpoint, load_checkpoint, write_checkpoint_files


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
        try:
            (self.root / "versions").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise os_error(exc, "pass --root with a writable registry folder") from None
        self._locked = WriterLock(self.root / LOCK)
        with self._locked():
            self.clean_debris()

    # ---- locking and debris -------------------------------------------------------------
    def clean_debris(self) -> list[str]:
        """Delete staging/trash folders and temporary files left by dead processes; return their names."""
        vroot = self.root / "versions"
        return clean_debris([self.root, vroot, *(vroot / v for v in self._version_dirs())])

    # ---- state -------------------------------------------------------------------------
    def _from_journal(self) -> dict[str, Any] | None:
        """The last valid state recorded in the journal (versions missing on disk dropped), or None."""
        return journal_last(self.root / JOURNAL, set(self.versions()))

    def _state(self) -> dict[str, Any]:
        p = self.root / STATE
        if not p.exists() and not p.is_symlink():
            return self._from_journal() or {"current": None, "history": []}
        try:
            return valid_state(read_json(p))
        except ValueError as why:
            with self._locked():
                try:  # another process may have repaired it while we waited for the lock
                    return valid_state(read_json(p))
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
        with self._locked():
            try:
                journal_append(self.root / JOURNAL, state)
                atomic_write_text(self.root / STATE, json.dumps(state, indent=2) + "\n")
            except OSError as exc:
                raise os_error(exc, "make the registry folder writable, free disk space, or remove what is "
                                    "in the way of state.json/journal.log") from None

    # ---- reading -----------------------------------------------------------------------
    def _version_dirs(self) -> list[str]:
        """Names under versions/ that are version ids and real folders (no symlinks), oldest first."""
        try:
            entries = list(os.scandir(self.root / "versions"))
        except OSError:
            return []
        names = [e.name for e in entries if VERSION_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
        return sorted(names, key=vnum)

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
        return read_manifest(self.path(version) / MANIFEST, version)

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
                taken = [vnum(v) for v in [*self._version_dirs(), *self._state()["history"]]]
                if max(taken, default=0) >= MAX_VERSION:
                    raise InputError(f"registry {str(self.root)!r} has used every version id up to v{MAX_VERSION}; "
                                     "start a new registry folder")
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
        """Re-hash the files of ``version``; raise :class:`ChecksumError` naming what differs.

        Holds the writer lock: a prune or promote in another thread or process cannot move the
        folder away mid-hash (which read as a false checksum failure or a raw FileNotFoundError);
        a version pruned before the lock was taken is a MissingFileError naming the known ones."""
        with self._locked():
            return self._verify(version)

    def _verify(self, version: str) -> Manifest:
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
        with self._locked():  # verified and read under one lock: a prune cannot come in between
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
            newest_kept = max((vnum(v) for v in keep), default=0)
            removed = [v for v in self._version_dirs() if v not in keep and vnum(v) < newest_kept]
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
                return valid_state(read_json(self.root / STATE))  # nothing to repair
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
