"""An inference engine with iteration-level continuous batching (Orca) and paged KV memory.

Requests join and leave at every step: ``step()`` admits waiting requests that fit,
prefills them (one batched forward over their prompts gives each its first token; with
``max_prefill_tokens`` long prompts are prefilled in chunks over several steps), then
runs ONE batched decode forward for every request that already has a token. A finished
request frees its KV blocks at once, so the next waiting request can start in the next
step instead of waiting for the whole batch (static batching) to drain.

KV memory is a :class:`~codex_lab.nn.kv_cache.PagedKVPool`: fixed-size blocks, a block table
per request (PagedAttention). A request is admitted only when the blocks for its prompt
plus ``max_tokens`` can be reserved, so a running request never runs out of memory and a
request that does not fit yet simply waits. Blocks are taken one at a time as the
sequence grows; ``stats()`` reports both what is stored and what is allocated.

Threads: ``submit`` and ``cancel`` may be called from any thread (a lock-protected inbox);
``step`` runs in the engine's thread, which also calls the ``on_token`` callbacks.

Streaming: ``on_token(token_id, text_delta)`` is called once per output token; a delta is
"" while a character's bytes are incomplete or while the text could still be the start of
a stop string. The deltas of a request add up to its ``Finished.text``; when the request
ends at end-of-text with such text still held back, one extra call
``on_token(eot_id, rest)`` delivers it (never for an empty rest). A request that ends by
deadline or cancel gets no further call.

Failures stay with their request: if prefilling, decoding or sampling one request raises,
that request alone finishes with ``finish_reason="error"`` (the message in
``Finished.error``) and the rest of the batch goes on. A batched decode forward that
raises is retried one request at a time, so only the request that fails alone is failed.
Temperatures below :data:`~codex_lab.infer.sampling.GREEDY_BELOW` decode greedily.
Timing comes from the injectable ``clock`` (seconds), so tests can use a fake one.
"""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from collections import deque
from typing import Any, Callable

import torch

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.infer.engine.runner.mixed import mixed_step
from codex_lab.infer.engine.runner.compiled import CompiledPagedStep
from codex_lab.infer.engine.runner.eager import decode_next, prefill_batch, prefill_one
from codex_lab.infer.sampling import GREEDY_BELOW, SamplingParams, batched_probs, sample_next, token_logprobs
from codex_lab.infer.engine.scheduler import Finished, Request, TokenCallback, admit, expired, grow, kv_stats
from codex_lab.infer.engine.output import IncrementalText, cut_at_stop, streamable
from codex_lab.nn.kv_cache import PagedKVPool
from codex_lab.nn.model import CodexModel

__all__ = ["Engine"]


