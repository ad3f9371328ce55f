"""The submission's own process: loads the learner's file and answers calls, as data.

Started by the checker (:mod:`codex_lab.course.remote`) inside the grading sandbox, with
its stdin/stdout as the call channel (:mod:`codex_lab.course.wire`) and nothing else: the
learner's prints go to a sink, fd 0/1/2 to ``/dev/null``.

The boundary is what this process can see: it imports the learner's view of the package
(:mod:`codex_lab.course.learner_view`), where the functions the exercises ask for are stubs
and the real files are not mounted, so no code in this process -- whatever it does to the
hook below, the stack or its own modules -- can load the answer. Everything below is a
second line (and the only line for library built-ins, which live in this process's own
torch / transformers). Before the submission is loaded:

* every forbidden package function (``forbid=`` of the exercises it serves) gets its code
  object replaced by one that raises :class:`~codex_lab.course.forbid.ForbiddenCall`, so
  aliases, default-argument copies and ``types.FunctionType`` clones all refuse;
* an audit hook (PEP 578: it cannot be removed) refuses, once the file is loaded, to open
  the source or cached bytecode of a module holding a forbidden function (``importlib.reload``,
  ``inspect.getsource``, ``exec(open(...).read())``), to exec / unmarshal / build code whose
  bytecode is a forbidden function's, to set ``__code__``, to use ``ctypes``, to start
  processes, to make links, and to import any lesson's ``checks`` module;
* the sandbox guard (:mod:`codex_lab.sandbox.guard`) is installed.
After loading, a function of the file whose code (or a nested one) is a forbidden
function's bytecode (a verbatim copy) is replaced by the refusal too.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import re
import sys
import types
from typing import Any

from codex_lab.course import wire
from codex_lab.course.forbid import ForbiddenCall, message, package_origin, resolve

_CHECKS_MODULE = re.compile(r"codex_lab\.lessons\.[^.]+\.checks$")
_CHECKS_FILE = re.compile(r".*/codex_lab/lessons/[^/]+/(__pycache__/)?checks(\.[^/]*)?\.py[c]?$")
_SPAWN = ("os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "subprocess.Popen",
          "os.kill", "os.killpg", "signal.pthread_kill", "os.symlink", "os.link", "sys.addaudithook", "pty.spawn")


def fingerprint(code: types.CodeType) -> str:
    """Bytecode identity of a function: instructions, names and constants (nested code by
    fingerprint); local names and line numbers left out, so a renamed-locals copy matches."""
    consts = code.co_consts
    if consts and isinstance(consts[0], str):  # the docstring slot: a copy without it keeps the indices
        consts = (None,) + consts[1:]
    parts = tuple(fingerprint(c) if isinstance(c, types.CodeType) else (type(c).__name__, repr(c)) for c in consts)
    return hashlib.sha256(repr((code.co_code, code.co_names, parts)).encode()).hexdigest()


def _codes(code: types.CodeType) -> list[types.CodeType]:
    out = [code]
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out += _codes(c)
    return out


def _stub_code(name: str, dotted: str, nfree: int) -> types.CodeType:
    """Code raising ForbiddenCall for ``dotted``, with ``nfree`` free variables (a closure's code
    can only be swapped for code with as many)."""
    frees = [f"_f{i}" for i in range(nfree)]
    src = "def _outer():\n" + "".join(f"    {f} = None\n" for f in frees)
    src += f"    def {name}(*args, **kwargs):\n"
    if frees:
        src += f"        ({', '.join(frees)},)\n"
    src += f"        raise __codex_lab_forbidden__({dotted!r})\n    return {name}\n"
    ns: dict[str, Any] = {}
    exec(compile(src, "<forbidden>", "exec"), ns)
    return ns["_outer"]().__code__


def _refusal(dotted: str) -> ForbiddenCall:
    return ForbiddenCall(message(dotted))


def _raw_key(co_code: bytes) -> str:
    return hashlib.sha256(co_code).hexdigest()


def known_codes(names: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Checker side: what the forbidden functions are *in this process* (the real package),
    as data the submission's process may hold without holding the answers: bytecode
    fingerprints, hashes of the raw bytecode, and the source files' paths."""
    import inspect

    prints: dict[str, str] = {}
    raw: dict[str, str] = {}
    files: set[str] = set()

    def add(fn: Any, dotted: str) -> None:
        fn = getattr(fn, "__func__", fn)
        if isinstance(fn, property):
            fn = fn.fget
        try:
            fn = inspect.unwrap(fn)
        except ValueError:
            pass
        code = getattr(fn, "__code__", None)
        if not isinstance(code, types.CodeType):
            return
        prints[fingerprint(code)] = dotted
        if len(code.co_code) > 16:  # a trivial body (return x) is no answer
            raw[_raw_key(code.co_code)] = dotted
        files.add(os.path.realpath(code.co_filename))

    for dotted in names:
        try:
            _owner, _attr, obj = resolve(dotted)
        except (ValueError, ImportError, AttributeError):
            continue
        if isinstance(obj, type):
            for v in vars(obj).values():
                add(v, dotted)
            try:
                files.add(os.path.realpath(inspect.getsourcefile(obj) or ""))
            except TypeError:
                pass
        else:
            add(obj, dotted)
    files.discard("")
    return {"prints": prints, "raw": raw, "files": sorted(files)}


