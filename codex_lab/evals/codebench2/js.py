"""Run JavaScript programs (the ``translate`` family) under Node, many per process.

The course's sandbox (:func:`codex_lab.sandbox.run_python`) runs Python only: its root
filesystem exposes the Python installation, not Node, and its guard disables ``subprocess``.
So JavaScript runs here, under a plain child process:

- ``node`` in a fresh temporary working directory, with a minimal environment, its own
  session (the whole group is killed on timeout), and ``resource`` limits set in the child
  before ``exec`` (``preexec_fn``): CPU seconds, address space (:data:`NODE_MEMORY_MB`; V8
  reserves ~1 GiB of *virtual* memory for its code range at start and aborts under 1024
  MiB: measured with node 20, 512 MiB fails, 1024 MiB starts, 4096 leaves room for the
  heap), file size and open files;
- no network **only where** ``unshare --net`` works (root, or unprivileged user namespaces;
  :func:`network_isolated`): then node runs in an empty network namespace. Elsewhere
  nothing stops a program from opening a socket: rlimits cannot forbid it;
- each program runs in a fresh ``vm`` context (its own globals, no ``require``, no
  ``process``) with a per-program timeout (``vm``'s ``timeout``: infinite loops end).
  ``vm`` is *not* a security boundary (the Node documentation says so): a hostile program
  can reach ``process`` through constructors. This runner is for model answers to
  translation prompts, not for adversarial code; run it in a container for that.

A program passes when it runs to its end without throwing (the harness throws on a wrong
output). A batch whose process dies is rerun one process per program (as
:func:`codex_lab.evals.codebench_run.execute_batched` does for Python).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import tempfile
from functools import lru_cache

NODE_MEMORY_MB = 4096  # address-space limit: V8 needs ~1 GiB virtual to start (measured), the rest is heap room
_MARK = "@@codebench2-js-results@@"
_DRIVER = r"""
const fs = require("fs");
const vm = require("vm");
const programs = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const limitMs = Number(process.argv[3]);
const results = [];
for (const src of programs) {
  let ok = false, why = "";
  try {
    vm.runInNewContext(src, Object.create(null), { timeout: limitMs, filename: "main.js" });
    ok = true;
  } catch (e) {
    why = (e && e.code === "ERR_SCRIPT_EXECUTION_TIMEOUT") ? "timed out"
        : String((e && e.name ? e.name + ": " : "") + (e && e.message !== undefined ? e.message : e));
  }
  results.push([ok, ok ? "passed" : why.split("\n")[0].slice(0, 200)]);
}
process.stdout.write("\n__MARK__" + JSON.stringify(results) + "\n");
""".replace("__MARK__", _MARK)


def node_path() -> str | None:
    """The ``node`` executable on PATH, or None (install it: ``apt-get install nodejs``)."""
    return shutil.which("node")


@lru_cache(maxsize=1)
def network_isolated() -> bool:
    """True when ``unshare --net`` works here, so node runs with no network at all."""
    unshare = shutil.which("unshare")
    if not unshare:
        return False
    try:
        probe = subprocess.run([unshare, *_user_flags(), "--net", "true"], capture_output=True, timeout=10)
        return probe.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _user_flags() -> list[str]:
    return [] if os.geteuid() == 0 else ["--user", "--map-root-user"]


def _limits(cpu_s: int, memory_mb: int):
    def apply() -> None:  # runs in the child between fork and exec
        for name, value in (("RLIMIT_CPU", cpu_s), ("RLIMIT_AS", memory_mb << 20), ("RLIMIT_FSIZE", 16 << 20),
                            ("RLIMIT_NOFILE", 256), ("RLIMIT_CORE", 0)):
            try:
                resource.setrlimit(getattr(resource, name), (value, value))
            except (ValueError, OSError, AttributeError):
                pass
    return apply


def run_js_batch(programs: list[str], *, timeout_s: float = 2.0,
                 memory_mb: int = NODE_MEMORY_MB) -> list[tuple[bool, str]] | None:
    """Run ``programs`` in one node process; (passed, detail) per program, or None if the process died.

    Raises:
        FileNotFoundError: node is not installed (the message says how to install it).
    """
    node = node_path()
    if node is None:
        raise FileNotFoundError("node not found: apt-get install nodejs (the translate family runs JavaScript)")
    total = timeout_s * len(programs) + 10.0  # every program's limit, plus node's start
    with tempfile.TemporaryDirectory(prefix="codebench2-js-") as tmp:
        with open(os.path.join(tmp, "driver.js"), "w") as f:
            f.write(_DRIVER)
        with open(os.path.join(tmp, "programs.json"), "w") as f:
            json.dump(programs, f)
        cmd = [node, "driver.js", "programs.json", str(int(timeout_s * 1000))]
        if network_isolated():
            cmd = [shutil.which("unshare") or "unshare", *_user_flags(), "--net", *cmd]
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8"}
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=total,
                                  preexec_fn=_limits(int(total) + 1, memory_mb), start_new_session=True)
        except subprocess.TimeoutExpired:
            return None
    at = proc.stdout.rfind(_MARK)
    if at < 0:
        return None
    rows = json.loads(proc.stdout[at + len(_MARK):].strip())
    return [(bool(ok), str(why)) for ok, why in rows] if len(rows) == len(programs) else None


def run_js(programs: list[str], *, timeout_s: float = 2.0, batch: int = 256) -> list[tuple[bool, str]]:
    """Run every program (``batch`` per node process); a dead batch is rerun one process per program."""
    out: list[tuple[bool, str]] = []
    for start in range(0, len(programs), batch):
        chunk = programs[start:start + batch]
        rows = run_js_batch(chunk, timeout_s=timeout_s)
        if rows is None:
            rows = []
            for src in chunk:
                one = run_js_batch([src], timeout_s=timeout_s)
                rows.append(one[0] if one else (False, "the node process died (memory, timeout or exit)"))
        out += rows
    return out
