"""The checker's side of a submission: a child process that holds the learner's code, and
proxies that call it with data (:mod:`codex_lab.course.wire`).

:class:`SubmissionProcess` starts :mod:`codex_lab.course.submission_server` (which loads the
file with the exercises' forbidden functions already refused) and :meth:`~SubmissionProcess.function`
gives a callable the checks use as the learner's function. A call sends the arguments as
data and gets back, as data: the value, every argument the learner's code changed in place
(copied back into the check's own objects, so checks for side effects on inputs see them),
and which output tensors carry a graph: those are wired into the check's autograd graph by
:class:`_RemoteGrad`, whose backward asks the submission's process for the gradients, so
``loss.backward()`` in a check trains through the learner's code. Objects that are not data
(a tokenizer) travel as handles whose public methods the learner's code calls back.

The learner's time is the time the checker waits for answers: past the exercise's budget
the process is killed and the call raises :class:`SubmissionTimeout`; a process that ends
mid-call raises :class:`SubmissionGone`. Both are ``BaseException`` so a check's ``case``
block does not swallow them.
"""

from __future__ import annotations

import builtins
import copy
import itertools
import re
import subprocess
import sys
import time
from typing import Any

from codex_lab.course import wire
from codex_lab.course.forbid import ForbiddenCall, message
from codex_lab.course.remote_serve import tensors

# wire.preload() first: the dataclasses the checker may send are then loaded before the channel
# opens, so decoding the checker's messages imports nothing (see codex_lab.course.wire)
_BOOT = "from codex_lab.course import wire; wire.preload(); from codex_lab.course.submission_server import main; main()"
_VIEW_BOOT = ("import sys; sys.path.insert(0, {view!r}); from codex_lab.course import wire; wire.preload(); "
              "from codex_lab.course.submission_server import main; main()")


class SubmissionTimeout(BaseException):
    """The learner's code ran past the exercise's time budget (the process was stopped)."""


class SubmissionGone(BaseException):
    """The submission's process ended or broke the channel while a call was pending."""


class RemoteError(Exception):
    """An exception of the learner's code that is not a plain builtin one (its type named)."""


def _exception(msg: dict[str, Any]) -> BaseException:
    name, text = str(msg.get("type", "Exception")), str(msg.get("msg", ""))[:2000]
    if name in ("ForbiddenCall", "NotImplementedError", "PermissionError") and text.startswith("write this one yourself") \
            or name == "PermissionError" and "write this one yourself" in text:
        exc: BaseException = ForbiddenCall(message(str(msg["origin"])) if msg.get("origin") else text)
    elif name == "SystemExit":
        exc = SystemExit(msg.get("code"))
    else:
        cls = getattr(builtins, name, None)
        exc = None  # type: ignore[assignment]
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                exc = cls(text)
            except Exception:  # noqa: BLE001 - a builtin that wants other arguments
                exc = None  # type: ignore[assignment]
        if exc is None:
            safe = name if re.fullmatch(r"[A-Za-z_]\w{0,59}", name) else "Exception"
            exc = type(safe, (RemoteError,), {})(text)
    exc.codex_lab_where = str(msg.get("where", ""))  # type: ignore[attr-defined]
    return exc


class _RemoteGrad:
    """Autograd glue: outputs computed in the submission's process, gradients asked of it."""

    fn: Any = None

    @classmethod
    def get(cls) -> Any:
        if cls.fn is None:
            import torch

            class Fn(torch.autograd.Function):
                @staticmethod
                def forward(ctx: Any, proc: "SubmissionProcess", cid: int, n_out: int, *ts: Any) -> Any:  # type: ignore[override]
                    ctx.proc, ctx.cid, ctx.n_out, ctx.n_in = proc, cid, n_out, len(ts) - n_out
                    return tuple(t.detach().clone() for t in ts[:n_out])

                @staticmethod
                def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
                    got = ctx.proc.grad(ctx.cid, list(grads))
                    got = (list(got) + [None] * ctx.n_in)[: ctx.n_in]
                    return (None, None, None) + (None,) * ctx.n_out + tuple(got)

            cls.fn = Fn
        return cls.fn


