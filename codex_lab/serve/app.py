"""An OpenAI-compatible completions server over the continuous-batching engine.

The pieces, one module each:

- :mod:`~codex_lab.serve.protocol`: request validation, error bodies, finish reasons;
- :mod:`~codex_lab.serve.worker`: one model version = one engine + the thread that steps it;
- :mod:`~codex_lab.serve.router`: :class:`ModelServer` (versions, canary share, limits,
  health) and :class:`ServerConfig`;
- :mod:`~codex_lab.serve.completion`: one request from acceptance to its JSON or stream;
- :mod:`~codex_lab.serve.security`: Host allow-list, API key, JSON-only bodies, timeouts,
  connection cap;
- here: :func:`create_app`, the routes, and :class:`BackgroundServer` (uvicorn in a thread
  on a loopback port, for tests and notebooks).

Routes: ``POST /v1/completions`` (plain, or server-sent events ending with ``data: [DONE]``;
batches of prompts, ``n``/``best_of``, ``logprobs``, ``echo``, penalties, ``suffix`` for a
FIM-trained model: :mod:`~codex_lab.serve.batch`), ``POST /v1/chat/completions`` (400: a base
model has no chat template), ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``,
``GET /metrics``, and vLLM's ``GET /tokenizer_info``, ``POST /tokenize``, ``POST /detokenize``.

Readiness: ``GET /health`` answers 200 while the process lives (a liveness probe) and reports
the ``phase``: ``starting`` (the model is loading: no version yet), ``warming`` (the eager step
serves while the decode graphs compile in the background; ``compile.graphs_done`` of
``graphs_total``), ``ready`` (the compiled graphs serve, or the engine compiles nothing), or
``degraded`` (the compile failed and the eager step serves, or an engine died). The phase is
the primary version's (a canary compiling beside it does not take the server out of rotation)
and ``degraded`` whenever any engine is dead. ``GET /ready`` (also ``/health/ready``) answers
200 in ``ready`` and 503 otherwise (a readiness probe), with the same body; ``/metrics`` has
``codex_lab:server_phase{phase=...}`` (one-hot) and ``codex_lab:compile_graphs_done`` /
``_total`` per version. ``create_app(wait_ready=True)`` (``codex-lab serve --wait-ready``)
answers completions with 503 + ``Retry-After`` until the phase is ``ready`` or ``degraded``;
by default they are served while compiling (``--serve-while-compiling``).

Answers: bad fields -> 400, wrong API key -> 401, Host not allowed -> 403, unknown model ->
404, body too slow -> 408, body too large -> 413, not JSON -> 415, more requests in flight
than ``max_batch_size`` per version ``+ max_waiting`` -> 429 with ``Retry-After``; every error
has OpenAI's shape. Each request has a deadline (30 s by default): it then ends with
``finish_reason="length"`` and ``finish_detail="deadline"`` (an extension field). A client
that disconnects is cancelled in the engine at once, freeing its slot. A failure while
serving one request fails that request alone (500, or an error event then ``[DONE]`` on a
stream); the engine goes on serving the others.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from codex_lab.serve.batch import serve_completion
from codex_lab.serve.completion import AsciiJSONResponse
from codex_lab.serve.protocol import TOKENIZE_FIELDS, check_capacity, parse_completion
from codex_lab.serve.api_errors import ApiError, check_fields, parse_json, valid_text
from codex_lab.serve.router import ModelServer, ServerConfig
from codex_lab.serve.security import Guard, check_loopback, read_body, uvicorn_config

__all__ = ["BackgroundServer", "create_app", "readiness", "serve_in_background"]


def readiness(server: ModelServer) -> dict[str, Any]:
    """The server's phase (see the module's doc), each version's (``versions``) and the primary's
    compile progress (``compile``)."""
    workers = dict(server.workers)
    per = {v: w.phase() for v, w in workers.items()}
    primary = per.get(server.primary) if server.primary is not None else None
    if server.tokenizer is None or primary is None:
        phase = "starting"
    elif any(w.error is not None or not w.thread.is_alive() for w in workers.values()):
        phase = "degraded"  # a dead engine anywhere: its share of requests fails
    else:
        phase = primary["phase"]
    prog = primary or {"graphs_done": 0, "graphs_total": 0, "error": ""}
    return {"phase": phase, "ready": phase == "ready", "versions": per,
            "compile": {k: prog[k] for k in ("graphs_done", "graphs_total", "error")}}


def create_app(server: ModelServer, *, wait_ready: bool = False, compile_cache: dict[str, Any] | None = None) -> Any:
    """The ASGI app serving ``server``: the FastAPI routes behind the :class:`Guard`.

    ``wait_ready``: completions get 503 (with ``Retry-After``) until the phase is ``ready`` or
    ``degraded`` (default: served while the graphs compile). ``compile_cache``: what
    :func:`~codex_lab.infer.compile_cache.use_compile_cache` returned, shown in ``/health``.

    The server may start without its tokenizer and versions (``ModelServer(None, ...)``, the model
    still loading): every route that needs them answers 503 until they arrive."""
    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        server.close()

    app = FastAPI(title="codex-lab server", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.server = server
    cfg, metrics = server.config, server.metrics

    def not_ready(what: str) -> ApiError:
        return ApiError(503, f"{what}; retry in a moment (GET /ready says when)", type_="server_error",
                        code="not_ready", kind="unavailable", headers={"Retry-After": str(max(1, cfg.retry_after_s))})

    def tokenizer() -> Any:
        if server.tokenizer is None:
            raise not_ready("the model is still loading")
        return server.tokenizer

    def health_body() -> dict[str, Any]:
        body = server.health()
        ready = readiness(server)
        status = "starting" if ready["phase"] == "starting" else \
            "degraded" if ready["phase"] == "degraded" else body["status"]
        ready["compile"]["cache"] = compile_cache
        return {"status": status, **ready, **{k: v for k, v in body.items() if k != "status"}}

    def err(e: ApiError) -> AsciiJSONResponse:
        if e.kind:  # "" = already counted, with its version
            metrics.error(e.kind)
        return AsciiJSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> AsciiJSONResponse:
        kind = "not_found" if exc.status_code == 404 else "invalid_request"
        return err(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind=kind))

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> AsciiJSONResponse:
        return err(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type_="server_error", kind="internal"))

    @app.get("/health")
    async def health() -> dict[str, Any]:  # liveness: 200 while the process answers at all
        return health_body()

    @app.get("/ready")
    @app.get("/health/ready")
    async def ready() -> AsciiJSONResponse:  # readiness: 200 only when the compiled graphs serve
        body = health_body()
        return AsciiJSONResponse(body, status_code=200 if body["ready"] else 503)

    @app.get("/metrics")
    async def prom() -> PlainTextResponse:
        for v, s in server.engine_stats().items():
            metrics.set_engine_stats(v, s)
        r = readiness(server)
        metrics.set_phase(r["phase"], {v: (p["graphs_done"], p["graphs_total"]) for v, p in r["versions"].items()})
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def model_card(model_id: str) -> dict[str, Any]:  # max_model_len: vLLM's field, the context in tokens
        return {"id": model_id, "object": "model", "created": int(server.started), "owned_by": "codex-lab",
                "root": cfg.model_name, "parent": None, "max_model_len": cfg.limits.max_seq_len}

    def capacity() -> tuple[int, str]:
        """Requests the server admits at once (router's admit: batch per version + queue), and how."""
        n = max(1, len(server.workers))
        return cfg.max_batch_size * n + cfg.max_waiting, (f"--max-batch-size {cfg.max_batch_size} x {n} version(s) "
                                                          f"+ --max-waiting {cfg.max_waiting}")

    def model_ids() -> list[str]:
        return [cfg.model_name] + [f"{cfg.model_name}@{v}" for v in server.versions()]

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(i) for i in model_ids()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Any:
        if model_id not in model_ids():
            return err(ApiError(404, f"the model {model_id[:80]!r} does not exist; served: {model_ids()}",
                                param="model", code="model_not_found", kind="not_found"))
        return model_card(model_id)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        try:
            tok = tokenizer()
            if wait_ready and readiness(server)["phase"] not in ("ready", "degraded"):
                raise not_ready("the server is not ready (--wait-ready: it answers once the decode graphs compiled)")
            raw = await read_body(request, cfg.limits.max_body_bytes, cfg.body_timeout_s)
            req = parse_completion(parse_json(raw, cfg.limits), tok, cfg.limits, cfg.model_name, server.versions(),
                                   fim_format=cfg.fim_format)
            try:
                req.sampling_params().validate()
            except ValueError as exc:
                raise ApiError(400, str(exc)) from None
            check_capacity(req, *capacity())  # never admissible: a 400, not a 429 clients retry forever
            return await serve_completion(server, req, request.receive)
        except ApiError as e:
            return err(e)
        except RecursionError:  # deeply nested values that survived the parser
            return err(ApiError(400, "the body is nested too deeply; send a flat JSON object", code="invalid_json"))

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        return err(ApiError(400, f"{cfg.model_name} is a base code model without a chat template, so it has no chat "
                                 "completions; send the code to continue to POST /v1/completions instead",
                            code="no_chat_template"))

    # vLLM's tokenizer routes (lm-evaluation-harness's local-completions uses them when present)
    def token_str(i: int) -> str | None:
        return tokenizer().tok.id_to_token(i)

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> Any:
        try:
            tok = tokenizer()
        except ApiError as e:
            return err(e)
        return {"tokenizer_class": type(tok).__name__, "eos_token": token_str(tok.eot_id),
                "pad_token": token_str(tok.pad_id), "bos_token": None, "model_max_length": cfg.limits.max_seq_len,
                "vocab_size": tok.vocab_size}

    async def json_body(request: Request) -> dict[str, Any]:
        return parse_json(await read_body(request, cfg.limits.max_body_bytes, cfg.body_timeout_s), cfg.limits)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Any:
        try:
            tok = tokenizer()
            body = await json_body(request)
            check_fields(body, TOKENIZE_FIELDS, cfg.limits)
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise ApiError(400, "'prompt' must be a string to tokenize", param="prompt")
            flags = {}
            for name, default in (("add_special_tokens", True), ("return_token_strs", False)):
                flags[name] = body.get(name, default) if body.get(name) is not None else default
                if not isinstance(flags[name], bool):
                    raise ApiError(400, f"'{name}' must be true or false, got {str(flags[name])[:40]!r}", param=name)
            # add_special_tokens: the tokenizer's template (bos/eos) is applied, as vLLM; the course
            # tokenizer has none, so both give the same ids there (a converted HF tokenizer may differ)
            ids = tok.tok.encode(valid_text(prompt, "prompt"), add_special_tokens=flags["add_special_tokens"]).ids \
                if prompt else []
        except ApiError as e:
            return err(e)
        strs = [token_str(i) for i in ids] if flags["return_token_strs"] else None
        return {"count": len(ids), "max_model_len": cfg.limits.max_seq_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Any:
        try:
            tok = tokenizer()
            body = await json_body(request)
            check_fields(body, ("model", "tokens"), cfg.limits)
            ids = body.get("tokens")
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                    and 0 <= t < tok.vocab_size for t in ids):
                raise ApiError(400, f"'tokens' must be a list of token ids in 0..{tok.vocab_size - 1}", param="tokens")
        except ApiError as e:
            return err(e)
        return {"prompt": tok.decode(ids)}

    return Guard(app, allowed_hosts=cfg.allowed_hosts, api_key=cfg.api_key, on_error=metrics.error)


class BackgroundServer:
    """uvicorn serving an app in a daemon thread on 127.0.0.1; ``url`` and ``stop()``.

    ``config``: the :class:`ServerConfig` whose timeouts and connection cap uvicorn gets
    (default: the defaults).
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 config: ServerConfig | None = None) -> None:
        import uvicorn

        check_loopback(host)
        self.sock = socket.socket(socket.AF_INET6 if host == "::1" else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{'[::1]' if host == '::1' else host}:{self.port}"
        ucfg = uvicorn_config(app, config or ServerConfig(), host=host, port=self.port, log_level=log_level)
        self.uvicorn = uvicorn.Server(ucfg)
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name="uvicorn")
        self.thread.start()
        t0 = time.time()
        while not self.uvicorn.started:
            if not self.thread.is_alive() or time.time() - t0 > 30:
                raise RuntimeError("the server did not start within 30 s")
            time.sleep(0.01)

    def stop(self) -> None:
        """Shut uvicorn down and join its thread."""
        self.uvicorn.should_exit = True
        self.thread.join(10)
        self.sock.close()


def serve_in_background(server: ModelServer, host: str = "127.0.0.1", port: int = 0) -> BackgroundServer:
    """Start ``create_app(server)`` on a loopback port; returns the handle (``.url``, ``.stop()``)."""
    return BackgroundServer(create_app(server), host=host, port=port, config=server.config)
