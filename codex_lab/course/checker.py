"""The checker: the sandboxed process that runs the checks and writes the results
(see :mod:`codex_lab.course.grade_runner`). It never imports the submission: the learner's
functions are proxies to the submission's own process (:mod:`codex_lab.course.remote`).
The sandbox shows it the learner's view of the package; the real modules the view changed
(its oracles) were read into its memory and deleted before anything else ran
(:func:`codex_lab.course.learner_view.install_real`), and the submission's process starts
only after that, with the view alone.

Results go to the parent on stdout, one *frame* per line: ``NONCE KIND LENGTH JSON``, where
``LENGTH`` is the byte length of the (ASCII) JSON body. Each exercise's ``RESULT`` frame is
bounded on its own (:data:`MAX_RESULT_BYTES`): a result that would be larger (a check's
message quoting a huge answer) is replaced here by an ``error`` row saying so, and the parent
(:func:`codex_lab.course.grade_runner.parse_results`) refuses an oversize, cut or malformed
frame for that exercise alone, so one exercise's output can never cost the others theirs.

What the checker shares with the graded code, and why that loads no code into the checker
(:func:`isolate`, run first thing in :func:`child_main`: before the submission's process
exists, before any kernel is loaded or anything compiled, before the checks, the view's
classes or matplotlib are imported). The
submission's process runs as the *same uid* in the same sandbox, so every place either can
write the other can write too, whatever the owner or mode says: the run's folder (the
checker's first working folder, its ``HOME`` and ``TMPDIR``, the submission's work folders
inside it) and the sandbox's /tmp, /var/tmp and /dev/shm. Ownership, permission and digest
checks (:mod:`codex_lab.nn.native_build`'s) cannot tell the checker's own files from the
submission's there. So the checker reads code from none of them:

* native kernels are off (``CODEX_LAB_NATIVE=0``; ``CODEX_LAB_NATIVE_DIR`` names a folder
  that cannot exist): a library planted at :func:`~codex_lab.nn.native_build.so_path` with
  a matching digest is never opened, and the torch paths (same results) run instead;
* ``torch.compile`` is off (``TORCHDYNAMO_DISABLE=1``, ``TORCH_COMPILE_DISABLE=1``, and
  ``torch._dynamo.config.disable``: the sandbox's boot imports the package, whose
  ``__init__`` imports torch and dynamo, before :func:`child_main` runs; Inductor's caches
  off): nothing is compiled, so nothing is looked up in Inductor's cache, whose folder is a
  fresh empty one (torch insists on creating one) that nothing reads (dynamo's own cache
  object kept the folder torch made at import, in the run's ``TMPDIR``: it is read only
  when something compiles). What torch read at import was read before the submission's
  process existed, when the run's folder held the parent's files alone;
* every cache or config root its imports read from ``HOME`` (``HOME`` itself, the XDG
  folders, ``MPLCONFIGDIR``, ``TORCH_HOME``, ``HF_HOME``) is a fresh folder made empty before
  the submission's process starts, and the ones that only ever hold code to load
  (``TORCH_EXTENSIONS_DIR``, ``TRITON_CACHE_DIR``, ``HF_MODULES_CACHE``, CUDA's JIT cache,
  ``CODEX_LAB_LLAMA_CPP``) name a path that cannot exist; matplotlib reads the installed
  ``matplotlibrc`` (``MATPLOTLIBRC``) and its backend is pinned (``MPLBACKEND=Agg``), so an rc
  file planted in its config folder or the working folder is never read, and none names a module;
* the import path holds no folder the run can write (no user site -- the sandbox starts the
  checker with ``python -I``, and :func:`isolate` makes sure of it --, no ``""``, nothing in the
  run's folder), so no module can be planted where an import finds it;
* once its inputs are read, the checker works in ``/`` (read-only in the namespace sandbox):
  nothing relative to its working folder (a ``matplotlibrc``, a relative traceback name, a
  Hugging Face name that is also a folder) can be planted.

The two processes do share the run's folder for *data*: the submission's work folder (the
checker writes the file there), the checker's ``TMPDIR`` (files a check writes there and
reads back could be changed under it; no check does), and the fresh cache folders above
(matplotlib's font cache, for one, is data the same uid could edit after the submission
starts). They share the environment the submission's process inherits (variables, no code),
the read-only Python environment and learner's view, and the call channel (data only,
:mod:`codex_lab.course.wire`). The checker is non-dumpable, so the submission cannot read
its memory or descriptors; it can signal it (same uid), which ends the run with ``error``
rows, never a forged one.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import types
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

# the standard library alone at import (wire, outcome and the rest of the package inside the
# functions that use them): this file can be loaded and isolate() run before anything else
if TYPE_CHECKING:
    from codex_lab.course.outcome import Result

#: The most bytes one exercise's ``RESULT`` frame body may have. A check's message is at
#: most a few hundred characters and the parent shows 2,000 of them; 64 KiB is far above
#: that, and 32 such frames still fit in the run's 2 MiB output cap
#: (:data:`codex_lab.course.grade_runner.MAX_OUTPUT_BYTES`), so a lesson's results always fit.
MAX_RESULT_BYTES = 64 * 1024


def frame(nonce: str, kind: str, payload: Any) -> bytes:
    """One line of the results channel: ``NONCE KIND LENGTH JSON`` (see the module docstring).
    The JSON is ASCII (``ensure_ascii``: no raw newline, bytes == characters), so ``LENGTH``
    lets the reader tell a whole frame from one the output cap cut."""
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=True)
    return f"{nonce} {kind} {len(body)} {body}\n".encode("ascii")


def oversize(size: int | None = None, head: str = "") -> str:
    """The reason given for an exercise whose result frame is over :data:`MAX_RESULT_BYTES`."""
    got = f" ({size:,} bytes)" if size is not None else ""
    msg = (f"answer over {MAX_RESULT_BYTES} bytes: this exercise's result{got} is larger than the grader reports "
           "for one exercise (a check's message quoting a huge value the function returned?); not graded")
    return msg + (f". It began: {head[:300]}" if head else "")


def result_frame(nonce: str, key: tuple[str, str, str] | list[str], r: Result) -> bytes:
    """The ``RESULT`` frame of exercise ``key``; over :data:`MAX_RESULT_BYTES`, an ``error``
    frame with 0 points and the :func:`oversize` reason instead (why: a frame over the
    run's output cap would stop the run and cost every exercise after this one)."""
    from codex_lab.course.outcome import ERROR, Result

    payload = {"key": list(key), **asdict(r)}
    size = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=True))
    if size > MAX_RESULT_BYTES:
        payload = {"key": list(key), **asdict(Result(r.lesson, r.name, ERROR, oversize(size, r.message), 0,
                                                     r.max_points, r.visibility))}
    return frame(nonce, "RESULT", payload)


