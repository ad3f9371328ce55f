"""The embedded code corpus: the Python standard library of the running interpreter.

Nothing is downloaded: every Python install ships ~1,800 files (~31 MB) of real,
reviewed code. Any other folder of code can be used instead (``--corpus PATH``).
Files are read in a deterministic order (sorted relative paths), exact duplicates are
dropped, undecodable files are skipped and counted, and the train/validation split is a
stable hash of the relative path, so it never changes between runs or machines.

Hostile folders are safe to read: special files (FIFOs, devices, sockets) are skipped
without being read (files are opened non-blocking and checked with ``fstat``), symlink loops
and dangling links are skipped, a link (or a path) that leads out of the corpus root (to
``/proc/self/environ``, a key file, another project) is skipped unread, files over
``max_file_bytes`` are skipped without reading past the cap, and unreadable files are skipped;
every kind is counted in :meth:`Corpus.stats`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from codex_lab.errors import InputError, MissingFileError

SKIP_DIRS = frozenset({"site-packages", "__pycache__", ".git", ".venv", "node_modules"})
DEFAULT_MAX_FILE_BYTES = 1_000_000  # ~1 MB: larger "source" files are generated data, not code


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
    skipped_special: list[str] = field(default_factory=list)  # FIFOs, devices, sockets, folders named *.py
    skipped_links: list[str] = field(default_factory=list)  # symlink loops and dangling links
    skipped_too_large: list[str] = field(default_factory=list)  # over max_file_bytes
    skipped_unreadable: list[str] = field(default_factory=list)  # permission denied, I/O errors
    skipped_outside: list[str] = field(default_factory=list)  # links leading out of the corpus root

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
        out["skipped_special"] = len(self.skipped_special)
        out["skipped_links"] = len(self.skipped_links)
        out["skipped_too_large"] = len(self.skipped_too_large)
        out["skipped_unreadable"] = len(self.skipped_unreadable)
        out["skipped_outside_root"] = len(self.skipped_outside)
        return out


def default_corpus_root() -> Path:
    """Folder of the running interpreter's standard library source."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(rel_path: str, val_fraction: float) -> str:
    """Stable split: ``"val"`` when sha1(path) mod 10_000 < val_fraction * 10_000."""
    # bucket = int(sha1(path)) mod 10_000, compared with the fraction in basis points
    bucket = int(hashlib.sha1(rel_path.encode("utf-8", "surrogateescape")).hexdigest(), 16) % 10_000
    return "val" if bucket < round(val_fraction * 10_000) else "train"


def _candidates(root: Path, extensions: tuple[str, ...], include_tests: bool, unreadable: list[str]) -> list[str]:
    """Relative paths of files named ``*{extensions}`` under ``root``, found with an explicit stack.

    ``os.walk`` recurses in Python 3.11 (a folder 1,000 deep raises RecursionError); this
    loop does not. Symlinked folders are not followed (no loops); unreadable folders are
    recorded in ``unreadable`` with a trailing slash.
    """
    out: list[str] = []
    stack = [Path(".")]
    while stack:
        rel_dir = stack.pop()
        try:
            entries = list(os.scandir(root / rel_dir))
        except OSError:
            unreadable.append(rel_dir.as_posix() + "/")
            continue
        for e in entries:
            try:
                is_dir = e.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                if e.name not in SKIP_DIRS and (include_tests or e.name not in ("test", "tests")):
                    stack.append(rel_dir / e.name)
            elif e.name.endswith(extensions):
                out.append((rel_dir / e.name).as_posix())
    return out