class Forbidden:
    """What the forbidden functions were: fingerprints, hashes of raw bytecode, source files."""

    def __init__(self) -> None:
        self.prints: dict[str, str] = {}  # fingerprint -> dotted name
        self.raw: dict[str, str] = {}  # sha256 of co_code -> dotted name
        self.files: set[str] = set()

    def add_code(self, code: types.CodeType, dotted: str) -> None:
        self.prints[fingerprint(code)] = dotted
        if len(code.co_code) > 16:  # a trivial body (return x) is no answer
            self.raw[_raw_key(code.co_code)] = dotted
        self.files.add(os.path.realpath(code.co_filename))

    def add_known(self, known: dict[str, Any]) -> None:
        self.prints.update({str(k): str(v) for k, v in dict(known.get("prints", {})).items()})
        self.raw.update({str(k): str(v) for k, v in dict(known.get("raw", {})).items()})
        self.files.update(str(f) for f in known.get("files", []))

    def match(self, code: types.CodeType) -> str | None:
        for c in _codes(code):
            hit = self.prints.get(fingerprint(c))
            if hit is not None:
                return hit
        return None

    def blocks_path(self, path: str) -> bool:
        real = os.path.realpath(path)
        if real in self.files or re.fullmatch(r"/proc/[^/]+/(task/[^/]+/)?mem", real) or _CHECKS_FILE.fullmatch(real):
            return True
        folder, base = os.path.split(real)
        if os.path.basename(folder) == "__pycache__":
            src_dir = os.path.dirname(folder)
            return any(os.path.dirname(f) == src_dir and base.startswith(os.path.basename(f)[:-3] + ".")
                       for f in self.files)
        return False


def install_forbid(names: list[str], known: dict[str, Any] | None = None) -> Forbidden:
    """Swap each forbidden function's code for a refusal and every module attribute that is a
    forbidden class or built-in for one (see the module docstring). ``known``: the checker's
    :func:`known_codes` of the real functions (this process may import the learner's view, whose
    functions are stubs: their own code is then no fingerprint of the answer)."""
    import inspect

    fb = Forbidden()
    if known is not None:
        fb.add_known(known)
    for dotted in names:
        try:
            owner, attr, obj = resolve(dotted)
        except (ValueError, ImportError, AttributeError):
            if known is not None:  # a library the learner's view lacks: nothing to refuse
                continue
            raise
        obj = getattr(obj, "__func__", obj)
        if isinstance(obj, types.FunctionType):
            if known is None:
                fb.add_code(obj.__code__, dotted)
            fb.files.add(os.path.realpath(obj.__code__.co_filename))
            obj.__globals__["__codex_lab_forbidden__"] = _refusal
            obj.__code__ = _stub_code(obj.__name__, dotted, len(obj.__code__.co_freevars))
            continue
        if isinstance(obj, type):  # a class: its methods' code, its file
            for v in vars(obj).values():
                v = getattr(v, "__func__", v)
                if isinstance(v, types.FunctionType) and known is None:
                    fb.add_code(v.__code__, dotted)
            try:
                fb.files.add(os.path.realpath(inspect.getsourcefile(obj) or ""))
            except TypeError:
                pass

        def refuse(*args: Any, _d: str = dotted, **kwargs: Any) -> Any:
            raise _refusal(_d)

        for mod in list(sys.modules.values()):  # every module attribute that is this object
            d = getattr(mod, "__dict__", None)
            if isinstance(d, dict):
                for k, v in list(d.items()):
                    if v is obj:
                        d[k] = refuse
        if getattr(owner, attr, None) is obj:
            setattr(owner, attr, refuse)
    return fb