#: A path nobody can create, root included (a folder below a character device): the checker
#: points the folders it must never load code from below it.
UNCREATABLE = os.path.join(os.devnull, "codex-lab-checker")

#: Switches of the checker's environment (see the module docstring and :func:`isolate`).
SWITCHES = {
    "CODEX_LAB_NATIVE": "0",  # no native kernel: codex_lab.nn.native_build.load_native returns at once
    "TORCHDYNAMO_DISABLE": "1",  # torch.compile returns the function itself
    "TORCH_COMPILE_DISABLE": "1",  # torch._dynamo.config.disable, read when dynamo is imported
    "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
    "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
    "CUDA_CACHE_DISABLE": "1",  # no JIT-compiled GPU code from a cache folder
    "CODEX_LAB_COMPILE_CACHE": "off",  # codex_lab.serve.worker: no Inductor cache of its own in ~/.cache
    "MPLBACKEND": "Agg",  # over any rc file's `backend: module://...`
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "PYTHONNOUSERSITE": "1",  # for any Python started without -I
}

#: Folders that only ever hold code to load: named below :data:`UNCREATABLE`.
NEVER = {
    "CODEX_LAB_NATIVE_DIR": "native",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
    "TRITON_CACHE_DIR": "triton",
    "HF_MODULES_CACHE": "hf_modules",
    "CUDA_CACHE_PATH": "cuda",
    "CODEX_LAB_LLAMA_CPP": "llama.cpp",
}

