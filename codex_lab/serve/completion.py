"""One ``POST /v1/completions`` after validation: route it, wait for the engine to accept it,
then turn the engine's events into a JSON answer or a server-sent-event stream.

Wire format (OpenAI's, plus one documented extension):

- ``finish_reason`` is "stop" or "length". A request cut by its deadline ends with
  "length" and the extension field ``"finish_detail": "deadline"`` in its choice.
- A stream sends ``data: {chunk}`` events and ends with ``data: [DONE]``; every chunk names
  the serving version as ``system_fingerprint``. With ``stream_options: {"include_usage":
  true}`` every chunk carries ``"usage": null`` and one last chunk has ``"choices": []`` and
  the usage, as OpenAI does.
- Text and tokens (vLLM's conventions): ``text`` leaves special tokens out unless
  ``skip_special_tokens`` is false; outside fill-in-the-middle a generated FIM sentinel ends
  the answer (:mod:`codex_lab.infer.sampling`), as a ``stop_token_ids`` id does; stop strings
  and stop ids are cut from the text unless ``include_stop_str_in_output``; ``usage`` and
  ``logprobs`` count and list every generated token, the ending end-of-text or stop id too.
  Stop strings are found by the server in the text it sends (the engine gets none), from
  token ``min_tokens`` on.
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

from fastapi.responses import JSONResponse

import torch

from codex_lab.infer.generate import answer_end_ids, output_text
from codex_lab.infer.sampling import SamplingParams
from codex_lab.infer.engine.output import IncrementalText
from codex_lab.serve.logprobs import _SCORE_LOCK, cumulative_logprob, wire_logprobs
from codex_lab.serve.protocol import CompletionRequest
from codex_lab.serve.api_errors import ApiError
from codex_lab.serve.output_text import safe_text, wire_finish
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
    cfg, tok = server.config, server.tokenizer
    # this prompt's own max_tokens, its context for repetition_penalty, the ids that end it
    params = req.engine_params(params, tok.eot_id, answer_end_ids(tok, req.prompt_ids, req.fim))
    try:
        for attempt in range(3):  # a version retired between routing and submitting: route again
            try:
                worker = server.route(req.version)
                if req.prompt_logprobs is not None and req.prompt_lp is None:  # once per prompt, off the loop
                    try:
                        req.prompt_lp = await asyncio.get_running_loop().run_in_executor(
                            None, wire_prompt_logprobs, worker.model, tok, req.prompt_ids, req.prompt_logprobs)
                    except Exception as exc:  # noqa: BLE001 (the scoring forward failed: this request only)
                        raise ApiError(500, f"scoring the prompt failed: {type(exc).__name__}: {exc}",
                                       type_="server_error", code="engine_error", kind="internal") from None
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
        self.req, self.tok, self.cfg, self.params = live.req, server.tokenizer, server.config, live.params
        self.cid, self.created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        self.ids: list[int] = []  # every generated token, an ending end-of-text or stop id included
        self.n_text = 0  # the first n_text ids make the text (an ending token only with include_stop_str_in_output)
        p = self.params
        # ids that end the answer here (the engine ends at end-of-text itself): stop ids, FIM sentinels outside FIM
        self.ends = set(p.stop_token_ids) | (set(p.end_ids) - {self.tok.eot_id})
        self.decode = (lambda ids: output_text(self.tok, ids, p.skip_special_tokens, p.spaces_between_special_tokens))
        # concatenative decodes only: the spaces put between special tokens depend on both neighbours
        self.incremental = self.incremental_text and (p.skip_special_tokens or not p.spaces_between_special_tokens)
        self.detok = IncrementalText(self.decode)  # the text without re-decoding every id per token
        self.floor: int | None = 0 if p.min_tokens <= 1 else None  # stop strings count past this character
        self.plp_sent = False
        self.reason: str | None = None  # the engine's reason: stop, length, deadline, disconnected
        self.error: str | None = None

    def on_disconnect(self) -> None:
        if not self.live.cancelled:
            self.worker.cancel(self.live)
            self.live.post(("disconnect", None))

    def _decoded(self) -> str:
        """The text of ``self.ids[:n_text]`` (:func:`~codex_lab.infer.generate.output_text`), decoded
        incrementally (the tail since the last complete character); ``Run.incremental_text = False``:
        the whole list every time (the reference path, same text)."""
        ids = self.ids[: self.n_text]
        return self.detok.text(ids) if self.incremental else self.decode(ids)

    def _safe(self, text: str) -> tuple[str, bool]:
        """:func:`safe_text` with this request's stop strings, ``min_tokens`` and ``include_stop_str_in_output``."""
        p = self.params
        if self.floor is None and len(self.ids) >= p.min_tokens:  # from token min_tokens on, stop strings count
            self.floor = len(self.decode(self.ids[: p.min_tokens - 1]))
        return safe_text(text, self.req.stop, self.floor, p.include_stop_str_in_output)

    def _end_at(self, k: int) -> None:
        """The answer ended at ``self.ids[k]`` (a stop id or sentinel): drop what came after it."""
        self.ids = self.ids[: k + 1]
        self.n_text = len(self.ids) - (0 if self.params.include_stop_str_in_output else 1)
        self.reason = "stop"

    def _end_text(self, hit_reason: str | None) -> str:
        text, hit = self._safe(self._decoded())
        if hit:  # the server enforces stop strings itself (the engine gets none)
            self.reason = "stop"
        elif hit_reason is not None:
            self.reason = hit_reason
        if not hit:
            text = self._decoded()  # the end: send any held-back tail
        return text

    async def events(self) -> AsyncIterator[tuple[str, Any]]:
        """("delta", text) while running, then ("end", text) or ("error", message)."""
        watcher = asyncio.create_task(_watch_disconnect(self.receive, self.on_disconnect))
        sent, done = "", False
        # the engine enforces the deadline; a guard two seconds after it: one timer for the request, which
        # posts a "guard" event (not a wait_for per token: that is a task and a timer for every token)
        hard_deadline = self.live.arrival + self.cfg.deadline_s + 2.0
        guard = asyncio.get_running_loop().call_later(max(hard_deadline - time.perf_counter(), 0.0),
                                                      self.live.events.put_nowait, ("guard", None))
        try:
            while True:
                kind, val = await self.live.events.get()
                if kind == "guard":
                    self.worker.cancel(self.live)
                    self.reason = "deadline"
                    text = self._safe(self._decoded())[0]
                    break
                if kind == "token":
                    if val == self.tok.eot_id and not self.params.ignore_eos:
                        continue  # the engine's end notice (held-back text); "done" follows and counts it
                    self.ids.append(val)
                    if val in self.ends:  # a stop id, or a FIM sentinel outside FIM: the answer ends here
                        self.worker.cancel(self.live)
                        self._end_at(len(self.ids) - 1)
                        text = self._end_text(None)
                        break
                    self.n_text = len(self.ids)
                    text, hit = self._safe(self._decoded())
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
                    self.n_text = len(self.ids)
                    reason = val.finish_reason
                    hit_id = next((k for k, t in enumerate(self.ids) if t in self.ends), None)
                    if hit_id is not None:  # a stop id without its token event (ignore_eos end notices)
                        self._end_at(hit_id)
                        reason = None
                    elif reason == "stop":  # the engine stops only at end-of-text: a generated token (vLLM counts it)
                        self.ids.append(self.tok.eot_id)
                        self.n_text += int(self.params.include_stop_str_in_output)
                    text = self._end_text(reason)
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
            guard.cancel()
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
                                  prompt_tokens=len(self.req.prompt_ids), finish_reason=self.reason or "length",
                                  parses=self._parses())
        finally:
            self.server.release()

    def _parses(self) -> bool | None:
        """The live quality signal: does prompt + answer, cut at the function's end, parse as Python
        (:func:`~codex_lab.infer.syntax.parses`)? None when the answer is empty or cannot be decoded."""
        from codex_lab.infer.syntax import cut_function, parses

        try:
            body = cut_function(self._decoded())
            prompt = self.decode(list(self.req.prompt_ids))
        except Exception:  # noqa: BLE001  (a signal, never a failure of the request)
            return None
        return bool(body.strip()) and parses(prompt + body)

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
        ids = self.ids  # as vLLM, an ending end-of-text or stop id is listed
        n = min(len(ids), len(self.live.logprobs))
        out = wire_logprobs(self.tok, ids[self.lp_done:n], self.live.logprobs[self.lp_done:n], self.offset)
        self.lp_done = max(self.lp_done, n)
        if out["tokens"]:
            self.offset = out["text_offset"][-1] + len(out["tokens"][-1])
        return out

    def score(self) -> float:
        """Cumulative logprob of the sampled tokens (``best_of`` keeps the highest)."""
        return cumulative_logprob(self.live.logprobs[: len(self.ids)])

    def choice(self, text: str, final: bool, logprobs: dict[str, list[Any]] | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {"text": text, "index": self.index, "logprobs": logprobs, "finish_reason": None}
        if self.req.prompt_logprobs is not None and not self.plp_sent:  # vLLM's field, with the first chunk
            c["prompt_logprobs"], self.plp_sent = self.req.prompt_lp, True
        if final:
            c["finish_reason"], detail = wire_finish(self.reason or "length")
            if detail:
                c["finish_detail"] = detail  # extension: why "length" (e.g. the deadline)
        return c

    def _chunk(self, choices: list[dict[str, Any]], usage: Any = None) -> str:
        obj: dict[str, Any] = {"id": self.cid, "object": "text_completion", "created": self.created,
                               "model": self.cfg.model_name, "system_fingerprint": self.worker.version,
                               "choices": choices}
        if self.req.include_usage:
            obj["usage"] = usage
        return f"data: {_dumps(obj)}\n\n"

    def headers(self) -> dict[str, str]:
        return {"x-codex-lab-version": self.worker.version}


@torch.no_grad()
def wire_prompt_logprobs(model: Any, tok: Any, ids: list[int], k: int) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs`` of one prompt: None for the first token, then per token a map
    ``str(token id) -> {"logprob", "rank", "decoded_token"}`` holding the prompt's own token and
    the ``k`` most likely ones (rank 1 = most likely; the model's raw log-softmax, one forward)."""
    dev = next(model.parameters()).device
    x = torch.tensor([list(ids)], dtype=torch.long, device=dev)  # (1, T)
    with _SCORE_LOCK:
        logits = model(x).logits[0]  # (T, V)
    # log p(ids[t] | ids[:t]) = log_softmax(logits[t - 1])[ids[t]]
    logp = torch.log_softmax(logits[:-1].float(), dim=-1).cpu()  # (T - 1, V)
    target = x[0, 1:].cpu()  # (T - 1,)
    chosen = logp.gather(1, target[:, None])  # (T - 1, 1)
    rank = (logp > chosen).sum(dim=-1) + 1  # (T - 1,): 1 + tokens strictly more likely
    top_v, top_i = torch.topk(logp, min(k, logp.size(-1)), dim=-1) if k > 0 else (None, None)
    out: list[dict[str, Any] | None] = [None]
    for t in range(len(ids) - 1):
        entry = {str(int(target[t])): {"logprob": float(chosen[t, 0]), "rank": int(rank[t]),
                                       "decoded_token": tok.decode([int(target[t])])}}
        if top_i is not None:
            for r, (i, v) in enumerate(zip(top_i[t].tolist(), top_v[t].tolist()), start=1):
                entry.setdefault(str(i), {"logprob": float(v), "rank": r, "decoded_token": tok.decode([i])})
        out.append(entry)
    return out
