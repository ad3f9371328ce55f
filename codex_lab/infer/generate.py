"""Plain text generation: the whole context is re-run for every new token (no cache).

Obviously correct and slow on purpose: lesson 06 builds the fast path (KV cache,
batching, speculative decoding) and tests it token-for-token against this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor


from codex_lab.nn.kv_cache import DynamicKVCache, make_static_caches
from codex_lab.nn.model import CodexModel
from codex_lab.infer.sampling import sample_next
from codex_lab.data.tokenizer import CodeTokenizer


CACHE_KINDS = ("static", "dynamic")


def make_caches(model: CodexModel, batch_size: int, max_len: int, kind: str = "static") -> list:
    """Per-layer KV caches of ``kind`` for ``batch_size`` rows of up to ``max_len`` tokens.

    "static": preallocated (rolling buffers for window layers), the fast path;
    "dynamic": grow by concatenation, the reference.
    """
    if kind == "static":
        p = next(model.parameters())
        return make_static_caches(model.cfg, batch_size, max_len, device=p.device, dtype=p.dtype)
    if kind == "dynamic":
        return [DynamicKVCache() for _ in range(model.cfg.n_layer)]
    raise ValueError(f"cache kind {kind!r}; choose one of {CACHE_KINDS}")


def decode_step(
    model: Callable[..., Any], tokens: Tensor, positions: Tensor, caches: Sequence[Any]
) -> Tensor:
    """One cached forward: feed ``tokens`` (B, T) at ``positions`` (B, T), append their
    keys/values to ``caches``, return the logits of the last position (B, V).

    Prefill is a decode step with the whole prompt (T = prompt length); each later step
    feeds one token (T = 1). ``model`` may be a compiled forward of the model.
    """
    return model(tokens, positions=positions, caches=caches, last_only=True).logits[:, -1]  # (B, V)


@dataclass
class Generation:
    """A finished generation: the new text and ids, and why it stopped
    (``"stop"``: end-of-text or a stop string; ``"length"``: max_new_tokens reached)."""

    text: str
    ids: list[int]
    finish_reason: str


@torch.no_grad()
def generate_ids(
    model: CodexModel,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_id: int | None = None,
) -> tuple[list[int], str]:
    """New token ids after ``prompt_ids`` (without cache) and the finish reason.

    The context is cropped to the model's last ``max_seq_len`` tokens when it grows past it.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not prompt_ids:
        raise ValueError("the prompt is empty; give at least one token")
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    idx = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)  # (1, T)
    out: list[int] = []
    for _ in range(max_new_tokens):
        ctx = idx[:, -model.cfg.max_seq_len :]  # (1, <= L)
        logits = model(ctx, last_only=True).logits[:, -1, :]  # (1, V)
        nxt = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=gen)  # (1,)
        tok = int(nxt.item())
        if eos_id is not None and tok == eos_id:
            return out, "stop"
        out.append(tok)
        idx = torch.cat([idx, nxt.view(1, 1)], dim=1)  # (1, T + 1)
    return out, "length"


def generate(
    model: CodexModel,
    tokenizer: CodeTokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
) -> Generation:
    """Continue ``prompt``; greedy when temperature is 0, seeded sampling otherwise.

    Generation ends at end-of-text, at the first of the ``stop`` strings (which is cut
    from the text), or after ``max_new_tokens``.
    """
    was_training = model.training
    model.eval()
    try:
        ids, reason = generate_ids(
            model, tokenizer.encode(prompt), max_new_tokens=max_new_tokens, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed, eos_id=tokenizer.eot_id,
        )
    finally:
        model.train(was_training)
    text = tokenizer.decode(ids)
    cut = min((text.find(s) for s in stop if s and s in text), default=-1)
    if cut >= 0:
        text, reason = text[:cut], "stop"
    return Generation(text=text, ids=ids, finish_reason=reason)


