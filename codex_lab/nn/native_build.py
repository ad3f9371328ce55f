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
the callers run their torch paths.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

__all__ = ["CSRC", "load_native"]

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


@lru_cache(maxsize=None)
def load_native(name: str, extra_flags: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library of ``csrc/<name>.c``, "") or (None, why it is unavailable);
    ``extra_flags`` come after the common compile flags (the last of two opposite ones wins)."""
    if os.environ.get("CODEX_LAB_NATIVE", "1") == "0":
        return None, "CODEX_LAB_NATIVE=0"
    source = CSRC / f"{name}.c"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc or gcc) on PATH"
    torch_lib = Path(torch.__file__).parent / "lib"
    flags = _flags() + list(extra_flags)
    link = ["-shared", "-fopenmp", "-ltorch_cpu", "-lm"]
    key = hashlib.sha256("\n".join([source.read_text(), " ".join(flags + link), torch.__version__, _cpu_id()]).encode())
    so = _cache_dir() / f"{name}-{key.hexdigest()[:16]}.so"
    if not so.exists():
        try:
            so.parent.mkdir(parents=True, exist_ok=True)
            # build under a unique name, then rename: two processes building at once never
            # load a half-written file
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=so.parent)
            os.close(fd)
            obj = tmp[: -len(".so")] + ".o"
            # compile and link in two steps: linking with -ffast-math would add crtfastmath.o,
            # which turns on flush-to-zero for the whole process when the library loads
            # (denormal floats everywhere would read as 0)
            steps = [[cc, *flags, "-c", str(source), "-o", obj],
                     [cc, obj, "-o", tmp, f"-L{torch_lib}", *link, f"-Wl,-rpath,{torch_lib}"]]
            try:
                for cmd in steps:
                    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                    if run.returncode != 0:
                        os.unlink(tmp)
                        return None, f"compiling {source.name} failed: {(run.stderr or run.stdout).strip()[-400:]}"
            except (OSError, subprocess.SubprocessError):
                os.unlink(tmp)
                raise
            finally:
                if os.path.exists(obj):
                    os.unlink(obj)
            os.replace(tmp, so)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"could not build {source.name} in {so.parent}: {e}"
    try:
        return ctypes.CDLL(str(so)), ""
    except OSError as e:
        return None, f"could not load {so}: {e}"
