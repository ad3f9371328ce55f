"""Model versions on disk: add, verify, promote, roll back, prune.

Layout under ``root``::

    versions/v0001/  model.safetensors config.json tokenizer.json meta.json manifest.json
    versions/v0002/  ...
    state.json       {"current": "v0002", "history": ["v0001", "v0002"]}

- A version is written into a hidden staging folder and renamed into place only when
  complete (weights, config, tokenizer, manifest), so a crash mid-write leaves no half
  version; a leftover staging folder is ignored and cleaned up.
- ``state.json`` is replaced atomically (write a temporary file, ``fsync``, ``os.replace``).
- The manifest holds the version, its parent, the creation time, a SHA-256 per file and
  over all files, and the gate results. Loading re-hashes the files: a tampered or
  corrupted checkpoint is refused with :class:`ChecksumError`.
- Pruning keeps the current version, the ``keep_previous`` (>= 2) versions promoted before
  it, and every version added after it (candidates not yet decided).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codex_lab.training.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from codex_lab.nn.model import CodexModel
from codex_lab.data.tokenizer import CodeTokenizer

MANIFEST, STATE = "manifest.json", "state.json"
HASHED = ("model.safetensors", "config.json", "tokenizer.json")


class ChecksumError(ValueError):
    """A version's files do not match the SHA-256 sums in its manifest."""


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
        (self.root / "versions").mkdir(parents=True, exist_ok=True)
        for stale in (self.root / "versions").glob(".*"):  # staging left by a crash
            shutil.rmtree(stale, ignore_errors=True)

    # ---- state -------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        p = self.root / STATE
        return json.loads(p.read_text()) if p.is_file() else {"current": None, "history": []}

    def _write_state(self, state: dict[str, Any]) -> None:
        atomic_write_text(self.root / STATE, json.dumps(state, indent=2) + "\n")

    def path(self, version: str) -> Path:
        """Folder of ``version``; FileNotFoundError naming the known versions if absent."""
        p = self.root / "versions" / version
        if not (p / MANIFEST).is_file():
            raise FileNotFoundError(f"no version {version!r} in {str(self.root)!r}; known: {self.versions()}")
        return p

    def versions(self) -> list[str]:
        """Complete versions, oldest first."""
        return sorted(p.name for p in (self.root / "versions").iterdir()
                      if not p.name.startswith(".") and (p / MANIFEST).is_file())

    def current(self) -> str | None:
        """The version serving now (``None`` before the first promotion)."""
        return self._state()["current"]

    def history(self) -> list[str]:
        """Versions in the order they were promoted (the last is the current one)."""
        return list(self._state()["history"])

    def manifest(self, version: str) -> Manifest:
        """The manifest of ``version``."""
        return Manifest(**json.loads((self.path(version) / MANIFEST).read_text()))

    # ---- writing -----------------------------------------------------------------------
    def add(self, model: CodexModel, tokenizer: CodeTokenizer, *, parent: str | None = None,
            gates: dict[str, Any] | None = None, note: str = "", meta: dict[str, Any] | None = None) -> str:
        """Store a new version (not yet serving); return its name (``v0001``, ``v0002``, ...)."""
        existing = self.versions()
        n = int(existing[-1][1:]) + 1 if existing else 1
        version = f"v{n:04d}"
        if parent is None:
            parent = self.current()
        staging = self.root / "versions" / f".{version}.staging-{os.getpid()}"
        try:
            save_checkpoint(staging, model, tokenizer, meta=meta)
            files = {name: file_sha256(staging / name) for name in HASHED}
            man = Manifest(version=version, parent=parent, created=time.time(), files=files,
                           sha256=combined_sha256(files), gates=gates or {}, note=note)
            atomic_write_text(staging / MANIFEST, json.dumps(man.to_dict(), indent=2, default=str) + "\n")
            os.replace(staging, self.root / "versions" / version)  # the commit point
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return version

    def set_gates(self, version: str, gates: dict[str, Any]) -> None:
        """Record gate results in a version's manifest (atomically)."""
        man = self.manifest(version)
        man.gates = gates
        atomic_write_text(self.path(version) / MANIFEST, json.dumps(man.to_dict(), indent=2, default=str) + "\n")

    def verify(self, version: str) -> Manifest:
        """Re-hash the files of ``version``; raise :class:`ChecksumError` naming what differs."""
        p, man = self.path(version), self.manifest(version)
        bad = []
        for name in HASHED:
            if not (p / name).is_file():
                bad.append(f"{name} (missing)")
            elif file_sha256(p / name) != man.files.get(name):
                bad.append(name)
        if bad or combined_sha256(man.files) != man.sha256:
            raise ChecksumError(
                f"version {version} fails its checksum ({', '.join(bad) or 'manifest sum'}): the checkpoint was "
                "changed or corrupted after it was registered; refuse it and roll back or re-add the model"
            )
        return man

    def load(self, version: str | None = None, device: Any = None) -> Checkpoint:
        """Verify then load ``version`` (default: the current one)."""
        version = version or self.current()
        if version is None:
            raise ValueError(f"registry {str(self.root)!r} has no current version; promote one first")
        self.verify(version)
        ck = load_checkpoint(self.path(version), device=device)
        ck.meta = {**ck.meta, "version": version}
        return ck

    def promote(self, version: str) -> None:
        """Make ``version`` current (it must pass its checksum), then prune old versions."""
        self.verify(version)
        st = self._state()
        st["history"] = [v for v in st["history"] if v != version] + [version]
        st["current"] = version
        self._write_state(st)
        self.prune()

    def rollback(self) -> str:
        """Go back to the newest previously promoted version that passes its checksum.

        The abandoned version stays on disk (for inspection) but leaves the history.
        Returns the version now current.
        """
        st = self._state()
        hist = list(st["history"])
        if len(hist) < 2:
            raise ValueError(f"nothing to roll back to: history is {hist}")
        abandoned = hist.pop()
        while hist:
            try:
                self.verify(hist[-1])
                break
            except (ChecksumError, FileNotFoundError):
                hist.pop()
        if not hist:
            raise ChecksumError(f"no earlier version of {abandoned} passes its checksum; cannot roll back")
        st["history"], st["current"] = hist, hist[-1]
        self._write_state(st)
        return hist[-1]

    def prune(self) -> list[str]:
        """Delete versions outside the keep set; return the deleted names."""
        st = self._state()
        cur = st["current"]
        keep = set(st["history"][-(self.keep_previous + 1):])
        if cur:
            keep.add(cur)
        newest_kept = max(keep) if keep else ""
        removed = [v for v in self.versions() if v not in keep and v < newest_kept]
        if st["history"] != [v for v in st["history"] if v in keep]:
            st["history"] = [v for v in st["history"] if v in keep]
            self._write_state(st)  # the pointer first: a crash below leaves only unused folders
        for v in removed:
            shutil.rmtree(self.root / "versions" / v, ignore_errors=True)
        return removed

    def table(self) -> list[dict[str, Any]]:
        """One flat record per version (for ``codex-lab registry list``)."""
        cur, hist = self.current(), self.history()
        rows = []
        for v in self.versions():
            m = self.manifest(v)
            passed = m.gates.get("passed") if m.gates else None
            rows.append({"version": v, "parent": m.parent or "-", "current": v == cur,
                         "promoted": v in hist,
                         "created": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(m.created)),
                         "sha256": m.sha256[:12], "gates": "-" if passed is None else ("pass" if passed else "FAIL"),
                         "note": m.note})
        return rows
