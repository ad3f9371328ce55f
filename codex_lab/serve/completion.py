"""One ``POST /v1/completions`` after validation: route it, wait for the engine to accept it,
then turn the engine's events into a JSON answer or a server-sent-event stream.

Wire format (OpenAI's, plus one documented extension):

- ``finish_reason`` is "stop" or "length". A request cut by its deadline ends with
  "length" and the extension field ``"finish_detail": "deadline"`` in its choice.
- A stream sends ``data: {chunk}`` events and ends with ``data: [DONE]``. With
  ``stream_options: {"include_usage": true}`` every chunk carries ``"usage": null`` and one
  last chunk has ``"choices": []`` and the usage, as OpenAI does.
- A failure while serving the request (not its input) gives a 500 in OpenAI's error shape,
  or, once a stream has started, one ``data: {"error": {...}}`` event and then ``[DONE]``.
  It is counted as an internal error of the version; the other requests go on.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator, Callable

from fastapi.responses import JSONResponse, StreamingResponse

from codex_lab.infer.sampling import SamplingParams
from codex_lab.infer.scheduler import IncrementalText
from codex_lab.serve.logprobs import cumulative_logprob, wire_logprobs
from codex_lab.serve.protocol import ApiError, CompletionRequest, safe_text, wire_finish
from codex_lab.serve.router import ModelServer
from codex_lab.serve.worker import EngineWorker, Live, WorkerClosed


async def _watch_disconnect(receive: Callable[[], Any], on_disconnect: Callable[[], None]) -> None:
    """Wait for the client's ``http.disconnect`` and call ``on_disconnect``."""
    while True:
        msg = await receive()
        if msg.get("type") == "http.disconnect":
            on_disconnect()
            return


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=True)


