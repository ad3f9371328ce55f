"""The call loop of the submission's process (:mod:`codex_lab.course.submission_server`).

Messages from the checker: ``call`` (run one of the file's functions on decoded arguments;
answer its value, the arguments it changed in place, and how many of its output tensors
carry a graph), ``grad`` (gradients of a call's outputs with respect to its inputs that
required grad, for the checks that train through the learner's code), ``drop`` (forget a
call's graph). While a call runs, the learner's code may call methods of *handles* (objects
the checker passed, e.g. a tokenizer): each is a ``cb`` message answered by the checker.
"""

from __future__ import annotations

import traceback
import types
from typing import Any, Callable

from codex_lab.course import wire


def tensors(value: Any, depth: int = 0) -> list[Any]:
    """Tensors inside ``value`` in the order :func:`codex_lab.course.wire.encode` visits them."""
    import torch

    if depth > wire.MAX_DEPTH:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if type(value) in (tuple, list, torch.Size):
        return [t for v in value for t in tensors(v, depth + 1)]
    if type(value) is dict:
        return [t for k, v in value.items() for t in tensors(k, depth + 1) + tensors(v, depth + 1)]
    return []


class RemoteObject:
    """A checker-side object seen from the submission: public methods and attributes, as data."""

    __slots__ = ("_hid", "_kind", "_server")

    def __init__(self, hid: int, kind: str, server: "Server") -> None:
        object.__setattr__(self, "_hid", hid)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_server", server)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        kind, value = self._server.callback({"op": "cb", "h": self._hid, "name": name, "what": "attr"})
        if kind != "method":
            return value

        def method(*args: Any, **kwargs: Any) -> Any:
            return self._server.callback({"op": "cb", "h": self._hid, "name": name, "what": "call"}, (args, kwargs))[1]

        method.__name__ = name
        return method

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the grader's {self._kind} is read-only")

    def __repr__(self) -> str:
        return f"<{self._kind}>"


def _where(exc: BaseException, filename: str) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if f.filename == filename]
    return f" (line {mine[-1].lineno})" if mine else ""


def _pack_or_none(value: Any) -> Any:
    try:
        return wire.pack(value)
    except wire.WireError:  # a handle: the checker's own object, never sent back
        return None


class Server:
    """Answer the checker's messages until it says ``bye`` or goes away."""

    def __init__(self, chan: wire.Channel, module: types.ModuleType, origin: Callable[[Any], str | None]) -> None:
        self.chan, self.module, self.origin = chan, module, origin
        self.graphs: dict[int, tuple[list[Any], list[Any]]] = {}

    def _handle(self, node: dict[str, Any]) -> RemoteObject:
        return RemoteObject(int(node["id"]), str(node.get("type", "object")), self)

    def callback(self, header: dict[str, Any], value: Any = None) -> tuple[str, Any]:
        tree, blobs = wire.pack(value)
        self.chan.send({**header, "v": tree}, blobs)
        reply, rblobs = self.chan.recv()
        if reply.get("op") == "cbret":
            return str(reply.get("kind", "value")), wire.decode(reply["v"], rblobs, self._handle)
        raise AttributeError(str(reply.get("msg", "the grader refused this call"))[:500])

    def serve(self) -> None:
        while True:
            try:
                msg, blobs = self.chan.recv()
            except wire.WireError:
                return
            op = msg.get("op")
            if op == "bye":
                return
            if op == "drop":
                self.graphs.pop(int(msg["id"]), None)
                continue
            try:
                reply, out = self.grad(msg, blobs) if op == "grad" else self.call(msg, blobs)
            except wire.WireError as exc:
                reply, out = {"op": "raise", "type": "TypeError", "msg": str(exc), "where": ""}, []
            self.chan.send(reply, out)

    def _raise(self, exc: BaseException) -> tuple[dict[str, Any], list[bytes]]:
        code = getattr(exc, "code", None) if isinstance(exc, SystemExit) else None
        return ({"op": "raise", "type": type(exc).__name__, "msg": str(exc)[:2000],
                 "where": _where(exc, str(getattr(self.module, "__file__", ""))),
                 "code": code if code is None or type(code) in (int, str) else str(code)}, [])

    def call(self, msg: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        name = str(msg["name"])
        args, kwargs = wire.decode(msg["args"], blobs, self._handle, grad=True)
        fn = getattr(self.module, name, None)
        if fn is None or not callable(fn):
            return {"op": "missing"}, []
        origin = self.origin(fn)
        if origin is not None:
            return {"op": "raise", "type": "ForbiddenCall", "origin": origin, "msg": "", "where": ""}, []
        leaves = [t for t in tensors((args, kwargs)) if t.requires_grad]
        before = [_pack_or_none(a) for a in args]
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - every exception of the learner's code is reported
            return self._raise(exc)
        changed = [(i, a) for i, a in enumerate(args) if before[i] is not None and _pack_or_none(a) != before[i]]
        found = tensors(result)
        gidx = [i for i, t in enumerate(found) if t.requires_grad]
        outs = [found[i] for i in gidx]
        try:
            tree, out = wire.pack((result, changed))
        except wire.WireError as exc:
            return {"op": "raise", "type": "TypeError", "msg": f"{name} returned a value the grader cannot read: {exc}",
                    "where": ""}, []
        cid = int(msg["id"])
        if outs and leaves:
            self.graphs[cid] = (outs, leaves)
        return {"op": "ret", "v": tree, "gidx": gidx, "graph": bool(outs and leaves)}, out

    def grad(self, msg: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        import torch

        outs, leaves = self.graphs.get(int(msg["id"]), ([], []))
        grads = wire.decode(msg["grads"], blobs)
        if not outs or len(grads) != len(outs):
            return {"op": "ret", "v": wire.pack([None] * len(leaves))[0]}, []
        gs = [g if g is not None else torch.zeros_like(o) for o, g in zip(outs, grads)]
        try:
            got = torch.autograd.grad(outs, leaves, grad_outputs=gs, allow_unused=True, retain_graph=True)
        except BaseException as exc:  # noqa: BLE001 - the learner's graph broke
            return self._raise(exc)
        tree, out = wire.pack(list(got))
        return {"op": "ret", "v": tree}, out
