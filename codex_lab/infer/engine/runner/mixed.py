"""Prefill inside the compiled decode step: a step's new prompt tokens ride as extra rows.

The engine's step prefills the prompts it admits, then decodes the running requests. With
the compiled step serving, the decode is one graph call (the interpreter lock released for
all of it), but the prefill is an eager forward of ~340 ops (344 top-level ATen calls for
12 tokens, by the profiler). On a server, the thread that
streams tokens to the clients holds the lock between those ops, so the prefill waits for
it again and again: measured on a 2-core CPU at 16 streams (2026-12-02), a 12-token
prefill took 7.1 ms at the median inside the server against 3.7 ms alone, and the steps
that prefilled set TBT's p95.

Here both go through :class:`~codex_lab.infer.engine.runner.compiled.CompiledPagedStep` at once (as
chunked-prefill servers batch prefill and decode tokens, Sarathi-Serve): the decode rows
first, then one row per prompt token, each at its own position over its request's block
table. Every layer writes all rows' keys and values before any row attends, and a row
attends only to slots at or before its own position, so a prompt token sees exactly its
prefix: the same keys, values and logits as a prefill forward, up to the float rounding
of a differently shaped matmul. The step falls back to the engine's separate prefill and
decode when the rows do not fit the compiled shapes (``CompiledPagedStep.can_mix``), and
when the combined call raises (the separate path then finds the request that fails).
Prompts that arrive together and do not all fit wait their turn, a step each.
"""

from __future__ import annotations

from typing import Any

from codex_lab.infer.engine.scheduler import Finished, Request, grow

__all__ = ["mixed_step"]


def mixed_step(engine: Any, rows: list[tuple[Request, int]],
               decoding: list[Request]) -> tuple[list[Finished], list[tuple[Request, int]]] | None:
    """Prefill ``rows`` (request, prompt tokens now) and decode ``decoding`` in one compiled call.

    ``engine``: an :class:`~codex_lab.infer.engine.loop.Engine` (its pool, ``fast_step`` and
    ``_emit`` / ``_emit_rows`` / ``_prefill`` / ``_decode`` / ``_fail``). The prompts go in,
    in order, while their tokens fit the rows the decode rows leave; the others wait for the
    next step (their turn comes first then), which costs them one step of waiting instead of
    holding every stream up for an eager prefill. With no request decoding, nobody waits for a
    token: prompts that do not all fit are prefilled eagerly, together. Returns the requests
    that finished and the rows prefilled, or None when the step cannot run this way (no mixed shape, graphs not
    serving yet, the first prompt alone too long for the rows, too long a table): the
    caller then prefills and decodes separately, and nothing has changed.
    """
    fs = engine.fast_step
    if fs is None or not fs.mixed_rows or not rows:
        return None
    spare, taken = fs.mixed_rows - len(decoding), 0
    for k, (_, n) in enumerate(rows):
        if taken + n > spare:
            # no stream waits for a token (a burst arrived at an idle engine): one batched eager
            # prefill of all of them serves every prompt sooner than a few per step
            rows = rows[:k] if decoding else []
            break
        taken += n
    if not rows:
        return None
    n_rows = len(decoding) + taken
    # blocks the longest table will have once every row's position is covered
    n_blocks = engine.pool.blocks_for(max([r.cached + n for r, n in rows] + [r.cached + 1 for r in decoding]))
    if not fs.can_mix(n_rows, n_blocks):
        return None
    out: list[Finished] = []
    dec: list[Request] = []
    pre: list[tuple[Request, int]] = []
    for r, n in rows:  # each owns the blocks for its positions first (reserved at admission)
        if (d := engine._guarded(r, grow, engine.pool, r, r.cached + n)) is None:
            pre.append((r, n))
        else:
            out.append(d)
    for r in decoding:
        if (d := engine._guarded(r, grow, engine.pool, r, r.cached + 1)) is None:
            dec.append(r)
        else:
            out.append(d)
    if not pre:
        return out + (engine._decode(dec) if dec else []), rows
    tokens = [r.output[-1] for r in dec] + [t for r, n in pre for t in r.prompt[r.cached : r.cached + n]]
    positions = [r.cached for r in dec] + [p for r, n in pre for p in range(r.cached, r.cached + n)]
    tables = [r.blocks for r in dec] + [r.blocks for r, n in pre for _ in range(n)]
    try:
        logits = fs(tokens, positions, tables)  # (rows, V)
    except Exception:  # noqa: BLE001 (the separate path finds the request that fails; K/V writes are idempotent)
        return out + engine._prefill(pre) + (engine._decode(dec) if dec else []), rows
    end = len(dec)
    for r, n in pre:  # a prompt done: its last row's logits give its first token
        end += n
        r.cached += n
        if r.cached == len(r.prompt) and (d := engine._guarded(r, engine._emit, r, logits[end - 1 : end])):
            out.append(d)
    return out + (engine._emit_rows(dec, logits[: len(dec)]) if dec else []), rows
