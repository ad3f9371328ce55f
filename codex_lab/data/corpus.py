"""The embedded code corpus: the Python standard library of the running interpreter.

Nothing is downloaded: every Python install ships ~1,800 files (~31 MB) of real,
reviewed code. Any other folder of code can be used instead (``--corpus PATH``).
Files are read in a deterministic order (sorted relative paths), exact duplicates are
dropped, undecodable files are skipped and counted, and the train/validation split is a
stable hash of the relative path, so it never changes between runs or machines.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

SKIP_DIRS = frozenset({"site-packages", "__pycache__", ".git", ".venv", "node_modules"})


@dataclass(frozen=True)
class SourceFile:
    """One file of the corpus: ``path`` is relative to the corpus root (POSIX slashes)."""

    path: str
    text: str
    split: str  # "train" or "val"


@dataclass
class Corpus:
    """The files of a corpus plus what was skipped while reading it."""

    root: str
    files: list[SourceFile]
    skipped_undecodable: list[str] = field(default_factory=list)
    skipped_duplicates: int = 0
    skipped_by_limit: int = 0

    @property
    def train(self) -> list[SourceFile]:
        """Training files (stable hash split)."""
        return [f for f in self.files if f.split == "train"]

    @property
    def val(self) -> list[SourceFile]:
        """Validation files (stable hash split)."""
        return [f for f in self.files if f.split == "val"]

    def texts(self, split: str | None = None) -> list[str]:
        """File texts of one split (``"train"``/``"val"``) or all of them."""
        return [f.text for f in self.files if split is None or f.split == split]

    def stats(self) -> dict[str, int | float | str]:
        """Sizes in files, characters and lines, per split, plus the skip counts."""
        out: dict[str, int | float | str] = {"root": self.root}
        for name, files in (("train", self.train), ("val", self.val)):
            out[f"{name}_files"] = len(files)
            out[f"{name}_chars"] = sum(len(f.text) for f in files)
            out[f"{name}_lines"] = sum(f.text.count("\n") for f in files)
        out["skipped_undecodable"] = len(self.skipped_undecodable)
        out["skipped_duplicates"] = self.skipped_duplicates
        out["skipped_by_limit"] = self.skipped_by_limit
        return out


def default_corpus_root() -> Path:
    """Folder of the running interpreter's standard library source."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(rel_path: str, val_fraction: float) -> str:
    """Stable split: ``"val"`` when sha1(path) mod 10_000 < val_fraction * 10_000."""
    # bucket = int(sha1(path)) mod 10_000, compared with the fraction in basis points
    bucket = int(hashlib.sha1(rel_path.encode("utf-8")).hexdigest(), 16) % 10_000
    return "val" if bucket < round(val_fraction * 10_000) else "train"


def load_corpus(
    path: str | os.PathLike[str] | None = None,
    *,
    extensions: tuple[str, ...] = (".py",),
    val_fraction: float = 0.05,
    max_files: int | None = None,
    include_tests: bool = True,
) -> Corpus:
    """Read a folder of code into a :class:`Corpus`.

    Args:
        path: folder to read; ``None`` means the standard library of this interpreter.
        extensions: file suffixes to keep.
        val_fraction: share of files (by stable path hash) put in the validation split.
        max_files: keep only the first ``max_files`` files in sorted order (fast mode).
        include_tests: keep files under ``test``/``tests`` folders.

    Raises:
        FileNotFoundError: the path does not exist or is not a folder.
        ValueError: no readable file with one of ``extensions`` was found.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    root = Path(path) if path is not None else default_corpus_root()
    if not root.exists():
        raise FileNotFoundError(
            f"corpus folder {str(root)!r} does not exist; pass --corpus with a folder of code "
            "or leave it out to use the Python standard library."
        )
    if not root.is_dir():
        raise FileNotFoundError(f"corpus path {str(root)!r} is a file, not a folder of code.")

    rel_paths: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in SKIP_DIRS and (include_tests or d not in ("test", "tests"))
        )
        for name in filenames:
            if name.endswith(extensions):
                rel_paths.append((rel_dir / name).as_posix())
    rel_paths.sort()

    corpus = Corpus(root=str(root), files=[])
    seen: set[str] = set()
    for rel in rel_paths:
        if max_files is not None and len(corpus.files) >= max_files:
            corpus.skipped_by_limit += 1
            continue
        raw = (root / rel).read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            corpus.skipped_undecodable.append(rel)
            continue
        digest = hashlib.sha256(raw).hexdigest()
        if digest in seen:
            corpus.skipped_duplicates += 1
            continue
        seen.add(digest)
        if not text.strip():
            continue
        corpus.files.append(SourceFile(rel, text, split_of(rel, val_fraction)))

    if not corpus.files:
        raise ValueError(
            f"no readable {'/'.join(extensions)} files under {str(root)!r}; point --corpus "
            "at a folder that contains source code."
        )
    return corpus
