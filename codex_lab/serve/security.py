"""What stands between the network and the engine: Host allow-list, API key, content type,
header and body read timeouts, and a connection cap.

- :class:`Guard`, an ASGI middleware run before any route:
  * a ``Host`` header that is not in the allow-list -> 403 (default: the loopback names,
    so a page that rebinds its DNS name to 127.0.0.1 cannot reach the server);
  * with an API key set, every route but ``/health`` needs ``Authorization: Bearer <key>``
    -> else 401 (compared in constant time);
  * a POST whose ``Content-Type`` is not ``application/json`` -> 415 (a cross-site "simple"
    form or text/plain POST never reaches the JSON parser).
  Every refusal has OpenAI's error shape.
- :func:`read_body`: the request body, at most ``max_body_bytes`` (413) within
  ``body_timeout_s`` seconds (408); either refusal closes the connection, and a client that
  hangs up mid-body is counted as ``disconnected`` (never an internal error).
- :func:`hardened_protocol`: uvicorn's h11 protocol with a header timeout (a connection
  that has not sent complete request headers within ``header_timeout_s`` is closed: no
  slowloris) and a cap on open connections (one more gets 503 + ``Retry-After`` and is
  closed at once).
- :func:`uvicorn_config`: the uvicorn settings that go with them (keep-alive timeout,
  ``limit_concurrency``, h11's 16 KiB limit on incomplete headers).
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any, Awaitable, Callable, Iterable

from codex_lab.serve.api_errors import ApiError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def check_loopback(host: str) -> None:
    """Raise ValueError unless ``host`` is a loopback name (the course never serves outside)."""
    if host not in LOOPBACK:
        raise ValueError(f"host {host!r} is not loopback; use 127.0.0.1 (the course only serves and loads "
                         "this machine)")


def host_name(header: str) -> str:
    """The host of a ``Host`` header, lower-case, without its port: "[::1]:8000" -> "::1"."""
    h = header.strip().lower()
    if h.startswith("["):  # IPv6 literal
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def host_allowed(header: str | None, allowed: Iterable[str]) -> bool:
    """True when ``allowed`` holds "*" or the header's host name (a missing header is refused)."""
    allowed = tuple(a.lower() for a in allowed)
    if "*" in allowed:
        return True
    return bool(header) and host_name(header) in allowed  # type: ignore[arg-type]


def bearer_ok(header: str | None, key: str) -> bool:
    """True when ``header`` is ``Bearer <key>`` (constant-time comparison)."""
    if not header or not header[:7].lower() == "bearer ":
        return False
    return hmac.compare_digest(header[7:].strip().encode("utf-8", "replace"), key.encode("utf-8"))


def is_json(content_type: str | None) -> bool:
    """True for ``application/json`` with or without parameters (``; charset=utf-8``)."""
    return bool(content_type) and content_type.split(";", 1)[0].strip().lower() == "application/json"  # type: ignore[union-attr]


