"""How the server refuses input: :class:`ApiError` (an HTTP status and a body in the OpenAI
error shape), the :class:`Limits` it enforces, and the checks of a raw body and of one field
that raise it. Every check is safe on hostile input: deep nesting, integers too long or too
large for a float, lone surrogates and echoed values of any size give a 400, never a crash.

Re-exported by :mod:`codex_lab.serve.protocol`, which validates a completions request with them.
"""

from __future__ import annotations

import json
import math
import reprlib
from dataclasses import dataclass
from typing import Any


class ApiError(Exception):
    """A request the server refuses: HTTP status, OpenAI error fields, a metrics kind, and
    extra response headers (``Retry-After`` on 429)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error", kind: str = "invalid_request",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type, self.kind = status, message, param, code, type_, kind
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON body in the OpenAI error shape."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def render(self) -> bytes:
        """The body as bytes; ASCII-escaped, so a lone surrogate echoed from the input cannot break it."""
        return json.dumps(self.body(), ensure_ascii=True).encode("ascii")


# Limits.max_tokens when the operator sets no cap: the context is the only bound (the server's
# configuration check accepts 1..1,000,000, past any context this course serves)
NO_TOKEN_CAP = 1_000_000


@dataclass
class Limits:
    """What the server accepts.

    Args:
        max_tokens: largest ``max_tokens`` a request may ask for: the operator's cap
            (``--max-tokens``); :data:`NO_TOKEN_CAP` = only the context bounds it.
        default_max_tokens: used when a request gives none; None (default) = what the context
            leaves after the prompt (vLLM's default), within ``max_tokens``.
        max_seq_len: the model's context in tokens (prompt + output must fit).
        max_body_bytes: largest request body.
        max_stop: most stop strings per request.
        lenient: ignore body fields the server does not know (``--lenient``) instead of a 400
            listing the supported ones.
    """

    max_tokens: int = NO_TOKEN_CAP
    default_max_tokens: int | None = None
    max_seq_len: int = 1024
    max_body_bytes: int = 64 * 1024
    max_stop: int = 4
    max_choices: int = 64  # prompts x best_of per request: each is one engine request
    lenient: bool = False


def check_fields(body: dict[str, Any], known: tuple[str, ...], limits: Limits) -> None:
    """A 400 naming the first field of ``body`` not in ``known`` and listing the supported ones
    (nothing with ``limits.lenient``)."""
    if limits.lenient:
        return
    unknown = [k for k in body if k not in known]
    if unknown:
        name = _brief(unknown[0])
        raise ApiError(400, f"unknown field {name}: this server does not support it, and does not ignore fields "
                            f"silently; supported: {', '.join(known)} (an operator may start the server with "
                            "--lenient to ignore unknown fields)", param=str(unknown[0])[:64], code="unknown_field")


def parse_json(raw: bytes, limits: Limits) -> dict[str, Any]:
    """Decode a body into a JSON object, or raise :class:`ApiError` (413 / 400).

    Hostile bodies are 400s too: nesting deep enough to exhaust the parser's recursion,
    integers past Python's 4,300-digit limit, invalid UTF-8.
    """
    if len(raw) > limits.max_body_bytes:
        raise ApiError(413, f"request body is {len(raw)} bytes; the limit is {limits.max_body_bytes}",
                       code="body_too_large", kind="too_large")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError(400, "the body is nested too deeply to parse; send a flat JSON object",
                       code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and over-long integers are ValueErrors
        raise ApiError(400, f"the body is not valid JSON ({str(exc)[:120]}); send a JSON object",
                       code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    return body


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 2, 40, 40, 40


def _brief(v: Any) -> str:
    """A short, safe description of a client value for an error message (bounded depth and length)."""
    return _REPR.repr(v)


def _typed(body: dict[str, Any], name: str, kinds: tuple[type, ...], default: Any, what: str) -> Any:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
        raise ApiError(400, f"'{name}' must be {what}, got {_brief(v)}", param=name, code="invalid_type")
    return v


def _number(body: dict[str, Any], name: str, default: float) -> float:
    """A finite float field; ints of any size that do not fit a float are refused, not crashed on."""
    v = _typed(body, name, (int, float), default, "a number")
    try:
        x = float(v)
    except OverflowError:
        raise ApiError(400, f"'{name}' is too large ({len(str(abs(v)))} digits)", param=name) from None
    if not math.isfinite(x):
        raise ApiError(400, f"'{name}' must be a finite number, got {x}", param=name)
    return x


def valid_text(s: str, name: str) -> str:
    """``s`` if it can be encoded as UTF-8 (a lone surrogate such as \\ud800 cannot)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(400, f"'{name}' contains an invalid character at position {exc.start} (a lone UTF-16 "
                            "surrogate); send valid Unicode", param=name) from None
    return s