class AsciiJSONResponse(JSONResponse):
    """A JSON response escaped to ASCII: text echoed from a client can never break its encoding."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


async def start(server: ModelServer, req: CompletionRequest, params: SamplingParams, receive: Callable[[], Any],
                index: int = 0) -> "Run":
    """Route and submit an admitted request; return its :class:`Run` once the engine accepted it.

    Raises :class:`ApiError`: 404/503 when no version can take it, 400 when the engine
    refuses the input, 500 when the engine fails on it. The request is released on error.
    """
    cfg = server.config
    try:
        for attempt in range(3):  # a version retired between routing and submitting: route again
            try:
                worker = server.route(req.version)
                live = Live(asyncio.get_running_loop(), req, params, cfg.deadline_s)
                worker.submit(live)
                break
            except (WorkerClosed, KeyError):
                if attempt == 2 or req.version is not None:
                    raise ApiError(404 if req.version else 503, f"version {req.version or 'primary'} is no longer "
                                   "served", param="model", code="model_not_found", kind="not_found") from None
        try:
            kind, val = await asyncio.wait_for(live.events.get(), timeout=cfg.deadline_s + 2.0)
        except asyncio.TimeoutError:
            worker.cancel(live)
            raise ApiError(503, "the engine did not take the request in time; retry later", type_="server_error",
                           code="engine_busy", kind="internal") from None
        if kind == "refused":
            raise ApiError(400, f"the request cannot be served: {val}", code="invalid_request")
        if kind == "error":
            server.metrics.error("internal", worker.version)
            raise ApiError(500, f"the engine of version {worker.version} failed on this request: {val}",
                           type_="server_error", code="engine_error", kind="")  # counted above
    except ApiError:
        server.release()
        raise
    return Run(server, worker, live, receive, index)


class Run:
    """An accepted request: its events as text deltas, then the end (text, reason, tokens)."""

    incremental_text = True  # False: decode every received id again per token (reference; profiling)

    def __init__(self, server: ModelServer, worker: EngineWorker, live: Live, receive: Callable[[], Any],
                 index: int = 0) -> None:
        self.server, self.worker, self.live, self.receive, self.index = server, worker, live, receive, index
        self.lp_done, self.offset = 0, 0  # tokens whose logprobs were sent; text offset of the next one
        self.eot_scored = False  # ended at end-of-text, whose logprob is reported as the last token
        self.req, self.tok, self.cfg = live.req, server.tokenizer, server.config
        self.cid, self.created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        self.ids: list[int] = []
        self.detok = IncrementalText(self.tok.decode)  # decode(self.ids) without re-decoding it all per token
        self.reason: str | None = None  # the engine's reason: stop, length, deadline, disconnected
        self.error: str | None = None

    def on_disconnect(self) -> None:
        if not self.live.cancelled:
            self.worker.cancel(self.live)
            self.live.post(("disconnect", None))

    def _decoded(self) -> str:
        """``tok.decode(self.ids)``, decoded incrementally (the tail since the last complete character);
        ``Run.incremental_text = False``: the whole list every time (the reference path, same text)."""
        return self.detok.text(self.ids) if self.incremental_text else self.tok.decode(self.ids)

    def _end_text(self, hit_reason: str | None) -> str:
        text, hit = safe_text(self._decoded(), self.req.stop)
        if hit:  # the server enforces stop strings itself, whatever the engine does
            self.reason = "stop"
        elif hit_reason is not None:
            self.reason = hit_reason
        if not hit and self.reason != "stop":
            text = self._decoded()  # the end: send any held-back tail
        return text

    async def events(self) -> AsyncIterator[tuple[str, Any]]:
        """("delta", text) while running, then ("end", text) or ("error", message)."""
        watcher = asyncio.create_task(_watch_disconnect(self.receive, self.on_disconnect))
        sent, done = "", False
        try:
            hard_deadline = self.live.arrival + self.cfg.deadline_s + 2.0  # the engine enforces it; a guard
            while True:
                try:
                    left = max(hard_deadline - time.perf_counter(), 0.0)
                    kind, val = await asyncio.wait_for(self.live.events.get(), timeout=left)
                except asyncio.TimeoutError:
                    self.worker.cancel(self.live)
                    self.reason = "deadline"
                    text = safe_text(self._decoded(), self.req.stop)[0]
                    break
                if kind == "token":
                    if val == self.tok.eot_id:  # the engine's end notice (held-back text), not an output token
                        continue
                    self.ids.append(val)
                    text, hit = safe_text(self._decoded(), self.req.stop)
                    if hit:
                        self.worker.cancel(self.live)
                        self.reason = "stop"
                        break
                    if len(text) > len(sent) and text.startswith(sent):
                        yield "delta", text[len(sent):]
                        sent = text
                elif kind == "done":
                    if len(val.output_ids) >= len(self.ids):
                        self.ids = list(val.output_ids)
                    # the engine's end-of-text has a logprob entry but is not an output token
                    self.eot_scored = len(self.live.logprobs) == len(val.output_ids) + 1
                    text = self._end_text(val.finish_reason)
                    break
                elif kind == "disconnect":
                    self.reason = "disconnected"
                    return
                elif kind == "error":
                    self.error = str(val)
                    done = True
                    yield "error", self.error
                    return
            done = True
            yield "end", text
        finally:
            watcher.cancel()
            if not done and not self.live.cancelled:
                self.worker.cancel(self.live)  # the client went away: free the slot now
            self._account(done)

    def _account(self, done: bool) -> None:
        # metrics first, then the slot: whoever sees the request gone (/health) sees it counted
        m, v = self.server.metrics, self.worker.version
        try:
            if self.error is not None:
                m.error("internal", v)
            elif self.reason == "disconnected" or not done:
                m.error("disconnected", v)
            else:
                m.observe_request(v, arrival=self.live.arrival, token_times=self.live.token_times[: len(self.ids)],
                                  prompt_tokens=len(self.req.prompt_ids), finish_reason=self.reason or "length")
        finally:
            self.server.release()

    # ---- answers -----------------------------------------------------------------------
    def abandon(self) -> None:
        """Drop an accepted run nobody will read (another choice of its request failed)."""
        self.worker.cancel(self.live)
        self.server.release()

    def usage(self) -> dict[str, int]:
        n_in, n_out = len(self.req.prompt_ids), len(self.ids)
        return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}

    def take_logprobs(self) -> dict[str, list[Any]] | None:
        """The ``logprobs`` object of the tokens received and not yet reported (None when not asked)."""
        if self.req.logprobs is None:
            return None
        ids = self.ids + [self.tok.eot_id] * self.eot_scored  # as vLLM, an ending end-of-text is listed
        n = min(len(ids), len(self.live.logprobs))
        out = wire_logprobs(self.tok, ids[self.lp_done:n], self.live.logprobs[self.lp_done:n], self.offset)
        self.lp_done = max(self.lp_done, n)
        if out["tokens"]:
            self.offset = out["text_offset"][-1] + len(out["tokens"][-1])
        return out

    def score(self) -> float:
        """Cumulative logprob of the sampled tokens (``best_of`` keeps the highest)."""
        return cumulative_logprob(self.live.logprobs[: len(self.ids) + int(self.eot_scored)])

    def choice(self, text: str, final: bool, logprobs: dict[str, list[Any]] | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {"text": text, "index": self.index, "logprobs": logprobs, "finish_reason": None}
        if final:
            c["finish_reason"], detail = wire_finish(self.reason or "length")
            if detail:
                c["finish_detail"] = detail  # extension: why "length" (e.g. the deadline)
        return c

    def _chunk(self, choices: list[dict[str, Any]], usage: Any = None) -> str:
        obj: dict[str, Any] = {"id": self.cid, "object": "text_completion", "created": self.created,
                               "model": self.cfg.model_name, "choices": choices}
        if self.req.include_usage:
            obj["usage"] = usage
        return f"data: {_dumps(obj)}\n\n"

    def headers(self) -> dict[str, str]:
        return {"x-codex-lab-version": self.worker.version}