async def send_error(send: Send, e: ApiError) -> None:
    """Send ``e`` as a whole JSON response on a raw ASGI ``send``."""
    body = e.render()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in e.headers.items()]
    await send({"type": "http.response.start", "status": e.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware: Host allow-list, optional API key, JSON-only POSTs (see module docstring).

    Args:
        app: the wrapped ASGI app.
        allowed_hosts: host names accepted in ``Host`` ("*" = any).
        api_key: the key clients must send as ``Authorization: Bearer <key>`` (None = no key).
        on_error: called with the metrics kind of each refusal.
    """

    def __init__(self, app: Any, *, allowed_hosts: Iterable[str], api_key: str | None = None,
                 on_error: Callable[[str], None] | None = None) -> None:
        self.app, self.allowed, self.api_key = app, tuple(allowed_hosts), api_key
        self.on_error = on_error or (lambda kind: None)

    def check(self, scope: Scope) -> ApiError | None:
        """The refusal for this request, or None to let it through."""
        headers: dict[str, str] = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        if not host_allowed(headers.get("host"), self.allowed):
            return ApiError(403, f"Host header {headers.get('host')!r} is not allowed; this server answers "
                                 f"{list(self.allowed)} (start it with --allowed-hosts to add a name)",
                            code="host_not_allowed")
        if self.api_key and scope.get("path") not in ("/health", "/ready", "/health/ready") and not bearer_ok(headers.get("authorization"), self.api_key):
            return ApiError(401, "missing or incorrect API key; send the header 'Authorization: Bearer <key>'",
                            code="invalid_api_key", kind="unauthorized")
        if scope.get("method") == "POST" and not is_json(headers.get("content-type")):
            return ApiError(415, f"Content-Type must be application/json, got {headers.get('content-type')!r}",
                            code="unsupported_media_type")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            e = self.check(scope)
            if e is not None:
                self.on_error(e.kind)
                await send_error(send, e)
                return
        await self.app(scope, receive, send)


# A 408 ends the connection: the unread rest of the body would otherwise keep it open (a client
# trickling a byte a second holds a connection slot for ever; 16 of them fill --max-connections 16).
# A 413 does not (a client that sends its big body at full speed reads its answer; closing with
# unread data makes the kernel reset the connection): the protocol gives the rest of that body
# one more body timeout, then closes (hardened_protocol).
CLOSE = {"Connection": "close"}


async def read_body(request: Any, max_bytes: int, timeout_s: float) -> bytes:
    """The body of a Starlette ``request``: 413 past ``max_bytes``, 408 after ``timeout_s`` seconds
    (a 408 closes the connection), and a client that hangs up mid-body is an ApiError of kind
    ``"disconnected"`` (status 499, as nginx logs it): the client's doing, not an internal error."""
    from starlette.requests import ClientDisconnect

    try:
        declared = int(request.headers.get("content-length") or 0)
    except ValueError:
        raise ApiError(400, "Content-Length is not a number", code="invalid_header") from None
    if declared > max_bytes:
        raise ApiError(413, f"request body is {declared} bytes; the limit is {max_bytes}",
                       code="body_too_large", kind="too_large")

    async def read() -> bytes:
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > max_bytes:
                raise ApiError(413, f"request body exceeds the limit of {max_bytes} bytes",
                               code="body_too_large", kind="too_large")
        return bytes(raw)

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout_s:g} s", code="timeout",
                       kind="timeout", headers=CLOSE) from None
    except ClientDisconnect:
        raise ApiError(499, "the client closed the connection before sending the whole body", code="disconnected",
                       kind="disconnected", headers=CLOSE) from None


_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
         b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


def hardened_protocol(header_timeout_s: float, max_connections: int, body_timeout_s: float | None = None) -> type:
    """uvicorn's h11 protocol plus a header timeout and a connection cap (see module docstring),
    and a drain limit: a connection whose answer went out before its request body was all in
    (413) is closed when the rest has not arrived within ``body_timeout_s`` seconds."""
    drain_s = header_timeout_s if body_timeout_s is None else body_timeout_s
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    busy_body = ApiError(503, "too many open connections; retry after a moment", type_="server_error",
                         code="too_many_connections").render()

    class HardenedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _drain_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.write(_BUSY % (len(busy_body), busy_body))
                transport.close()
                return
            self._arm()

        def _arm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _header_timeout(self) -> None:
            # their_state IDLE: the request line and headers are not complete yet
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request on this connection gets its own header time
                if self.conn.their_state is h11.SEND_BODY and self._drain_timer is None:
                    self._drain_timer = self.loop.call_later(drain_s, self._drain_timeout, self.cycle)

        def _drain_timeout(self, cycle: Any) -> None:
            self._drain_timer = None
            # the same request (not a later one on this connection) still in SEND_BODY: its
            # refused body is still trickling in after its answer
            if self.cycle is cycle and self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            for timer in (self._header_timer, self._drain_timer):
                if timer is not None:
                    timer.cancel()
            super().connection_lost(exc)

    return HardenedH11Protocol


def uvicorn_config(app: Any, cfg: Any, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> Any:
    """A ``uvicorn.Config`` with the limits of ``cfg`` (a :class:`~codex_lab.serve.router.ServerConfig`)."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", timeout_graceful_shutdown=2,
                          http=hardened_protocol(cfg.header_timeout_s, cfg.max_connections, cfg.body_timeout_s),
                          timeout_keep_alive=max(1, int(cfg.keep_alive_s)), limit_concurrency=cfg.max_connections + 1,
                          h11_max_incomplete_event_size=16 * 1024)