def install_hook(fb: Forbidden, own_file: str = "") -> dict[str, bool]:
    """The audit hook of the module docstring; returns its switches (``armed``; ``busy``
    while the server itself works). The exec of the submission's own module (``own_file``)
    is let through: its verbatim copies are refused one by one afterwards (:func:`_copies`)."""
    import marshal

    state = {"armed": False, "busy": False, "own": True}

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if not state["armed"] or state["busy"]:
            return
        if event == "open":
            p = args[0]
            if isinstance(p, (str, bytes, os.PathLike)) and fb.blocks_path(os.fsdecode(p)):
                raise PermissionError(f"{os.fsdecode(p)} holds the package's answer to this exercise: write this one yourself")
        elif event.startswith("ctypes.") or event in _SPAWN or event.startswith(("os.exec", "os.spawn", "os.posix_spawn")):
            raise PermissionError(f"{event} is disabled while a submission is graded")
        elif event == "object.__setattr__" and len(args) > 1 and args[1] in ("__code__", "__globals__"):
            raise PermissionError("setting __code__ is disabled while a submission is graded")
        elif event == "exec" and args and isinstance(args[0], types.CodeType):
            if state["own"] and args[0].co_filename == own_file:  # once: the file itself being loaded
                state["own"] = False
                return
            hit = fb.match(args[0])
            if hit:
                raise _refusal(hit)
        elif event == "code.__new__" and args and isinstance(args[0], bytes) and _raw_key(args[0]) in fb.raw:
            raise _refusal(fb.raw[_raw_key(args[0])])
        elif event in ("marshal.loads", "marshal.load") and args and isinstance(args[0], (bytes, bytearray)):
            state["busy"] = True
            try:
                code = marshal.loads(bytes(args[0]))
            except Exception:  # noqa: BLE001 - not ours to judge; the real call will raise
                code = None
            finally:
                state["busy"] = False
            hit = fb.match(code) if isinstance(code, types.CodeType) else None
            if hit:
                raise _refusal(hit)
        elif event == "import" and args and isinstance(args[0], str) and _CHECKS_MODULE.match(args[0]):
            raise ImportError(f"{args[0]} holds the grader's checks; a submission cannot import it")

    sys.addaudithook(hook)
    return state


def _copies(module: types.ModuleType, fb: Forbidden) -> None:
    """Functions of the file that are verbatim copies of a forbidden one refuse too."""
    seen: set[int] = set()

    def visit(obj: Any, depth: int = 0) -> None:
        if id(obj) in seen or depth > 4:
            return
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType) and obj.__module__ == module.__name__:
            hit = fb.match(obj.__code__)
            if hit:
                obj.__globals__["__codex_lab_forbidden__"] = _refusal
                obj.__code__ = _stub_code(obj.__name__, hit, len(obj.__code__.co_freevars))
        elif isinstance(obj, type) and obj.__module__ == module.__name__:
            for v in vars(obj).values():
                visit(getattr(v, "__func__", v), depth + 1)

    for v in list(vars(module).values()):
        visit(v)


def main() -> None:
    """Serve one submission on stdin/stdout (see the module docstring)."""
    from codex_lab.course.remote_serve import Server

    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    chan = wire.Channel(rfd, wfd)
    init, _ = chan.recv()
    import torch  # noqa: F401  (warm; the exercises need it)

    from codex_lab.course.exercises import load_definitions

    fb = install_forbid(list(init.get("forbid", [])), init.get("known"))
    state = install_hook(fb, str(init["submission"]))
    if init.get("guard", True):
        from codex_lab.sandbox.guard import install

        install(os.getcwd())
    sys.stdout = sys.stderr = wire.Discard()  # type: ignore[assignment]
    linecache.clearcache()
    state["armed"] = True  # before the file loads: code in class bodies and default arguments runs now
    try:
        module = load_definitions(init["submission"])
        state["busy"] = True
        _copies(module, fb)
        state["busy"] = False
    except BaseException as exc:  # noqa: BLE001 - a broken submission, whatever it raised
        state["busy"] = True
        chan.send({"op": "ready", "ok": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
        os._exit(0)
    names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("__")]
    chan.send({"op": "ready", "ok": True, "names": names})
    Server(chan, module, package_origin).serve()
    os._exit(0)


if __name__ == "__main__":
    main()