class Engine:
    """Continuous-batching engine over a :class:`~codex_lab.nn.model.CodexModel`.

    Args:
        model: the model (put in eval mode; its device and dtype are used).
        tokenizer: decodes text deltas; its end-of-text id ends a request with "stop".
        max_batch_size: most requests running at once.
        max_kv_tokens: KV pool capacity in tokens (default max_batch_size * max_seq_len).
        block_size: tokens per KV block.
        clock: time source in seconds (default ``time.perf_counter``).
        max_prefill_tokens: chunked prefill: at most this many prompt tokens are prefilled
            per step (a long prompt takes several steps), which caps how long the running
            requests' next token is held up; None = whole prompts at once.
        compile: decode with :class:`~codex_lab.infer.engine.runner.compiled.CompiledPagedStep` (the batch
            padded to ``max_batch_size``, block tables to buckets 1.5x apart, one graph per
            bucket compiled on first use or by ``fast_step.warmup()``); the same tokens as the
            eager step. Prefill is eager unless ``step_options`` has ``mixed_rows`` (``mixed.py``).
        compile_backend, step_options: ``torch.compile``'s backend ("eager" only traces: tests) and
            more keyword arguments (``min_bucket_tokens``, ``mixed_rows``) of that step.
    """

    def __init__(
        self,
        model: CodexModel,
        tokenizer: CodeTokenizer,
        *,
        max_batch_size: int = 8,
        max_kv_tokens: int | None = None,
        block_size: int = 16,
        clock: Callable[[], float] = time.perf_counter,
        max_prefill_tokens: int | None = None,
        compile: bool = False,
        compile_backend: str = "inductor",
        step_options: dict[str, Any] | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_prefill_tokens is not None and max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1 or None, got {max_prefill_tokens}")
        self.max_prefill_tokens = max_prefill_tokens
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.cfg = model.cfg
        self.clock = clock
        self.max_batch_size = max_batch_size
        p = next(model.parameters())
        self.device = p.device
        assert self.cfg.n_kv_head is not None
        cap = max_batch_size * self.cfg.max_seq_len if max_kv_tokens is None else max_kv_tokens
        if cap < block_size:
            raise ValueError(f"max_kv_tokens={cap} is smaller than one block of {block_size} tokens")
        self.usable_blocks = cap // block_size  # plus one scratch block
        self.pool = PagedKVPool(self.cfg.n_layer, self.cfg.n_kv_head, self.cfg.head_dim, self.usable_blocks + 1,
                                block_size, device=self.device, dtype=p.dtype)
        self.fast_step = CompiledPagedStep(model, self.pool, max_batch_size, backend=compile_backend,
                                           **(step_options or {})) if compile else None
        # one block no request owns: padding rows of the compiled step and of batched prefill write there
        self.scratch = self.fast_step.scratch if self.fast_step else self.pool.allocate(1)[0]
        self.batch_prefill = True  # False: one prefill forward per request (the reference path)
        self.eot_id = tokenizer.eot_id
        self._rids = itertools.count()
        self._inbox_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._inbox: list[Request] = []
        self._cancels: list[int] = []
        self._done: list[Finished] = []  # finished outside step() (cancel while idle)
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}
        self.steps = 0
        self.incremental_text = True  # False: decode each request's whole output every token (reference)
        # which request ran in which step: (step, prefilled rids, decoded rids)
        self.timeline: deque[tuple[int, list[int], list[int]]] = deque(maxlen=100_000)

    # ---------------------------------------------------------------- any thread
    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        *,
        on_token: TokenCallback | None = None,
        deadline_s: float | None = None,
        logprobs: list | None = None,
    ) -> int:
        """Queue a request; return its id. ``deadline_s``: seconds after arrival at which it
        is stopped with "deadline". ``logprobs``: with ``params.logprobs`` set, the list that
        receives one :class:`~codex_lab.infer.sampling.TokenLogprob` per sampled token (an
        end-of-text that ends the request included), each appended before that token's
        ``on_token`` call. Raises ValueError for an empty prompt,
        unknown token ids, or prompt + max_tokens past max_seq_len or past the whole KV pool."""
        params = params or SamplingParams()
        params.validate()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("the prompt is empty; give at least one token id")
        bad = [t for t in prompt if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside 0..{self.cfg.vocab_size - 1}")
        total = len(prompt) + params.max_tokens
        if total > self.cfg.max_seq_len:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) = {total} is past the "
                f"model's max_seq_len={self.cfg.max_seq_len}; shorten the prompt or lower max_tokens"
            )
        need = self.pool.blocks_for(total)
        if need > self.usable_blocks:
            raise ValueError(
                f"the request needs {need} KV blocks but the pool has {self.usable_blocks}; "
                "raise max_kv_tokens or lower max_tokens"
            )
        if deadline_s is not None and deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0 seconds, got {deadline_s}")
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        with self._inbox_lock:
            rid = next(self._rids)
            self._inbox.append(Request(rid, prompt, params, on_token, deadline_s, self.clock(), need, gen,
                                       logprobs=logprobs if logprobs is not None else []))
        return rid

    def cancel(self, rid: int) -> None:
        """Stop request ``rid``; it finishes with "cancelled" and its blocks return to the pool
        at once when the engine is idle, else at the start of the next step. Unknown or
        already finished ids are ignored."""
        with self._inbox_lock:
            self._cancels.append(rid)
        if self._state_lock.acquire(blocking=False):  # engine idle: apply now
            try:
                self._done.extend(self._drain_inbox())
            finally:
                self._state_lock.release()

    def has_work(self) -> bool:
        """True while any request is queued, running, or finished but not yet returned."""
        with self._inbox_lock:
            pending = bool(self._inbox or self._cancels)
        return pending or bool(self.waiting or self.running or self._done)

    def stats(self) -> dict[str, int]:
        """Requests and KV memory right now (:func:`~codex_lab.infer.engine.scheduler.kv_stats`)."""
        with self._inbox_lock:
            queued = len(self._inbox)
        running: list[Request] = []
        for _ in range(100):  # another thread may call this while step() mutates the dict
            try:
                running = list(self.running.values())
                break
            except RuntimeError:
                continue
        return kv_stats(running, len(self.waiting) + queued, self.steps, self.pool, self.usable_blocks)

    # ---------------------------------------------------------------- engine thread
    def run_until_done(self) -> list[Finished]:
        """Step until no work is left; every finished request, in finishing order."""
        out: list[Finished] = []
        while self.has_work():
            out.extend(self.step())
        return out

    @torch.no_grad()
    def step(self) -> list[Finished]:
        """One iteration: admit, prefill the admitted, one decode step for the others (with
        ``mixed_rows``, both in one compiled call). A request whose prefill, decode or sampling
        raises finishes with "error"; the others are unaffected."""
        with self._state_lock:
            finished, self._done = self._done, []
            finished.extend(self._drain_inbox())
            late = expired([*self.waiting, *self.running.values()], self.clock())
            finished.extend(self._finish(r, "deadline") for r in late)
            decoding = [r for r in self.running.values() if r.output]
            for req in admit(self.waiting, self.running, self.max_batch_size, self.pool):
                self.running[req.rid] = req
            budget = self.max_prefill_tokens or sum(len(r.prompt) for r in self.running.values())
            rows: list[tuple[Request, int]] = []  # (request, prompt tokens to prefill now)
            for req in [r for r in self.running.values() if r.cached < len(r.prompt)]:
                if budget <= 0:
                    break
                rows.append((req, min(len(req.prompt) - req.cached, budget)))
                budget -= rows[-1][1]
            mixed = mixed_step(self, rows, decoding) if rows else None  # one compiled call: (finished, rows it took)
            if mixed is not None:
                finished, rows = finished + mixed[0], mixed[1]
            else:
                finished.extend(self._prefill(rows) + (self._decode(decoding) if decoding else []))
            prefilled = [r.rid for r, _ in rows]
            self.timeline.append((self.steps, prefilled, [r.rid for r in decoding]))
            self.steps += 1
            return finished

    # ---------------------------------------------------------------- internals
    def _drain_inbox(self) -> list[Finished]:
        with self._inbox_lock:
            new, self._inbox = self._inbox, []
            cancels, self._cancels = self._cancels, []
        self.waiting.extend(new)
        out = []
        for rid in cancels:
            if rid in self.running:
                out.append(self._finish(self.running[rid], "cancelled"))
            else:
                req = next((r for r in self.waiting if r.rid == rid), None)
                if req is not None:
                    out.append(self._finish(req, "cancelled"))
        return out

    def _guarded(self, req: Request, fn: Callable[..., Finished | None], *args: Any) -> Finished | None:
        """``fn(*args)``, or finish ``req`` with "error" if it raises (the batch goes on)."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 (any failure of one request ends that request only)
            return self._fail(req, exc)

    def _fail(self, req: Request, exc: BaseException) -> Finished:
        warnings.warn(f"request {req.rid} failed: {type(exc).__name__}: {exc}; the other requests go on")
        return self._finish(req, "error", text="", error=f"{type(exc).__name__}: {exc}")

    def _prefill(self, rows: list[tuple[Request, int]]) -> list[Finished]:
        """Prefill ``rows`` (request, n tokens): one forward for all (``prefill_batch``), or one
        per request when ``batch_prefill`` is False (the reference) or the batch raises."""
        serial = lambda rs: [d for r, n in rs if (d := self._guarded(r, self._prefill_and_emit, r, n))]  # noqa: E731
        if not (self.batch_prefill and len(rows) > 1):
            return serial(rows)
        grown = [(r, n, self._guarded(r, grow, self.pool, r, r.cached + n)) for r, n in rows]  # d: failed to grow
        out, ok = [d for *_, d in grown if d], [(r, n) for r, n, d in grown if d is None]
        try:
            logits = prefill_batch(self.model, self.pool, ok, self.scratch, self.device)  # (B, V)
        except Exception:  # noqa: BLE001 (one by one finds the request that fails on its own)
            return out + serial(ok)
        for i, (r, n) in enumerate(ok):
            r.cached += n
            if r.cached == len(r.prompt) and (d := self._guarded(r, self._emit, r, logits[i : i + 1])):
                out.append(d)
        return out

    def _prefill_and_emit(self, req: Request, n: int) -> Finished | None:
        """Prefill the next ``n`` prompt tokens of ``req`` alone; when the prompt is done, its
        last logits give the first output token."""
        grow(self.pool, req, req.cached + n)
        logits = prefill_one(self.model, self.pool, req, n, self.device)  # (1, V)
        req.cached += n
        return self._emit(req, logits) if req.cached == len(req.prompt) else None

    def _forward(self, reqs: list[Request]) -> torch.Tensor:
        """One cached decode step for ``reqs`` (their last token each); logits (B, V)."""
        if self.fast_step is not None:  # fixed shapes, compiled once per bucket
            return self.fast_step([r.output[-1] for r in reqs], [r.cached for r in reqs], [r.blocks for r in reqs])
        return decode_next(self.model, self.pool, reqs, self.device)  # (B, V)

    def _decode(self, reqs: list[Request]) -> list[Finished]:
        out: list[Finished] = []
        ok: list[Request] = []
        for r in reqs:
            try:
                grow(self.pool, r, r.cached + 1)
                ok.append(r)
            except Exception as exc:  # noqa: BLE001
                out.append(self._fail(r, exc))
        if not ok:
            return out
        try:
            logits = self._forward(ok)  # (B, V)
        except Exception:  # noqa: BLE001 (find the request that fails on its own; K/V writes are idempotent)
            rows = []
            for r in ok:
                try:
                    rows.append((r, self._forward([r])))  # (1, V)
                except Exception as exc:  # noqa: BLE001
                    out.append(self._fail(r, exc))
            if not rows:
                return out
            ok, logits = [r for r, _ in rows], torch.cat([lg for _, lg in rows])  # (B', V)
        return out + self._emit_rows(ok, logits)

    def _emit_rows(self, ok: list[Request], logits: torch.Tensor) -> list[Finished]:
        """Each decoded request's next token from its row of ``logits`` (B, V); the finished."""
        out: list[Finished] = []
        greedy = logits.argmax(dim=-1).tolist()  # (B,)
        # rows that sample (and have no penalty to apply first): one batched distribution
        batch = [i for i, r in enumerate(ok) if r.params.temperature >= GREEDY_BELOW and not r.params.penalized]
        probs: dict[int, torch.Tensor] = {}
        if len(batch) > 1:
            ps = [ok[i].params for i in batch]
            rows = batched_probs(logits[batch], [p.temperature for p in ps], [p.top_k for p in ps],
                                 [p.top_p for p in ps])  # (b, V)
            probs = {i: rows[j : j + 1] for j, i in enumerate(batch)}
        for i, r in enumerate(ok):
            r.cached += 1
            extra = (probs[i],) if i in probs else ()  # overrides of _emit (tests) may take three arguments
            done = self._guarded(r, self._emit, r, logits[i : i + 1], greedy[i], *extra)
            if done:
                out.append(done)
        return out

    def _emit(self, req: Request, logits: torch.Tensor, greedy: int | None = None,
              probs: torch.Tensor | None = None) -> Finished | None:
        """Pick the next token of ``req`` from its logits (1, V), stream it, maybe finish it.
        ``probs`` (1, V): its sampling distribution when the step computed it for the batch."""
        raw = logits
        if req.params.penalized:  # presence / frequency penalties over the output so far
            logits, greedy = req.params.penalize(logits, req.output), None
        if req.params.temperature < GREEDY_BELOW:  # greedy (tiny temperatures too: 1/T would overflow)
            tok = greedy if greedy is not None else int(logits.argmax(dim=-1).item())
        elif probs is not None:  # the batched distribution, sampled with this request's own generator
            tok = int(torch.multinomial(probs if req.gen is None or req.gen.device == probs.device else probs.cpu(),
                                        1, generator=req.gen).item())
        else:
            p = req.params
            tok = int(sample_next(logits, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, generator=req.gen).item())
        now = self.clock()
        if req.params.logprobs is not None:  # the model's own distribution (raw logits); a final eot too
            req.logprobs.append(token_logprobs(raw, tok, req.params.logprobs))
        if tok == self.eot_id and not req.params.ignore_eos:
            return self._finish(req, "stop", notify_tok=tok)
        req.output.append(tok)
        req.token_times.append(now)
        if req.first_token_time is None:
            req.first_token_time = now
        text, cut = self._text(req)
        if cut or len(req.output) >= req.params.max_tokens:
            return self._finish(req, "stop" if cut else "length", notify_tok=tok, text=text)
        delta = streamable(text, req.params.stop)[len(req.emitted):]
        if not self._notify(req, tok, delta):
            return self._finish(req, "cancelled", error="on_token raised")
        return None

    def _text(self, req: Request) -> tuple[str, bool]:
        """Decoded output, cut before the first stop string; and whether one was found.

        The output is decoded incrementally (:class:`~codex_lab.infer.engine.output.IncrementalText`:
        the tail since the last complete character, not the whole output every token);
        ``incremental_text = False`` decodes the whole output (the reference path, same text)."""
        if not self.incremental_text:
            return cut_at_stop(self.tokenizer.decode(req.output), req.params.stop)
        if req.detok is None:
            req.detok = IncrementalText(self.tokenizer.decode)
        return cut_at_stop(req.detok.text(req.output), req.params.stop)

    def _notify(self, req: Request, tok: int, delta: str) -> bool:
        req.emitted += delta
        if req.on_token is None:
            return True
        try:
            req.on_token(tok, delta)
        except Exception as exc:  # a broken consumer (e.g. a closed connection) ends its request only
            warnings.warn(f"on_token of request {req.rid} raised {type(exc).__name__}: {exc}; cancelling it")
            return False
        return True

    def _finish(self, req: Request, reason: str, *, notify_tok: int | None = None, text: str | None = None,
                error: str | None = None) -> Finished:
        if text is None:
            text = self._text(req)[0] if req.output else ""
        if notify_tok is not None and reason not in ("cancelled", "error"):
            rest = text[len(req.emitted):] if text.startswith(req.emitted) else ""
            if notify_tok != self.eot_id or rest:  # end-of-text only speaks when text was held back
                self._notify(req, notify_tok, rest)
        self.running.pop(req.rid, None)
        if req in self.waiting:
            self.waiting.remove(req)
        if req.blocks:
            blocks, req.blocks = req.blocks, []
            self.pool.release(blocks)
        return Finished(req.rid, len(req.prompt), list(req.output), text, reason, req.arrival,
                        req.first_token_time, list(req.token_times), error)
