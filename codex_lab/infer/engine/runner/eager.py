"""Batched prefill: the prompts (or prompt chunks) that arrive together, in ONE forward.

The reference is one forward per request (``Engine._prefill_and_emit``); when a burst of
requests arrives at once (a busy editor, or the load test's streams that finish together),
the last one prefilled waits for all the others, so time to first token grows with the
burst. Here the rows are right-padded to the longest chunk and run as one (B, T) forward
over the paged KV pool; each row's logits are read at its own last real token.

Why the padding is harmless:
- a padding token of row ``b`` sits at a position after the row's last real one, so every
  real query masks it (all attention patterns are causal: key position <= query position);
- its key/value goes to a slot the row does not use yet (its own last block, overwritten
  by its next decode step before that slot is ever attended to) or, past the row's own
  blocks, to a scratch block that no request owns;
- the padding rows' outputs are never read.

The same tokens as the one-by-one path (held by ``tests/test_batched_prefill.py``); logits
agree up to float rounding of a batched matmul.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from codex_lab.infer.generate import decode_step
from codex_lab.infer.engine.scheduler import Request
from codex_lab.nn.kv_cache import PagedKVPool
from codex_lab.nn.model import CodexModel

__all__ = ["decode_next", "prefill_batch", "prefill_one"]


@torch.no_grad()
def prefill_one(model: CodexModel, pool: PagedKVPool, req: Request, n: int, device: torch.device) -> Tensor:
    """Prefill the next ``n`` prompt tokens of ``req`` alone (the reference path); the blocks
    must be owned already. Returns the logits (1, V) of its last prefilled token."""
    start = req.cached
    idx = torch.tensor([req.prompt[start : start + n]], device=device)  # (1, n)
    pos = torch.arange(start, start + n, device=device)[None]  # (1, n)
    tables = torch.tensor([req.blocks], device=device)  # (1, NB)
    return decode_step(model, idx, pos, pool.views(tables))  # (1, V)


@torch.no_grad()
def prefill_batch(model: CodexModel, pool: PagedKVPool, rows: Sequence[tuple[Request, int]], scratch: int,
                  device: torch.device) -> Tensor:
    """Prefill the next ``n`` prompt tokens of each ``(request, n)`` in one forward.

    Each request must already own the blocks for positions ``cached .. cached + n - 1``
    (``scheduler.grow``); ``scratch`` is a pool block no request owns. ``request.cached`` is
    not changed (the caller advances it). Returns the logits (B, V) of each row's last
    prefilled token.
    """
    T = max(n for _, n in rows)
    bs = pool.block_size
    # blocks a row's padded positions reach: ceil((cached + T) / block_size)
    nb = max(-(-(r.cached + T) // bs) for r, _ in rows)
    tables = torch.tensor([r.blocks + [scratch] * (nb - len(r.blocks)) for r, _ in rows], device=device)  # (B, NB)
    # tokens: the chunk, then padding (token 0: any id; its outputs are masked or unread)
    idx = torch.tensor([r.prompt[r.cached : r.cached + n] + [0] * (T - n) for r, n in rows], device=device)  # (B, T)
    start = torch.tensor([r.cached for r, _ in rows], device=device)  # (B,)
    # positions: row b covers start_b .. start_b + T - 1 (padding continues after its chunk)
    pos = start[:, None] + torch.arange(T, device=device)[None, :]  # (B, T)
    last = torch.tensor([n - 1 for _, n in rows], device=device)  # (B,) index of each row's last real token
    logits = model(idx, positions=pos, caches=pool.views(tables), last_index=last).logits  # (B, 1, V)
    return logits[:, 0]  # (B, V)


@torch.no_grad()
def decode_next(model: CodexModel, pool: PagedKVPool, reqs: Sequence[Request], device: torch.device) -> Tensor:
    """One eager cached decode step for ``reqs`` (their last output token each, at position
    ``cached``; the blocks must be owned). Returns logits (B, V)."""
    nb = max(len(r.blocks) for r in reqs)
    # pad each block table to nb with its own first block (padding slots are masked)
    tables = torch.tensor([r.blocks + r.blocks[:1] * (nb - len(r.blocks)) for r in reqs], device=device)  # (B, NB)
    idx = torch.tensor([[r.output[-1]] for r in reqs], device=device)  # (B, 1)
    pos = torch.tensor([[r.cached] for r in reqs], device=device)  # (B, 1)
    return decode_step(model, idx, pos, pool.views(tables))  # (B, V)
