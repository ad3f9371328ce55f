"""One ``POST /v1/completions`` with all its choices: prompts x samples, echo, best_of.

A request may carry several prompts (strings or token-id lists) and ask for ``n`` choices
per prompt out of ``best_of`` samples. Each sample is one engine request (a
:class:`~codex_lab.serve.completion.Run`, admitted on its own, so a full server answers 429);
all of them go to the one version routed for the request. The answer lists the choices in
prompt order, ``index = prompt * n + rank`` (vLLM's numbering); with ``best_of > n`` the
``n`` samples of highest cumulative logprob are kept. ``echo`` puts the prompt's text (and,
with ``logprobs``, its tokens' logprobs, the first null) before each choice's completion;
``max_tokens=0`` with ``echo`` scores the prompt without generating. ``usage`` counts every
prompt once and every generated token of every sample.

A stream interleaves the choices' chunks as they come, each naming its ``index``; one
choice that fails sends an error event, the others are cancelled, then ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import Any, AsyncIterator, Callable, NamedTuple

from fastapi.responses import StreamingResponse

from codex_lab.serve.completion import AsciiJSONResponse, Run, _dumps, start
from codex_lab.serve.logprobs import merge_wire, prompt_logprobs, wire_logprobs
from codex_lab.serve.protocol import CompletionRequest
from codex_lab.serve.api_errors import ApiError
from codex_lab.serve.router import ModelServer


class Echo(NamedTuple):
    """A prompt echoed before its completions: its text and (with logprobs) its logprobs object."""

    text: str
    logprobs: dict[str, list[Any]] | None


async def _echoes(server: ModelServer, model: Any, req: CompletionRequest) -> list[Echo]:
    """Each prompt's text and, when logprobs are asked for, one forward pass's logprobs of it."""
    tok, loop, out = server.tokenizer, asyncio.get_running_loop(), []
    for ids in req.prompts:
        lp = None
        if req.logprobs is not None:  # the forward runs off the event loop, beside the engine thread
            entries = await loop.run_in_executor(None, prompt_logprobs, model, ids, req.logprobs)
            lp = wire_logprobs(tok, ids, entries)
        out.append(Echo(tok.decode(ids), lp))
    return out


def _fanout(receive: Callable[[], Any], n: int) -> tuple[list[Callable[[], Any]], asyncio.Task | None]:
    """``n`` receive functions that all see the client's disconnect (one real reader)."""
    if n == 1:
        return [receive], None
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive()).get("type") != "http.disconnect":
            pass
        gone.set()

    async def wait() -> dict[str, str]:
        await gone.wait()
        return {"type": "http.disconnect"}

    return [wait] * n, asyncio.create_task(watch())


