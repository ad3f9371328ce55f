"""Build and load the package's C kernels (``codex_lab/nn/csrc/*.c``) for the CPU.

A kernel is compiled on first use with the system C compiler (``$CC``, else ``cc`` or
``gcc``): ``-O3 -ffast-math -fno-finite-math-only -fopenmp`` (and ``-march=native`` on
x86-64), against the BLAS ``sgemm_`` that the already loaded ``libtorch_cpu`` exports (MKL
there), into a cache folder (``$CODEX_LAB_NATIVE_DIR``, else
``$XDG_CACHE_HOME/codex_lab/native``, else ``~/.cache/codex_lab/native``) under a name keyed
by the source, the flags, torch's version and the CPU, so a build is reused only where it was
made for: about a second, once per machine. It is linked without ``-ffast-math`` (which would
turn on flush-to-zero for the whole process), and against the OpenMP runtime torch ships
(``libgomp.so.1``, already loaded), so its threads are torch's. ``CODEX_LAB_NATIVE=0`` turns
every kernel off. Where a kernel cannot be built or loaded, :func:`load_native` says why and
the callers run their torch paths. A build is verified before it is loaded (owner, permissions
of the file and of the folder, and the SHA-256 recorded beside it when it was built): a file
planted under the expected name is rebuilt over, never loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

__all__ = ["CSRC", "check_cache_dir", "load_native", "so_path"]

CSRC = Path(__file__).with_name("csrc")


def _flags() -> list[str]:
    # -ffast-math lets the compiler vectorise the row reductions and the exp; NaN and inf keep
    # their IEEE meaning (-fno-finite-math-only), so a NaN in the inputs reaches the outputs
    # as it does through torch's kernels instead of being silently dropped
    flags = ["-O3", "-ffast-math", "-fno-finite-math-only", "-fopenmp", "-fPIC"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags += ["-march=native", "-mprefer-vector-width=512"]
    return flags


def _cpu_id() -> str:
    """The CPU's model and feature flags: a library built with -march=native is only reused on
    the same kind of CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(keep)))