def read_source_bytes(path: Path, max_bytes: int, root: Path | None = None) -> tuple[str, bytes | None]:
    """Read one candidate file safely: ``(kind, data)`` where kind is ``"ok"``, ``"special"``,
    ``"link"`` (loop or dangling), ``"outside"`` (it leads out of ``root``), ``"large"`` or
    ``"unreadable"`` and data is set only for ``"ok"``.

    Links are resolved first and the real path must lie inside ``root`` (itself resolved);
    that real path is then opened with ``O_NOFOLLOW`` (a link swapped in after the check is
    refused, not followed), ``O_NONBLOCK`` (a FIFO never blocks the open) and checked with
    ``fstat`` on the open descriptor (no race between the check and the read); at most
    ``max_bytes + 1`` bytes are ever read, whatever the file claims its size is.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    if root is not None:
        try:
            real = Path(os.path.realpath(path, strict=True))
        except OSError as exc:
            if exc.errno == errno.ELOOP or os.path.islink(path):
                return "link", None
            return "unreadable", None
        base = Path(os.path.realpath(root))
        if real != base and base not in real.parents:
            return "outside", None
        path, flags = real, flags | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOENT and os.path.islink(path)):
            return "link", None
        if exc.errno in (errno.ENXIO, errno.EISDIR, errno.EOPNOTSUPP):  # a socket, a folder named *.py
            return "special", None
        return "unreadable", None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "special", None
        if st.st_size > max_bytes:
            return "large", None
        chunks, total = [], 0
        while total <= max_bytes:  # the size can lie (procfs, a growing file): cap what is read
            b = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not b:
                break
            chunks.append(b)
            total += len(b)
        if total > max_bytes:
            return "large", None
        return "ok", b"".join(chunks)
    except OSError:
        return "unreadable", None
    finally:
        os.close(fd)


def load_corpus(
    path: str | os.PathLike[str] | None = None,
    *,
    extensions: tuple[str, ...] = (".py",),
    val_fraction: float = 0.05,
    max_files: int | None = None,
    include_tests: bool = True,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Corpus:
    """Read a folder of code into a :class:`Corpus`.

    Args:
        path: folder to read; ``None`` means the standard library of this interpreter.
        extensions: file suffixes to keep.
        val_fraction: share of files (by stable path hash) put in the validation split.
        max_files: keep only the first ``max_files`` files in sorted order (fast mode).
        include_tests: keep files under ``test``/``tests`` folders.
        max_file_bytes: files larger than this many bytes are skipped and counted.

    Raises:
        MissingFileError: the path does not exist or is not a folder.
        InputError: bad arguments, or no readable file with one of ``extensions`` was found.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise InputError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int) or max_file_bytes < 1:
        raise InputError(f"max_file_bytes must be a positive number of bytes, got {max_file_bytes!r} (default 1000000)")
    root = Path(path) if path is not None else default_corpus_root()
    if not root.exists():
        raise MissingFileError(
            f"corpus folder {str(root)!r} does not exist; pass --corpus with a folder of code "
            "or leave it out to use the Python standard library."
        )
    if not root.is_dir():
        raise MissingFileError(f"corpus path {str(root)!r} is a file, not a folder of code.")

    corpus = Corpus(root=str(root), files=[])
    rel_paths = sorted(_candidates(root, extensions, include_tests, corpus.skipped_unreadable))
    skipped = {"special": corpus.skipped_special, "link": corpus.skipped_links, "outside": corpus.skipped_outside,
               "large": corpus.skipped_too_large, "unreadable": corpus.skipped_unreadable}
    seen: set[str] = set()
    for rel in rel_paths:
        if max_files is not None and len(corpus.files) >= max_files:
            corpus.skipped_by_limit += 1
            continue
        kind, raw = read_source_bytes(root / rel, max_file_bytes, root)  # never out of the root
        if raw is None:
            skipped[kind].append(rel)
            continue
        try:
            rel.encode("utf-8")  # a file name that is not UTF-8 cannot be reported or split stably
            text = raw.decode("utf-8")
        except UnicodeError:
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
        n_skipped = sum(len(v) for v in skipped.values()) + len(corpus.skipped_undecodable)
        raise InputError(
            f"no readable {'/'.join(extensions)} files under {str(root)!r} ({n_skipped} skipped: special, "
            f"broken links, links out of the folder, over {max_file_bytes:,} bytes, undecodable or unreadable); point --corpus "
            "at a folder that contains source code."
        )
    return corpus