def _replace(value: Any, swap: dict[int, Any], depth: int = 0) -> Any:
    """``value`` with the tensors whose id is in ``swap`` replaced (containers rebuilt)."""
    if id(value) in swap:
        return swap[id(value)]
    if depth > wire.MAX_DEPTH:
        return value
    if type(value) is tuple:
        return tuple(_replace(v, swap, depth + 1) for v in value)
    if type(value) is list:
        return [_replace(v, swap, depth + 1) for v in value]
    if type(value) is dict:
        return {k: _replace(v, swap, depth + 1) for k, v in value.items()}
    return value


def _copy_back(orig: Any, new: Any) -> None:
    """Make the check's own argument ``orig`` what the learner's code left it as (``new``)."""
    import torch

    if isinstance(orig, torch.Tensor) and isinstance(new, torch.Tensor):
        with torch.no_grad():
            if orig.shape == new.shape and orig.dtype == new.dtype:
                orig.copy_(new)
            else:
                orig.set_(new.clone())
    elif type(orig) is list and type(new) is list:
        orig[:] = new
    elif type(orig) is dict and type(new) is dict:
        orig.clear()
        orig.update(new)


class SubmissionProcess:
    """The learner's file loaded in a child process; see the module docstring."""

    def __init__(self, submission: str, forbid: list[str] | tuple[str, ...] = (), *, cwd: str | None = None,
                 startup_s: float = 120.0, guard: bool = True, view: str | None = "auto") -> None:
        """``view``: the folder holding the learner's view of the package that the submission's
        process imports (:mod:`codex_lab.course.learner_view`); ``"auto"`` builds the one for
        ``forbid``'s package names (none when it names none); None imports the real package."""
        if view == "auto":
            from codex_lab.course.learner_view import package_names, view_for

            view = str(view_for(forbid)) if package_names(forbid) else None
        boot = _BOOT if view is None else _VIEW_BOOT.format(view=str(view))
        wire.preload()  # this (the checker's) side too, before the submission can send anything: decode never imports
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", boot], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd=cwd, close_fds=True, start_new_session=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.chan = wire.Channel(self.proc.stdout.fileno(), self.proc.stdin.fileno())
        self.ids = itertools.count()
        self.handles: dict[int, Any] = {}
        self.left = float("inf")  # the current exercise's remaining seconds of the learner's time
        self.dead: str | None = None
        self.load_error: str | None = None
        self.names: set[str] = set()  # the file's functions (and classes), by name
        try:
            from codex_lab.course.submission_server import known_codes

            known = known_codes(list(forbid))  # this process's (the real) functions, as fingerprints
            self.chan.send({"op": "init", "submission": submission, "forbid": list(forbid), "guard": guard,
                            "known": known})
            msg, _ = self.chan.recv(deadline=time.monotonic() + startup_s)
            self.load_error = None if msg.get("ok") else str(msg.get("error", "it did not load"))
            self.names = {str(n) for n in msg.get("names", [])}
        except wire.ChannelTimeout:
            self.close()
            self.load_error = f"loading took longer than {startup_s:g} s (an endless loop at import time?)"
        except wire.WireError as exc:
            self.close()
            self.load_error = f"its process ended while loading ({exc})"

    # ---- the learner's function -----------------------------------------------------------
    def function(self, name: str) -> Any:
        """A callable standing for the submission's function ``name`` (it has no code to inspect)."""
        proc = self

        class Remote:
            __module__ = "submission"
            __name__ = __qualname__ = name

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                return proc.call(name, args, kwargs)

            def __repr__(self) -> str:
                return f"<submitted function {name}>"

        return Remote()

    def budget(self, seconds: float) -> None:
        """Start an exercise: the learner's code may run ``seconds`` in all (waits summed)."""
        self.left = float(seconds)

    def _register(self, obj: Any) -> dict[str, Any]:
        hid = next(self.ids)
        try:
            self.handles[hid] = copy.deepcopy(obj)  # the learner may call methods, never change the check's object
        except Exception:  # noqa: BLE001
            self.handles[hid] = obj
        return {"$": "h", "id": hid, "type": type(obj).__name__}

    def _recv(self) -> tuple[dict[str, Any], list[bytes]]:
        if self.dead:
            raise SubmissionGone(self.dead)
        start = time.monotonic()
        try:
            return self.chan.recv(deadline=start + self.left)
        except wire.ChannelTimeout:
            self.close()
            self.dead = "stopped after its time budget"
            raise SubmissionTimeout("the submitted code ran past the exercise's time budget") from None
        except wire.WireError as exc:
            rc = self.close()
            self.dead = (f"the submission's process ended (exit code {rc}) while this ran, e.g. os._exit or a crash"
                         if isinstance(exc, wire.ChannelClosed) else f"the submission broke the grading channel: {exc}")
            raise SubmissionGone(self.dead) from None
        finally:
            self.left -= time.monotonic() - start

    def _exchange(self, header: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        if self.dead:
            raise SubmissionGone(self.dead)
        try:
            self.chan.send(header, blobs)
        except wire.WireError as exc:
            rc = self.close()
            self.dead = f"the submission's process ended (exit code {rc}): {exc}"
            raise SubmissionGone(self.dead) from None
        while True:
            msg, rblobs = self._recv()
            if msg.get("op") != "cb":
                return msg, rblobs
            self._callback(msg, rblobs)

    def _callback(self, msg: dict[str, Any], blobs: list[bytes]) -> None:
        name = str(msg.get("name", ""))
        try:
            if name.startswith("_"):
                raise AttributeError(f"{name} is private")
            attr = getattr(self.handles[int(msg["h"])], name)
            if msg.get("what") == "attr":
                reply = ("method", None) if callable(attr) else ("value", attr)
            else:
                args, kwargs = wire.decode(msg["v"], blobs)
                reply = ("value", attr(*args, **kwargs))
            tree, out = wire.pack(reply[1], self._register)
            self.chan.send({"op": "cbret", "kind": reply[0], "v": tree}, out)
        except Exception as exc:  # noqa: BLE001 - the learner's call was wrong; it gets the message
            self.chan.send({"op": "cberr", "msg": f"{type(exc).__name__}: {exc}"})

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the submission's ``name(*args, **kwargs)``; see the module docstring."""
        cid = next(self.ids)
        tree, blobs = wire.pack((list(args), dict(kwargs)), self._register)
        in_req = [t for t in tensors((list(args), dict(kwargs))) if t.requires_grad]
        msg, rblobs = self._exchange({"op": "call", "id": cid, "name": name, "args": tree}, blobs)
        if msg.get("op") == "missing":
            raise AttributeError(f"the submission has no function {name!r}")
        if msg.get("op") == "raise":
            raise _exception(msg)
        if msg.get("op") != "ret":
            raise SubmissionGone(f"unexpected answer {str(msg.get('op'))[:40]!r} from the submission's process")
        try:
            result, changed = wire.decode(msg["v"], rblobs)
        except (wire.WireError, TypeError, ValueError) as exc:
            raise TypeError(f"{name} returned a value the grader cannot read: {exc}") from None
        for i, new in changed:
            if type(i) is int and 0 <= i < len(args):
                _copy_back(args[i], new)
        found = tensors(result)
        outs = [found[i] for i in msg.get("gidx", []) if type(i) is int and 0 <= i < len(found)]
        if not outs:
            return result
        if msg.get("graph") and in_req:
            wired = _RemoteGrad.get().apply(self, cid, len(outs), *outs, *in_req)
            return _replace(result, {id(o): w for o, w in zip(outs, wired)})
        for o in outs:  # a graph that starts inside the learner's code: a leaf here
            if o.is_floating_point() or o.is_complex():
                o.requires_grad_(True)
        return result

    def grad(self, cid: int, grads: list[Any]) -> list[Any]:
        """Gradients of call ``cid``'s outputs (weighted by ``grads``) w.r.t. its inputs that required grad."""
        tree, blobs = wire.pack(list(grads))
        msg, rblobs = self._exchange({"op": "grad", "id": cid, "grads": tree}, blobs)
        if msg.get("op") == "raise":
            raise _exception(msg)
        got = wire.decode(msg["v"], rblobs)
        return list(got) if isinstance(got, list) else []

    def close(self) -> int | None:
        """Stop the process (if running); its exit code."""
        try:
            if self.proc.poll() is None:
                try:
                    self.chan.send({"op": "bye"})
                except wire.WireError:
                    pass
                try:
                    self.proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            for s in (self.proc.stdin, self.proc.stdout):
                try:
                    s.close()  # type: ignore[union-attr]
                except OSError:
                    pass
        return self.proc.returncode