def _cache_dir() -> Path:
    if os.environ.get("CODEX_LAB_NATIVE_DIR"):
        return Path(os.environ["CODEX_LAB_NATIVE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "codex_lab" / "native"


def so_path(name: str, extra_flags: tuple[str, ...] = ()) -> Path:
    """Where the build of ``csrc/<name>.c`` with ``extra_flags`` lives in the cache folder (the
    name is keyed by the source, the flags, torch's version and the CPU)."""
    key = hashlib.sha256("\n".join([(CSRC / f"{name}.c").read_text(), " ".join(_flags() + list(extra_flags) + LINK),
                                    torch.__version__, _cpu_id()]).encode())
    return _cache_dir() / f"{name}-{key.hexdigest()[:16]}.so"


LINK = ["-shared", "-fopenmp", "-ltorch_cpu", "-lm"]
DIGEST_SUFFIX = ".sha256"  # the sidecar beside each build: {"sha256": ..., "size": ...}, written at build time


def _private(st: os.stat_result) -> str:
    """"" when a stat result is owned by this user and not writable by group or others, else why not."""
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def check_cache_dir(folder: Path) -> str:
    """"" when the cache folder is a folder of this user's that nobody else can write, else why not
    (with the fix): another user able to write there could swap a kernel for their own code."""
    try:
        st = os.stat(folder)
    except OSError as e:
        return f"cannot read the kernel cache folder {folder}: {e}"
    bad = "not a folder" if not stat.S_ISDIR(st.st_mode) else _private(st)
    if bad:
        return (f"refusing the kernel cache folder {folder}: {bad}; fix: chmod 700 {folder} as its owner, "
                "or set CODEX_LAB_NATIVE_DIR to a private folder")
    return ""


def _open_verified(so: Path) -> tuple[int | None, str]:
    """(an open descriptor of ``so``, to close, "") when it is a regular file of this user's, not writable by
    others, whose bytes hash to the digest recorded beside it at build time; else (None, why).
    The digest is computed from the opened file (a symlink is not followed)."""
    try:
        fd = os.open(so, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        return None, f"cannot open {so.name} ({e.strerror})"
    try:
        st = os.fstat(fd)
        bad = "not a regular file" if not stat.S_ISREG(st.st_mode) else _private(st)
        if bad:
            raise ValueError(f"{so.name} is {bad}")
        side = so.with_name(so.name + DIGEST_SUFFIX)
        sfd = os.open(side, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(sfd, "rb") as f:
            sst = os.fstat(f.fileno())
            bad = "not a regular file" if not stat.S_ISREG(sst.st_mode) else _private(sst)
            if bad:
                raise ValueError(f"{side.name} is {bad}")
            record = json.loads(f.read(4096))
        h = hashlib.sha256()
        with os.fdopen(os.dup(fd), "rb") as f:
            f.seek(0)
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        if not isinstance(record, dict) or record.get("sha256") != h.hexdigest():
            raise ValueError(f"{so.name} does not match the digest recorded when it was built")
        return fd, ""
    except RecursionError:  # a sidecar of nested brackets: garbage like any other
        os.close(fd)
        return None, f"the digest beside {so.name} is not a digest record"
    except (OSError, ValueError) as e:  # json errors are ValueErrors; a missing sidecar is an OSError
        os.close(fd)
        return None, str(e) if isinstance(e, ValueError) else f"no readable digest beside {so.name} ({e.strerror})"


def _build(source: Path, so: Path, flags: list[str], cc: str) -> str:
    """Compile and link ``source`` into ``so`` and record its digest beside it; "" or why not."""
    torch_lib = Path(torch.__file__).parent / "lib"
    # build under unique names, then rename: two processes building at once never load a
    # half-written file (a reader that sees a new .so with the old digest rebuilds, never loads)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=so.parent)
    os.close(fd)
    obj = tmp[: -len(".so")] + ".o"
    # compile and link in two steps: linking with -ffast-math would add crtfastmath.o,
    # which turns on flush-to-zero for the whole process when the library loads
    # (denormal floats everywhere would read as 0)
    steps = [[cc, *flags, "-c", str(source), "-o", obj],
             [cc, obj, "-o", tmp, f"-L{torch_lib}", *LINK, f"-Wl,-rpath,{torch_lib}"]]
    try:
        for cmd in steps:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if run.returncode != 0:
                return f"compiling {source.name} failed: {(run.stderr or run.stdout).strip()[-400:]}"
        os.chmod(tmp, 0o755)
        digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
        sfd, stmp = tempfile.mkstemp(suffix=DIGEST_SUFFIX, dir=so.parent)
        with os.fdopen(sfd, "w") as f:
            json.dump({"sha256": digest, "size": os.path.getsize(tmp)}, f)
        os.chmod(stmp, 0o644)
        os.replace(tmp, so)
        os.replace(stmp, so.with_name(so.name + DIGEST_SUFFIX))
        return ""
    finally:
        for leftover in (tmp, obj):
            if os.path.exists(leftover):
                os.unlink(leftover)


@lru_cache(maxsize=None)
def load_native(name: str, extra_flags: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library of ``csrc/<name>.c``, "") or (None, why it is unavailable);
    ``extra_flags`` come after the common compile flags (the last of two opposite ones wins).

    Nothing is loaded unverified: the cache folder must be this user's and writable by nobody
    else (else the kernel is refused, with the fix), and the library must be this user's, not
    writable by others, with the SHA-256 recorded beside it at build time; any other file under
    the expected name (planted, stale, half-written) is rebuilt over, never loaded."""
    if os.environ.get("CODEX_LAB_NATIVE", "1") == "0":
        return None, "CODEX_LAB_NATIVE=0"
    source = CSRC / f"{name}.c"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc or gcc) on PATH"
    so = so_path(name, extra_flags)
    try:
        so.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        return None, f"could not create the kernel cache folder {so.parent}: {e}"
    bad_dir = check_cache_dir(so.parent)
    if bad_dir:
        return None, bad_dir
    fd, why = _open_verified(so)
    if fd is None:
        try:
            failed = _build(source, so, _flags() + list(extra_flags), cc)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"could not build {source.name} in {so.parent}: {e}"
        if failed:
            return None, failed
        fd, why = _open_verified(so)
        if fd is None:
            return None, f"refusing {so}: {why} right after building it; another process is writing the cache folder"
    os.close(fd)
    # loaded by name (glibc would take a reused /proc/self/fd/N name for a library already
    # loaded under it): only this user can replace the file in the private folder between the
    # check and the load, and this user could also rewrite the digest
    try:
        return ctypes.CDLL(str(so)), ""
    except OSError as e:
        return None, f"could not load {so}: {e}"
