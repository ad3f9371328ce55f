"""The engine's scheduler: one request's state, the finished record, first-come admission
into a paged KV pool, deadlines, and the pool's accounting.

No model code here: :class:`~codex_lab.infer.engine.loop.Engine` runs the forwards (through
:mod:`codex_lab.infer.engine.runner`) and calls these pieces between them; the text a request
streams is :mod:`codex_lab.infer.engine.output`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

import torch

from codex_lab.infer.sampling import SamplingParams
from codex_lab.nn.kv_cache import PagedKVPool

if TYPE_CHECKING:
    from codex_lab.infer.engine.output import IncrementalText

TokenCallback = Callable[[int, str], None]

# why a request ended: the first two are OpenAI's; the others are the engine's own
FINISH_REASONS = ("stop", "length", "deadline", "cancelled", "error")


@dataclass
class Finished:
    """A finished request. Times are ``clock()`` readings in seconds.

    ``finish_reason``: "stop" (end-of-text or a stop string), "length" (max_tokens),
    "deadline" (``deadline_s`` passed), "cancelled", or "error" (serving this request
    raised; ``error`` holds the message and the other requests of the batch go on).
    ``text`` is the decoded output, cut before a stop string; the ``on_token`` deltas of
    the request add up to it (except after an error).
    """

    rid: int
    prompt_tokens: int
    output_ids: list[int]
    text: str
    finish_reason: str
    arrival: float
    first_token_time: float | None
    token_times: list[float]
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        """Time to first token in seconds, queueing included: first_token_time - arrival."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival

    @property
    def tbt(self) -> list[float]:
        """Times between consecutive tokens in seconds (len = tokens - 1)."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


@dataclass(eq=False)
class Request:
    """One request inside the engine: prompt, sampling, its KV blocks and what it produced."""

    rid: int
    prompt: list[int]
    params: SamplingParams
    on_token: TokenCallback | None
    deadline_s: float | None
    arrival: float
    need_blocks: int
    gen: torch.Generator | None = None
    output: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    cached: int = 0  # tokens whose K/V are in the cache
    emitted: str = ""  # text already passed to on_token
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    # with params.logprobs set: one TokenLogprob per sampled token, the end-of-text that ended the
    # request included (so one more than the output then); a list the caller may own
    logprobs: list = field(default_factory=list)
    detok: "IncrementalText | None" = None  # the output's text, kept up to date token by token


def admit(waiting: deque[Request], running: dict[int, Request], max_batch_size: int, pool: PagedKVPool) -> list[Request]:
    """Pop the waiting requests that fit now, first come first served.

    A request fits when a batch slot is free and the pool's free blocks, minus those
    promised to running requests, cover its prompt + max_tokens. Admission stops at the
    first request that does not fit (no overtaking), so a long request is never starved.
    """
    admitted: list[Request] = []
    # reserved = blocks promised to running requests but not yet taken from the pool
    reserved = sum(r.need_blocks - len(r.blocks) for r in running.values())
    while waiting and len(running) + len(admitted) < max_batch_size:
        req = waiting[0]
        if req.need_blocks > pool.n_free - reserved:
            break
        waiting.popleft()
        reserved += req.need_blocks
        admitted.append(req)
    return admitted


def expired(requests: Iterable[Request], now: float) -> list[Request]:
    """The requests whose deadline has passed: now - arrival > deadline_s (seconds)."""
    return [r for r in requests if r.deadline_s is not None and now - r.arrival > r.deadline_s]


def grow(pool: PagedKVPool, req: Request, n_tokens: int) -> None:
    """Make sure ``req`` owns the blocks for its first ``n_tokens`` positions."""
    missing = pool.blocks_for(n_tokens) - len(req.blocks)
    if missing > 0:
        req.blocks.extend(pool.allocate(missing))


def kv_stats(running: list[Request], waiting: int, steps: int, pool: PagedKVPool, usable_blocks: int) -> dict[str, int]:
    """Requests and KV memory of an engine.

    kv_used_*: tokens whose K/V are stored; kv_allocated_*: the blocks owned by running
    requests (stored tokens rounded up to whole blocks); kv_capacity_*: the usable pool
    (``usable_blocks``, without the scratch block).
    """
    bpt = pool.bytes_per_token()
    used = sum(r.cached for r in running)
    alloc = sum(len(r.blocks) for r in running) * pool.block_size
    cap = usable_blocks * pool.block_size
    return {
        "running": len(running), "waiting": waiting, "steps": steps,
        "kv_used_tokens": used, "kv_used_bytes": used * bpt,
        "kv_allocated_tokens": alloc, "kv_allocated_bytes": alloc * bpt,
        "kv_capacity_tokens": cap, "kv_capacity_bytes": cap * bpt, "kv_block_size": pool.block_size,
    }