#: Cache and config roots the checker's imports read (from ``HOME`` by default) and some
#: create at import (torch makes Inductor's cache folder): fresh folders made before the
#: submission's process exists.
FRESH = {
    "HOME": "home",
    "XDG_CACHE_HOME": "cache",
    "XDG_CONFIG_HOME": "config",
    "XDG_DATA_HOME": "data",
    "XDG_STATE_HOME": "state",
    "MPLCONFIGDIR": "matplotlib",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TORCH_HOME": "torch",
    "HF_HOME": "huggingface",
    "CODEX_LAB_CACHE": "codex_lab",
}


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def isolate(run_dir: str | None = None) -> dict[str, str]:
    """Turn off, in this process, every way the checker could load code from a place the graded
    process can write (see the module docstring); returns the environment it set.

    Call it first, before torch, ``codex_lab.nn`` or the checks are imported and before the
    submission's process starts (which inherits these settings). ``run_dir``: the run's folder
    (default: the working folder), where the fresh folders are made (0700) and whose paths are
    taken off the import path."""
    run = os.path.realpath(run_dir or os.getcwd())
    fresh_root = tempfile.mkdtemp(prefix="checker-", dir=run)  # 0700, empty
    env = dict(SWITCHES)
    env.update({var: os.path.join(UNCREATABLE, name) for var, name in NEVER.items()})
    for var, name in FRESH.items():
        folder = os.path.join(fresh_root, name)
        os.mkdir(folder, 0o700)
        env[var] = folder
    try:  # matplotlib reads the installed rc file first, not one planted in its config folder
        import importlib.util

        spec = importlib.util.find_spec("matplotlib")  # (finds the package; runs none of it)
        for loc in (spec.submodule_search_locations or []) if spec is not None else []:
            rc = os.path.join(loc, "mpl-data", "matplotlibrc")
            if os.path.isfile(rc):
                env["MATPLOTLIBRC"] = rc
                break
    except (ImportError, ValueError):
        pass
    os.environ.update(env)
    # already imported (never so when the sandbox starts the checker): the switches read at import
    dynamo = sys.modules.get("torch._dynamo.config")
    if dynamo is not None:
        dynamo.disable = True  # type: ignore[attr-defined]
    native = sys.modules.get("codex_lab.nn.native_build")
    if native is not None:
        native.load_native.cache_clear()  # type: ignore[attr-defined]
    # no import root the run can write: no user site (the sandbox starts the checker with -I, which
    # never adds it; its folder would be in the run's HOME), no "" (the working folder), no folder
    # in the run's folder (other relative entries, such as an editable install's path-hook name,
    # stay: child_main moves to the read-only "/" before anything else is imported)
    import site

    site.ENABLE_USER_SITE = False
    keep = []
    for p in sys.path:
        # off the path: the working folder, the run's folders, and any folder this process can write
        # (in user-namespace mode the folders the sandbox creates above a read-only bind, e.g. a
        # checkout under /tmp, are writable: a module planted there would be found by name);
        # packages already imported keep their own __path__
        if p in ("", ".") or (os.path.isabs(p) and (_inside(os.path.realpath(p), run) or os.access(p, os.W_OK))):
            sys.path_importer_cache.pop(p, None)
            continue
        keep.append(p)
    sys.path[:] = keep
    return env


