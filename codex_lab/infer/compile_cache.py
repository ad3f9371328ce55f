"""Where compiled decode graphs are kept between runs, and the checks that make it safe to
load code from there: Inductor's cache (the graphs ``torch.compile`` builds) and the
ahead-of-time packages (:mod:`codex_lab.infer.aot_step`) live in one private folder per torch
build, so a restarted server or a second ``codex-lab generate`` loads what an earlier one built.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

# the compiled decode graphs' on-disk cache (Inductor's FX graph cache and its kernels)
COMPILE_CACHE_ENV = "CODEX_LAB_COMPILE_CACHE"  # a folder for it, or "off" (Inductor's own default)


def compile_cache_dir() -> Path:
    """Where the compiled graphs are kept: ``$CODEX_LAB_COMPILE_CACHE``, else the user's cache
    folder (``$XDG_CACHE_HOME`` or ``~/.cache``) ``/codex_lab/inductor``; one subfolder per torch
    version and build (``torch-2.13.0+cpu``), since Inductor's artifacts are not portable across
    them (the FX graph cache keys the model's graph, shapes and options itself)."""
    import torch

    root = os.environ.get(COMPILE_CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"), "codex_lab", "inductor")
    return Path(root) / ("torch-" + "".join(c if c.isalnum() or c in ".+-_" else "_" for c in torch.__version__))


def use_compile_cache(folder: Path | None = None) -> dict[str, Any]:
    """Point Inductor's cache (``TORCHINDUCTOR_CACHE_DIR``) at ``folder`` (default
    :func:`compile_cache_dir`) before the first compile, so a restart of the same model loads its
    graphs instead of compiling them again. The folder is created private (0700) and must be this
    user's and writable by nobody else, with the parent this code creates (the checks of the native
    kernels' cache, :mod:`codex_lab.nn.native_build`): another user able to write there could plant
    compiled code this process would load. A folder that fails them is refused: the graphs then
    compile into a private temporary folder, reused by nothing, and the reason is returned (and
    shown in ``/health``). ``$CODEX_LAB_COMPILE_CACHE=off`` leaves Inductor's own default alone.

    Returns ``{"dir", "active", "reason"}``: the folder in use, whether it persists across
    restarts, and why not ("" when it does)."""
    import atexit
    import shutil
    import tempfile

    if folder is None and os.environ.get(COMPILE_CACHE_ENV, "").lower() == "off":
        return {"dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"), "active": False,
                "reason": f"{COMPILE_CACHE_ENV}=off: Inductor's own default cache"}
    folder = Path(folder) if folder is not None else compile_cache_dir()
    reason = private_folder(folder)
    if not reason:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
        return {"dir": str(folder), "active": True, "reason": ""}
    tmp = tempfile.mkdtemp(prefix="codex_lab_inductor_")  # 0700, this process's only
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp
    return {"dir": tmp, "active": False,
            "reason": reason + "; compiling into a private temporary folder instead (nothing reused on restart)"}




def private_folder(folder: Path) -> str:
    """Create ``folder`` (0700) if needed and check it and its parent are this user's and writable
    by nobody else (another user able to write there could plant compiled code this process would
    load). Returns "" when it is safe, else why not and the fix."""
    from codex_lab.nn.native_build import _private

    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        for level in (folder.parent, folder):  # the key folder and the one above it (another user could swap it)
            st = os.stat(level)
            bad = "not a folder" if not stat.S_ISDIR(st.st_mode) else _private(st)
            if bad:
                return (f"refusing the compile cache folder {level}: {bad}; fix: chmod 700 {level} as its "
                        f"owner, or set {COMPILE_CACHE_ENV} to a private folder")
    except OSError as exc:
        return f"cannot use the compile cache folder {folder}: {exc}"
    return ""


__all__ = ["COMPILE_CACHE_ENV", "compile_cache_dir", "private_folder", "use_compile_cache"]