async def serve_completion(server: ModelServer, req: CompletionRequest, receive: Callable[[], Any]) -> Any:
    """Route, admit and run every choice of ``req``; the JSON answer or the event stream.

    Raises :class:`ApiError` (429 full, 404/503 no version, 400/500 from the engine) before
    anything was sent; choices already started are cancelled then.
    """
    worker = server.route(req.version)  # one version answers every choice of the request
    if req.echo and req.max_tokens == 0:
        server.admit()
        try:
            echoes = await _echoes(server, worker.model, req)
        finally:
            server.release()
        return _echo_only(server, req, echoes, worker.version)
    runs: list[Run] = []
    receivers, watcher = _fanout(receive, len(req.prompts) * req.best_of)
    try:
        echoes = await _echoes(server, worker.model, req) if req.echo else []
        for i in range(len(req.prompts)):
            sub = replace(req.for_prompt(i), version=worker.version)
            for j in range(req.best_of):
                server.admit()
                runs.append(await start(server, sub, req.sampling_params(j), receivers[len(runs)], len(runs)))
    except BaseException:
        for r in runs:
            r.abandon()
        if watcher is not None:
            watcher.cancel()
        raise
    cid, created = runs[0].cid, runs[0].created
    for k, r in enumerate(runs):  # one id for the whole answer; index = prompt * n + rank (set below)
        r.cid, r.created, r.index = cid, created, k
        r.offset = len(echoes[k // req.best_of].text) if echoes else 0
    try:
        if req.stream:
            return _stream(server, req, runs, echoes, watcher)
        return await _answer(server, req, runs, echoes)
    finally:
        if watcher is not None and not req.stream:
            watcher.cancel()


def _usage(req: CompletionRequest, runs: list[Run]) -> dict[str, int]:
    n_in, n_out = sum(len(p) for p in req.prompts), sum(len(r.ids) for r in runs)
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}


async def _collect(run: Run) -> tuple[str, Any]:
    last: tuple[str, Any] = ("gone", None)
    async for kind, val in run.events():
        if kind in ("end", "error"):
            last = (kind, val)
    return last


async def _answer(server: ModelServer, req: CompletionRequest, runs: list[Run], echoes: list[Echo]) -> AsciiJSONResponse:
    results = await asyncio.gather(*(_collect(r) for r in runs))
    head = runs[0]
    for r, (kind, val) in zip(runs, results):
        if kind == "error":
            e = ApiError(500, f"the engine of version {r.worker.version} failed on this request: {val}",
                         type_="server_error", code="engine_error")
            return AsciiJSONResponse(e.body(), status_code=500, headers=head.headers())
        if kind == "gone":  # client gone: nobody reads this
            return AsciiJSONResponse({"error": {"message": "client disconnected", "type": "invalid_request_error",
                                                "param": None, "code": "disconnected"}}, status_code=499)
    choices = []
    for i in range(len(req.prompts)):
        group = list(zip(runs, results))[i * req.best_of:(i + 1) * req.best_of]
        if req.best_of > req.n:  # keep the n samples of highest cumulative logprob (stable: ties by sample order)
            group = sorted(group, key=lambda rv: -rv[0].score())[: req.n]
        for rank, (r, (_, text)) in enumerate(group):
            r.index = i * req.n + rank
            echo = echoes[i] if echoes else Echo("", None)
            lp = r.take_logprobs()
            lp = merge_wire(echo.logprobs, lp) if lp is not None else None
            choices.append(r.choice(echo.text + text, True, lp))
    return AsciiJSONResponse({"id": head.cid, "object": "text_completion", "created": head.created,
                              "model": head.cfg.model_name, "system_fingerprint": head.worker.version,
                              "choices": choices, "usage": _usage(req, runs)}, headers=head.headers())


def _stream(server: ModelServer, req: CompletionRequest, runs: list[Run], echoes: list[Echo],
            watcher: asyncio.Task | None) -> StreamingResponse:
    """Server-sent events: every choice's chunks as they come, then usage (if asked) and [DONE]."""
    async def pump(r: Run, q: asyncio.Queue) -> None:
        echo = echoes[r.index // req.best_of] if echoes else None
        ev, sent = r.events(), ""
        try:
            async for kind, val in ev:
                pre, pre_lp = (echo.text, echo.logprobs) if echo is not None else ("", None)
                if kind == "error":
                    q.put_nowait(("error", val))
                    return
                if kind == "delta":
                    sent += val
                    text, final = val, False
                else:  # "end"
                    text, final = (val[len(sent):] if val.startswith(sent) else ""), True
                lp = r.take_logprobs()
                q.put_nowait(("chunk", r._chunk([r.choice(pre + text, final, merge_wire(pre_lp, lp) if lp else None)])))
                echo = None  # the prompt goes out with the first chunk only
        finally:
            await ev.aclose()  # runs the request's clean-up even if the client vanished
            q.put_nowait(("done", None))

    async def sse() -> AsyncIterator[str]:
        q: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.create_task(pump(r, q)) for r in runs]
        try:
            left, failed = len(tasks), False
            while left and not failed:
                # every event already waiting is handled now, and the chunks among them go out in one
                # write: the same events, byte for byte, with one pass through the response and the
                # socket instead of one per token when the stream runs ahead of the writer
                items = [await q.get()]
                while not q.empty():
                    items.append(q.get_nowait())
                out: list[str] = []
                for kind, val in items:
                    if kind == "done":
                        left -= 1
                    elif kind == "chunk":
                        out.append(val)
                    else:  # one choice failed: report it, cancel the others
                        e = ApiError(500, f"the engine failed on this request: {val}", type_="server_error",
                                     code="engine_error")
                        out.append(f"data: {_dumps(e.body())}\n\n")
                        failed = True
                        break
                if out:
                    yield "".join(out)
            if not failed and req.include_usage:
                yield runs[0]._chunk([], _usage(req, runs))
            yield "data: [DONE]\n\n"
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if watcher is not None:
                watcher.cancel()

    return StreamingResponse(sse(), media_type="text/event-stream", headers=runs[0].headers())


def _echo_only(server: ModelServer, req: CompletionRequest, echoes: list[Echo], version: str) -> Any:
    """``max_tokens=0`` with ``echo``: the prompts and their logprobs, nothing generated."""
    cid, created, name = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time()), server.config.model_name
    choices = [{"text": e.text, "index": i, "logprobs": e.logprobs, "finish_reason": "length"}
               for i, e in enumerate(echoes)]
    n_in = sum(len(p) for p in req.prompts)
    usage = {"prompt_tokens": n_in, "completion_tokens": 0, "total_tokens": n_in}
    body: dict[str, Any] = {"id": cid, "object": "text_completion", "created": created, "model": name,
                            "system_fingerprint": version, "choices": choices, "usage": usage}
    headers = {"x-codex-lab-version": version}
    if not req.stream:
        return AsciiJSONResponse({**body, "system_fingerprint": version}, headers=headers)

    async def sse() -> AsyncIterator[str]:
        for c in choices:
            chunk = {**body, "choices": [c]}
            chunk["usage"] = None
            if not req.include_usage:
                del chunk["usage"]
            yield f"data: {_dumps(chunk)}\n\n"
        if req.include_usage:
            yield f"data: {_dumps({**body, 'choices': []})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(sse(), media_type="text/event-stream", headers=headers)