def _private() -> None:
    """Linux: make this process non-dumpable, so a process of the same uid (the submission's)
    can neither ptrace it nor open its /proc/PID/mem, environ or fd entries."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4


def _read_folder(name: str) -> dict[str, str]:
    folder = Path(name)
    if not folder.is_dir():
        return {}
    out = {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.py"))}
    shutil.rmtree(folder)
    return out


def _load_checks(sources: dict[str, str], pkg_root: Path) -> None:
    """Import each lesson checks module from its copy (the real file is hidden in the sandbox)."""
    import importlib

    for fname, text in sources.items():
        mod = fname[: -len(".py")]
        parent = mod.rpartition(".")[0]
        importlib.import_module(parent)
        module = types.ModuleType(mod)
        module.__file__ = str(pkg_root.joinpath(*mod.split(".")[1:])) + ".py"  # the real path: tracebacks, forbid
        module.__package__ = parent
        sys.modules[mod] = module
        exec(compile(text, module.__file__, "exec"), module.__dict__)


def _load_hidden(sources: dict[str, str]) -> dict[tuple[str, str], Any]:
    from codex_lab.course import checks

    reg: dict[tuple[str, str], Any] = {}
    checks._target.append(reg)
    checks._visibility.append(checks.HIDDEN)
    try:
        for i, (fname, text) in enumerate(sources.items()):
            name = f"codex_lab_hidden_checks_{i}_{fname[:-3]}"
            module = types.ModuleType(name)
            module.__file__ = f"hidden/{fname}"
            sys.modules[name] = module
            exec(compile(text, module.__file__, "exec"), module.__dict__)
    finally:
        checks._target.pop()
        checks._visibility.pop()
    return reg


def child_main() -> None:
    """Run ``task.json`` (cwd); report on stdout as ``NONCE KIND JSON`` lines."""
    run = os.path.realpath(os.getcwd())
    isolate(run)  # first: nothing below may load code from a place the submission can write
    task = json.loads(Path("task.json").read_text())
    os.remove("task.json")
    nonce = task.pop("nonce")
    checks_src, hidden_src = _read_folder("checks"), _read_folder("hidden")
    sub_name = task["submission"]
    sub_text = Path(sub_name).read_text(encoding="utf-8")
    os.remove(sub_name)
    os.chdir(os.path.abspath(os.sep))  # inputs read: from now on nothing is relative to a writable folder
    _private()
    from codex_lab.course import wire
    # the classes the submission's answers may name, loaded now from the view (before the
    # submission's process exists): decoding its answers looks them up and never imports
    wire.preload()
    chan = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # the checks' own prints must not mix with the results
    lock = threading.Lock()

    def emit(data: bytes) -> None:
        with lock:
            view = memoryview(data)
            while view:  # a short write must not leave half a frame for the next one to follow
                view = view[os.write(chan, view):]

    from codex_lab.course.outcome import ERROR, Result
    from codex_lab.course.remote import SubmissionGone, SubmissionProcess, SubmissionTimeout

    servers: dict[str, SubmissionProcess | None] = {}

    def server(vis: str) -> SubmissionProcess:
        for other, s in servers.items():  # one submission process at a time: hidden never overlaps public
            if other != vis and s is not None:
                s.close()
                servers[other] = None
        if servers.get(vis) is None:
            work = Path(run) / f"work-{vis}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            (work / sub_name).write_text(sub_text, encoding="utf-8")
            servers[vis] = SubmissionProcess(sub_name, task["forbid"].get(vis, []), cwd=str(work),
                                             startup_s=float(task["startup_s"]), view=task.get("view"))
        return servers[vis]  # type: ignore[return-value]

    todo_keys = [tuple(k) for k in task["todo"]]
    if todo_keys:
        server(todo_keys[0][2])  # loads torch and the file while the checks load here
    import torch  # noqa: F401

    from codex_lab.course import checks
    from codex_lab.course.outcome import run_check

    _load_checks(checks_src, Path(checks.__file__).resolve().parents[1])
    registry = {(les, n, e.visibility): e for (les, n), e in checks.REGISTRY.items() if les == task["lesson"]}
    registry.update({(les, n, checks.HIDDEN): e for (les, n), e in _load_hidden(hidden_src).items()})
    sys.stdout = sys.stderr = wire.Discard()  # type: ignore[assignment]
    timeout_s = float(task["timeout_s"])
    for key in todo_keys:
        e = registry.get(key)
        if e is None:
            continue
        emit(frame(nonce, "BEGIN", list(key)))
        timer = threading.Timer(timeout_s + float(task["check_s"]), lambda: os._exit(3))
        timer.daemon = True
        timer.start()
        proc = server(e.visibility)

        def res(status: str, msg: str) -> Result:
            return Result(e.lesson, e.name, status, msg, 0, e.points, e.visibility)

        if proc.load_error is not None:
            r = res(ERROR, f"could not load {sub_name}: {proc.load_error}")
        else:
            proc.budget(timeout_s)
            try:
                r = run_check(e, proc.function(e.name) if e.name in proc.names else None)
            except SubmissionTimeout:
                r = res(ERROR, f"timed out after {timeout_s:g} s (an endless loop?)")
            except SubmissionGone as exc:
                r = res(ERROR, str(exc))
            except BaseException as exc:  # noqa: BLE001 - a check defect must not stop the others
                r = res(ERROR, f"{type(exc).__name__}: {exc}"[:500])
            if proc.dead:
                servers[e.visibility] = None
        timer.cancel()
        emit(result_frame(nonce, key, r))
    for s in servers.values():
        if s is not None:
            s.close()
    os._exit(0)
