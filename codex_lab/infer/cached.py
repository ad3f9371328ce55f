"""Generation with a KV cache: prefill the whole prompt once, then one token per forward.

The plain generator (:func:`codex_lab.infer.generate.generate_ids`) re-runs the whole context for
every new token: O(T) work per token on top of a growing prompt. With a cache, the prompt
is run once (prefill: all T tokens in parallel, compute-bound) and each new token is one
forward of length 1 (decode: reads every cached key/value, memory-bound). Tests hold both
generators to the same tokens.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from codex_lab.infer.generate import CACHE_KINDS, decode_step, make_caches  # noqa: F401
from codex_lab.nn.model import CodexModel
from codex_lab.infer.sampling import sample_next

def compiled_forward(model: CodexModel) -> Callable[..., object]:
    """``torch.compile`` of the model's forward (opt-in; first call compiles for seconds)."""
    return torch.compile(model, dynamic=True)


@torch.no_grad()
def generate_batch_cached(
    model: CodexModel,
    prompts: Tensor,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    cache: str = "static",
    forward: Callable[..., object] | None = None,
) -> Tensor:
    """New tokens (B, max_new_tokens) after equal-length ``prompts`` (B, T), with a KV cache.

    No early stop: every row gets ``max_new_tokens`` tokens (static batching).
    ``forward`` replaces ``model`` for the forward passes (e.g. :func:`compiled_forward`).
    """
    if prompts.dim() != 2 or prompts.shape[1] == 0:
        raise ValueError(f"prompts must be (B, T) with T >= 1, got shape {tuple(prompts.shape)}")
    B, T = prompts.shape
    total = T + max_new_tokens
    if total > model.cfg.max_seq_len:
        raise ValueError(f"prompt {T} + {max_new_tokens} new tokens is past max_seq_len={model.cfg.max_seq_len}")
    fwd = model if forward is None else forward
    caches = make_caches(model, B, total, cache)
    dev = prompts.device
    pos = torch.arange(T, device=dev).expand(B, T)  # (B, T)
    logits = fwd(prompts, positions=pos, caches=caches, last_only=True).logits[:, -1]  # (B, V)
    out = torch.empty(B, max_new_tokens, dtype=torch.long, device=dev)  # (B, N)
    for i in range(max_new_tokens):
        nxt = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)  # (B,)
        out[:, i] = nxt
        if i + 1 == max_new_tokens:
            break
        p = torch.full((B, 1), T + i, device=dev)  # (B, 1) position of the token fed now
        logits = fwd(nxt[:, None], positions=p, caches=caches, last_only=True).logits[:, -1]  # (B, V)
    return out


@torch.no_grad()
def generate_ids_cached(
    model: CodexModel,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_id: int | None = None,
    cache: str = "static",
) -> tuple[list[int], str]:
    """Same contract as :func:`codex_lab.infer.generate.generate_ids`, with a KV cache.

    Returns the new token ids and the finish reason ("stop" at ``eos_id``, else "length").
    Unlike the plain generator it does not crop: prompt + max_new_tokens must fit max_seq_len.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not prompt_ids:
        raise ValueError("the prompt is empty; give at least one token")
    if max_new_tokens == 0:
        return [], "length"
    dev = next(model.parameters()).device
    T = len(prompt_ids)
    total = T + max_new_tokens
    if total > model.cfg.max_seq_len:
        raise ValueError(f"prompt {T} + {max_new_tokens} new tokens is past max_seq_len={model.cfg.max_seq_len}")
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    caches = make_caches(model, 1, total, cache)
    idx = torch.tensor([list(prompt_ids)], dtype=torch.long, device=dev)  # (1, T)
    logits = model(idx, positions=torch.arange(T, device=dev)[None], caches=caches, last_only=True).logits[:, -1]  # (1, V)
    out: list[int] = []
    for i in range(max_new_tokens):
        tok = int(sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=gen).item())
        if eos_id is not None and tok == eos_id:
            return out, "stop"
        out.append(tok)
        if i + 1 == max_new_tokens:
            break
        x = torch.tensor([[tok]], device=dev)  # (1, 1)
        logits = model(x, positions=torch.tensor([[T + i]], device=dev), caches=caches, last_only=True).logits[:, -1]  # (1, V)
    return out, "length"
