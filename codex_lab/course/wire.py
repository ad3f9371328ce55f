"""Values as data between the checker and the submission's process (no pickle, ever).

A value crosses as a JSON tree plus a list of binary blobs. What can cross: ``None``,
``bool``, ``int``, ``float`` (NaN and infinities included), ``str``, ``bytes``, tuples,
lists, sets, dicts (any of these as keys), torch tensors (dtype, shape and raw bytes; the
``requires_grad`` flag travels beside them), NumPy arrays of plain dtypes, NumPy scalars
(turned into ``bool`` / ``int`` / ``float``: a ``numpy.bool_`` is accepted where a bool is
asked), ``torch.dtype``, and the package's dataclasses named in :data:`WIRE_DATACLASSES`
(by field, rebuilt by the receiver). Anything else is refused with a message naming its
type, or, on the checker's side only, sent as a *handle*: the other side gets a proxy whose
public methods call back into the checker (a tokenizer, a hidden check's stand-in object)
with data arguments and data results.

Decoding never imports anything. A class named on the wire is looked up only in
:data:`WIRE_DATACLASSES` and only in a module already in ``sys.modules`` (each side loads
those modules at start-up with :func:`preload`, before the other side can send a byte);
any other name is refused with a :class:`WireError` that names it. Why: the name comes
from the graded side, and a ``codex_lab.*`` module missing from the learner's view would
be looked for further along the import path, in folders the graded process may be able
to write to; importing it would run the submission's code in the checker.

Every decoded value is a fresh plain object (a ``bool`` is a ``bool``, a tensor a plain
``torch.Tensor`` of the stated dtype and shape), so nothing the submission returns can
carry behaviour (``__eq__``, ``__float__``, ``__torch_function__``) into the checker.

Messages on a byte stream: 8-byte big-endian length of the JSON header, the header, then
per blob its 8-byte length and bytes. :data:`MAX_MESSAGE_BYTES` caps one message.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import select
import struct
import sys
import time
import types
from typing import Any, Callable

MAX_MESSAGE_BYTES = 512 * 1024 * 1024  # a learner's tensors at exercise sizes are kilobytes; 512 MiB refuses a flood
MAX_DEPTH = 64  # nesting of containers in one value
_LEN = struct.Struct(">Q")

#: The classes that may cross as dataclasses, as ``"module:qualname"``: the allow-list the
#: receiver looks names up in (nothing else is rebuilt, and nothing is imported to find
#: one). ``ModelConfig`` is the only one the lessons' checks pass or expect (lesson 08's
#: ``design_to_config``). To let another one cross, add it here: :func:`preload` then loads
#: its module in both processes at start-up. On the checker's side a dataclass not listed
#: travels as a handle (its fields readable through the proxy); from the submission it is
#: refused with a message naming it.
WIRE_DATACLASSES: frozenset[str] = frozenset({
    "codex_lab.nn.config:ModelConfig",
})


class WireError(Exception):
    """A value that cannot cross, or a malformed or oversized message."""


class ChannelClosed(WireError):
    """The other side closed the stream (its process ended)."""


class ChannelTimeout(WireError):
    """No message arrived before the deadline."""


def preload() -> None:
    """Import the modules of :data:`WIRE_DATACLASSES` (trusted names, from this constant only).

    Called once at start-up by each side (the checker before it starts the submission's
    process, the submission's process before it loads the file), so that :func:`decode`
    finds those classes in ``sys.modules`` and never has to import one."""
    for path in sorted(WIRE_DATACLASSES):
        importlib.import_module(path.partition(":")[0])


def _wire_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


# ---- values -------------------------------------------------------------------------------

def encode(value: Any, blobs: list[bytes], handle: Callable[[Any], dict[str, Any]] | None = None,
           depth: int = 0) -> Any:
    """The JSON tree of ``value``; binary parts are appended to ``blobs``.

    ``handle(obj)`` (checker side only) turns an object that is not data into a handle
    node; without it such an object raises :class:`WireError` naming its type.
    """
    import torch

    if depth > MAX_DEPTH:
        raise WireError(f"a value nested more than {MAX_DEPTH} levels deep")
    if value is None or type(value) in (bool, str):
        return value
    if type(value) is int:
        return value
    if type(value) is float:
        return {"$": "f", "v": repr(value)}  # repr keeps every bit, nan and inf included
    np = _numpy()
    if np is not None and isinstance(value, np.generic) and not isinstance(value, np.ndarray):
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            return {"$": "f", "v": repr(float(value))}
    sub = lambda v: encode(v, blobs, handle, depth + 1)  # noqa: E731
    if isinstance(value, torch.Tensor):
        t = torch.Tensor.detach(value)
        if t.layout != torch.strided or t.device.type == "meta" or t.is_quantized:
            raise WireError(f"a {t.layout} / {t.device.type} tensor cannot be graded; return a dense tensor")
        t = torch.Tensor.contiguous(torch.Tensor.cpu(t))
        data = torch.Tensor.numpy(t.reshape(-1).view(torch.uint8)).tobytes() if t.numel() else b""
        blobs.append(data)
        return {"$": "t", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "b": len(blobs) - 1,
                "g": bool(value.requires_grad)}
    if np is not None and isinstance(value, np.ndarray):
        if value.dtype.hasobject or value.dtype.fields is not None:
            raise WireError(f"a NumPy array of dtype {value.dtype} cannot be graded; use numbers")
        blobs.append(np.ascontiguousarray(value).tobytes())
        return {"$": "nd", "dtype": value.dtype.str, "shape": list(value.shape), "b": len(blobs) - 1}
    if isinstance(value, torch.dtype):
        return {"$": "dtype", "v": str(value).removeprefix("torch.")}
    if type(value) in (tuple, torch.Size):
        return {"$": "tuple", "v": [sub(v) for v in value]}
    if type(value) is list:
        return {"$": "list", "v": [sub(v) for v in value]}
    if type(value) in (set, frozenset):
        return {"$": "set", "v": [sub(v) for v in value]}
    if type(value) is dict:
        return {"$": "dict", "v": [[sub(k), sub(v)] for k, v in value.items()]}
    if type(value) is bytes:
        blobs.append(value)
        return {"$": "bytes", "b": len(blobs) - 1}
    cls = type(value)
    if dataclasses.is_dataclass(cls) and not isinstance(value, type) and _wire_name(cls) in WIRE_DATACLASSES:
        fields = {f.name: sub(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"$": "dc", "cls": _wire_name(cls), "v": fields}
    if handle is not None:
        return handle(value)
    raise WireError(f"a {cls.__module__}.{cls.__qualname__} object cannot be graded: return plain values "
                    "(bool, int, float, str, tuples, lists, dicts, tensors"
                    + (", or one of " + ", ".join(sorted(WIRE_DATACLASSES)) if WIRE_DATACLASSES else "") + ")")


def decode(node: Any, blobs: list[bytes], handle: Callable[[dict[str, Any]], Any] | None = None,
           depth: int = 0, grad: bool = False) -> Any:
    """The value of a tree made by :func:`encode` (fresh plain objects; see the module docstring).

    ``grad``: tensors sent with ``requires_grad`` become leaves that require grad."""
    if depth > MAX_DEPTH:
        raise WireError(f"a value nested more than {MAX_DEPTH} levels deep")
    if node is None or type(node) in (bool, int, str):
        return node
    if type(node) is not dict or "$" not in node:
        raise WireError(f"malformed value node {str(node)[:80]!r}")
    kind = node["$"]
    sub = lambda v: decode(v, blobs, handle, depth + 1, grad)  # noqa: E731
    if kind == "f":
        return float(node["v"])
    if kind == "t":
        t = _tensor(node, blobs)
        return t.requires_grad_(True) if grad and node.get("g") is True and (t.is_floating_point() or t.is_complex()) else t
    if kind == "nd":
        np = _numpy()
        if np is None:
            raise WireError("a NumPy array arrived but NumPy is not installed")
        dt = np.dtype(str(node["dtype"]))
        if dt.hasobject or dt.fields is not None:  # what encode refuses to send
            raise WireError("object and structured arrays cannot cross")
        shape = [int(s) for s in node["shape"]]
        return np.frombuffer(_blob(blobs, node["b"]), dtype=dt).reshape(shape).copy()
    if kind == "dtype":
        return _dtype(node["v"])
    if kind in ("tuple", "list", "set"):
        items = [sub(v) for v in node["v"]]
        return tuple(items) if kind == "tuple" else items if kind == "list" else set(items)
    if kind == "dict":
        return {sub(k): sub(v) for k, v in node["v"]}
    if kind == "bytes":
        return bytes(_blob(blobs, node["b"]))
    if kind == "dc":
        return _dataclass(str(node["cls"]), {str(k): sub(v) for k, v in node["v"].items()})
    if kind == "h" and handle is not None:
        return handle(node)
    raise WireError(f"unknown value kind {kind!r}")


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy ships with torch's wheels
        return None
    return numpy


def _blob(blobs: list[bytes], i: Any) -> bytes:
    if type(i) is not int or not 0 <= i < len(blobs):
        raise WireError("malformed tensor node (no such blob)")
    return blobs[i]


def _dtype(name: Any) -> Any:
    import torch

    # vars(), not getattr(): torch's module __getattr__ imports submodules on a miss, and
    # decoding imports nothing
    dt = vars(torch).get(str(name))
    if not isinstance(dt, torch.dtype):
        raise WireError(f"unknown dtype {name!r}")
    return dt


def _tensor(node: dict[str, Any], blobs: list[bytes]) -> Any:
    import torch

    dt, data = _dtype(node["dtype"]), _blob(blobs, node["b"])
    shape = [int(s) for s in node["shape"]]
    n = 1
    for s in shape:
        if s < 0:
            raise WireError("negative tensor dimension")
        n *= s
    if n * dt.itemsize != len(data):
        raise WireError(f"tensor of shape {shape} and dtype {dt} does not match its {len(data)} bytes")
    if n == 0:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dt).reshape(shape)


def _dataclass(path: str, fields: dict[str, Any]) -> Any:
    """The allow-listed class ``path`` names, rebuilt from ``fields``; found without importing
    (see the module docstring): only in :data:`WIRE_DATACLASSES`, only in ``sys.modules``."""
    mod_name, _, qual = path.partition(":")
    if not mod_name.startswith("codex_lab.") or not qual or "<" in qual:
        raise WireError(f"dataclass {path[:200]!r} is not the package's")
    if path not in WIRE_DATACLASSES:
        raise WireError(f"{path[:200]!r} is not a class the grader rebuilds from data (allowed: "
                        f"{', '.join(sorted(WIRE_DATACLASSES))}); refused, nothing was imported")
    obj: Any = sys.modules.get(mod_name)
    if obj is None:
        raise WireError(f"{path!r} is allowed but its module is not loaded in this process (wire.preload() "
                        "was not called at start-up); refused, nothing was imported")
    for part in qual.split("."):
        # the namespace itself, not getattr(): a module's __getattr__ (PEP 562, the package's
        # lazy exports) would import on a miss
        obj = vars(obj).get(part) if isinstance(obj, (type, types.ModuleType)) else None
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj) and _wire_name(obj) == path):
        raise WireError(f"{path!r} is not a dataclass of the loaded module")
    names = {f.name for f in dataclasses.fields(obj) if f.init}
    try:
        return obj(**{k: v for k, v in fields.items() if k in names})
    except (TypeError, ValueError) as exc:
        raise WireError(f"{qual} could not be rebuilt from its fields: {exc}") from None


# ---- messages on a stream -----------------------------------------------------------------

class Channel:
    """Framed messages over a pair of file descriptors (pipes)."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd, self.wfd = rfd, wfd

    def send(self, header: dict[str, Any], blobs: list[bytes] = ()) -> None:  # type: ignore[assignment]
        head = json.dumps({**header, "nblobs": len(blobs)}, allow_nan=False).encode()
        parts = [_LEN.pack(len(head)), head]
        for b in blobs:
            parts += [_LEN.pack(len(b)), b]
        data = b"".join(parts)
        if len(data) > MAX_MESSAGE_BYTES:
            raise WireError(f"a message of {len(data) / 2**20:.0f} MiB is over the {MAX_MESSAGE_BYTES // 2**20} MiB cap")
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.wfd, view)
            except (BrokenPipeError, OSError) as exc:
                raise ChannelClosed(f"the other process is gone ({exc.__class__.__name__})") from None
            view = view[n:]

    def _read(self, n: int, deadline: float | None) -> bytes:
        out = bytearray()
        while len(out) < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                    raise ChannelTimeout("no answer before the deadline")
            chunk = os.read(self.rfd, min(n - len(out), 1 << 20))
            if not chunk:
                raise ChannelClosed("the other process closed its end")
            out += chunk
        return bytes(out)

    def recv(self, deadline: float | None = None) -> tuple[dict[str, Any], list[bytes]]:
        """One message (header, blobs); ``deadline`` is a ``time.monotonic()`` time or None."""
        (n,) = _LEN.unpack(self._read(8, deadline))
        if n > MAX_MESSAGE_BYTES:
            raise WireError("a message header over the cap")
        try:
            header = json.loads(self._read(n, deadline))
        except (ValueError, RecursionError) as exc:
            raise WireError(f"malformed message: {type(exc).__name__}") from None
        if type(header) is not dict:
            raise WireError("malformed message (not an object)")
        blobs, total = [], n
        for _ in range(int(header.get("nblobs", 0))):
            (m,) = _LEN.unpack(self._read(8, deadline))
            total += m
            if total > MAX_MESSAGE_BYTES:
                raise WireError("a message over the cap")
            blobs.append(self._read(m, deadline))
        return header, blobs


def pack(value: Any, handle: Callable[[Any], dict[str, Any]] | None = None) -> tuple[Any, list[bytes]]:
    """(tree, blobs) of one value."""
    blobs: list[bytes] = []
    return encode(value, blobs, handle), blobs


class Discard:
    """A text stream that drops what is written (stdout/stderr of the grading processes: only
    the checker's tagged result lines may reach the parent)."""

    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False
