"""llama.cpp's native binaries, built from source for this CPU by ``scripts/build_llama_cpp.sh``:
finding them, one ``llama-bench`` test, and ``llama-server`` started and stopped around a block.

The install folder is ``~/.cache/codex_lab/llama.cpp`` (``CODEX_LAB_LLAMA_CPP`` to change); each
binary can also be named by its own variable (``CODEX_LAB_LLAMA_SERVER``, ``CODEX_LAB_LLAMA_BENCH``)
or found on PATH. Nothing here downloads or builds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


def install_dir() -> Path:
    """Where ``scripts/get_llama_cpp.sh`` installs (``CODEX_LAB_LLAMA_CPP`` to change)."""
    return Path(os.environ.get("CODEX_LAB_LLAMA_CPP", Path.home() / ".cache" / "codex_lab" / "llama.cpp"))


SERVER_HINT = ("llama.cpp's llama-server is not built: run `bash scripts/build_llama_cpp.sh` (builds it from the "
               "llama.cpp that llama-cpp-python's sdist vendors into ~/.cache/codex_lab/llama.cpp/build, tens of "
               "minutes on 2 cores; needs cmake, g++, make) or set CODEX_LAB_LLAMA_SERVER to a llama-server binary")


def find_llama_server() -> Path | None:
    """llama.cpp's ``llama-server``: ``CODEX_LAB_LLAMA_SERVER``, else what ``scripts/build_llama_cpp.sh``
    built, else one on PATH; None when there is none (then :data:`SERVER_HINT`)."""
    env = os.environ.get("CODEX_LAB_LLAMA_SERVER")
    for cand in ([Path(env)] if env else []) + [install_dir() / "build" / "bin" / "llama-server"]:
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    found = shutil.which("llama-server")
    return Path(found) if found else None


def find_llama_bench() -> Path | None:
    """llama.cpp's ``llama-bench`` built from source: ``CODEX_LAB_LLAMA_BENCH``, else beside the
    ``llama-server`` that :func:`find_llama_server` finds (``scripts/build_llama_cpp.sh`` builds both),
    else one on PATH; None when there is none."""
    env = os.environ.get("CODEX_LAB_LLAMA_BENCH")
    server = find_llama_server()
    for cand in ([Path(env)] if env else []) + ([server.parent / "llama-bench"] if server else []):
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    found = shutil.which("llama-bench")
    return Path(found) if found else None


def home_relative(path: Path) -> str:
    """``path`` with the home folder written ``~`` (a record names no user's absolute path)."""
    home = str(Path.home())
    return "~" + str(path)[len(home):] if str(path).startswith(home + os.sep) else str(path)


def llama_bench(binary: Path, gguf: str | Path, *, prompt: int, gen: int, depth: int, threads: int) -> dict[str, Any]:
    """One ``llama-bench`` test, once (after its own warm-up run): ``prompt`` tokens of prefill or
    ``gen`` tokens of greedy decode after ``depth`` tokens already in the cache. Returns its JSON
    record (``avg_ts``: tokens/s; ``build_commit``, ``cpu_info``); RuntimeError with its output
    when it fails."""
    cmd = [str(binary), "-m", str(gguf), "-p", str(prompt), "-n", str(gen), "-d", str(depth), "-t", str(threads),
           "-r", "1", "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    try:
        return dict(json.loads(proc.stdout)[0])
    except (json.JSONDecodeError, IndexError, KeyError):
        raise RuntimeError(f"llama-bench failed (code {proc.returncode}): {proc.stderr.strip()[-300:]}") from None


class LlamaServer:
    """llama.cpp's OpenAI-compatible server on ``gguf`` at 127.0.0.1:``port`` with ``slots``
    parallel slots of ``context`` tokens each and ``threads`` math threads; started on enter
    (waits until ``/v1/models`` answers, at most ``start_s``), stopped on exit. ``url``."""

    def __init__(self, gguf: str | Path, *, port: int, slots: int, context: int, threads: int,
                 alias: str = "codex-lab", start_s: float = 120.0) -> None:
        exe = find_llama_server()
        if exe is None:
            raise FileNotFoundError(SERVER_HINT)
        self.url = f"http://127.0.0.1:{port}"
        self.cmd = [str(exe), "-m", str(gguf), "--alias", alias, "--host", "127.0.0.1", "--port", str(port),
                    "-c", str(context * slots), "-np", str(slots), "-t", str(threads), "-tb", str(threads)]
        self.start_s = start_s
        self.proc: subprocess.Popen[str] | None = None
        self.log: Any = None

    def __enter__(self) -> "LlamaServer":
        import httpx

        # the server's log goes to a file: a pipe nobody reads fills after ~100 requests' lines and
        # then blocks the server's writes, which stalls every stream (seen 2026-12-03)
        self.log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        t0 = time.monotonic()
        while True:
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() - t0 > self.start_s:
                self.log.seek(0)
                out = self.log.read()[-1500:]
                self.__exit__()
                raise RuntimeError(f"llama-server did not start within {self.start_s:.0f} s: {out}")
            time.sleep(0.25)

    def version(self) -> str:
        """``llama-server --version``'s first lines (version and commit)."""
        r = subprocess.run([self.cmd[0], "--version"], capture_output=True, text=True, timeout=30)
        return " ".join((r.stdout + r.stderr).split())[:200]

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.log is not None and not self.log.closed:
            self.log.close()  # a temporary file: removed on close


__all__ = ["LlamaServer", "SERVER_HINT", "find_llama_bench", "find_llama_server", "home_relative", "install_dir",
           "llama_bench"]
