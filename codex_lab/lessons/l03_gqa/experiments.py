"""Grouped-query attention (lesson 03): KV-cache bytes, MHA -> GQA conversion, uptraining.

With ``n_head`` query heads and ``n_kv_head`` key/value heads, each K/V head serves a group
of ``g = n_head / n_kv_head`` query heads (g = 1: multi-head attention, MHA; g = n_head:
multi-query attention, MQA). The attention kernels in :mod:`codex_lab.nn.model` already take
K/V with fewer heads; this module does the accounting and the conversion:

- :func:`kv_cache_bytes`: the cache size from the formula
  ``2 * layers * kv_heads * head_dim * seq_len * batch * bytes_per_element``, checked
  against the bytes of real cache tensors by :func:`measured_cache_bytes`;
- :func:`mha_to_gqa`: Ainslie et al. 2023 ("GQA: Training Generalized Multi-Query
  Transformer Models from Multi-Head Checkpoints"): each group's K and V projection
  heads are mean-pooled into one head, then the model is briefly trained again
  ("uptrained", :func:`uptrain`);
- :func:`group_size_experiment`: validation loss right after conversion and after
  uptraining, KV bytes per token and decode speed for several group sizes.
"""

from __future__ import annotations

import copy
import time
from typing import Sequence

import torch
from torch import Tensor

from codex_lab.nn.config import ModelConfig
from codex_lab.data.batches import random_batch
from codex_lab.nn.kv_cache import make_dynamic_caches
from codex_lab.nn.model import CodexModel


def kv_cache_bytes(config: ModelConfig, batch: int, seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of the key/value cache of ``batch`` sequences of ``seq_len`` tokens.

    Args:
        config: model shape (layers, KV heads, head width).
        batch: number of sequences held in the cache.
        seq_len: cached tokens per sequence.
        dtype: element type of the cached keys/values (float32: 4 bytes, bfloat16: 2).

    Returns:
        bytes (int); halve the dtype's width to halve it, divide by the group size g to
        go from MHA to GQA.
    """
    if batch < 0 or seq_len < 0:
        raise ValueError(f"batch and seq_len must be >= 0, got batch={batch}, seq_len={seq_len}")
    assert config.n_kv_head is not None
    elem = torch.empty((), dtype=dtype).element_size()
    # bytes = 2 (K and V) * layers * kv_heads * head_dim * seq_len * batch * bytes_per_element
    return 2 * config.n_layer * config.n_kv_head * config.head_dim * seq_len * batch * elem


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    """KV-cache bytes one token adds (one sequence): ``2 * layers * kv_heads * head_dim * bytes``."""
    return kv_cache_bytes(config, 1, 1, dtype)


def kv_saving(group_size: int) -> float:
    """Share of the MHA KV cache that GQA with group size g saves: ``1 - 1/g``."""
    if group_size < 1:
        raise ValueError(f"group size must be >= 1, got {group_size}")
    # saving = 1 - (kv_heads / heads) = 1 - 1/g
    return 1.0 - 1.0 / group_size


@torch.no_grad()
def measured_cache_bytes(model: CodexModel, batch: int, seq_len: int, *, seed: int = 0) -> int:
    """Run one cached forward over random (batch, seq_len) tokens; return the bytes the
    :class:`~codex_lab.nn.kv_cache.DynamicKVCache` objects then hold (all layers)."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, model.cfg.vocab_size, (batch, seq_len), generator=gen).to(device)  # (B, T)
    caches = make_dynamic_caches(model.cfg.n_layer)
    model.eval()
    model(idx, caches=caches, last_only=True)
    return sum(c.nbytes() for c in caches)


def mean_pool_heads(w: Tensor, n_heads: int, n_groups: int) -> Tensor:
    """Mean-pool the output rows of a projection, head by head, into ``n_groups`` heads.

    Args:
        w: weight (n_heads * head_dim, d_in) or bias (n_heads * head_dim,) of k_proj / v_proj.
        n_heads: heads the rows hold now; n_groups: heads wanted (must divide n_heads).

    Returns:
        (n_groups * head_dim, d_in) or (n_groups * head_dim,): head j is the mean of heads
        j*g .. j*g + g - 1 (g = n_heads / n_groups), matching the kernels' grouping, where
        query head h reads K/V head h // g.
    """
    if n_groups < 1 or n_heads % n_groups:
        raise ValueError(f"n_groups={n_groups} must divide n_heads={n_heads}")
    g = n_heads // n_groups
    head_dim = w.shape[0] // n_heads
    rest = w.shape[1:]
    # W'_j = (1/g) * sum_{i < g} W_{j*g + i}
    return w.reshape(n_groups, g, head_dim, *rest).mean(dim=1).reshape(n_groups * head_dim, *rest)


@torch.no_grad()
def mha_to_gqa(model: CodexModel, n_kv_head: int) -> CodexModel:
    """A new model with ``n_kv_head`` K/V heads, built by mean-pooling each group's K/V heads.

    Works from MHA or from a GQA model with more K/V heads (``n_kv_head`` must divide the
    current count). Queries, output projection, FFN, norms and embeddings are copied
    unchanged; RoPE is linear and the same for every head, so pooling the projections
    equals pooling the rotated keys. The input model is not modified.
    """
    cfg = model.cfg
    assert cfg.n_kv_head is not None
    if n_kv_head < 1 or cfg.n_kv_head % n_kv_head:
        raise ValueError(
            f"n_kv_head={n_kv_head} must divide the model's current n_kv_head={cfg.n_kv_head} "
            f"(n_head={cfg.n_head}); choose one of "
            f"{[d for d in range(1, cfg.n_kv_head + 1) if cfg.n_kv_head % d == 0]}"
        )
    new_cfg = ModelConfig.from_dict({**copy.deepcopy(cfg.to_dict()), "n_kv_head": n_kv_head})
    ref = next(model.parameters())
    new = CodexModel(new_cfg).to(device=ref.device, dtype=ref.dtype)
    src = model.state_dict()
    dst = new.state_dict()
    for name, t in dst.items():
        if ".attn.k_proj." in name or ".attn.v_proj." in name:
            t.copy_(mean_pool_heads(src[name], cfg.n_kv_head, n_kv_head))
        else:
            t.copy_(src[name])
    new.train(model.training)
    return new


def uptrain(
    model: CodexModel,
    tokens: Tensor,
    *,
    steps: int,
    batch_size: int = 8,
    seq_len: int = 128,
    lr: float = 1e-3,
    warmup: int = 0,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` in place on random windows of ``tokens``; return the training losses.

    AdamW with linear warm-up to ``lr`` over ``warmup`` steps, then constant; gradient norm
    clipped at 1. This is the short "uptraining" after conversion (Ainslie et al. used
    about 5% of the pre-training steps) and also serves for a short pre-training.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    losses: list[float] = []
    for step in range(steps):
        for group in opt.param_groups:
            # lr_t = lr * min(1, (t + 1) / warmup)
            group["lr"] = lr * min(1.0, (step + 1) / warmup) if warmup else lr
        x, y = random_batch(tokens, batch_size, seq_len, gen)  # (B, T), (B, T)
        out = model(x.to(device), y.to(device))
        assert out.loss is not None
        opt.zero_grad(set_to_none=True)
        (out.loss + out.aux_loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(out.loss.detach()))
    model.eval()
    return losses


@torch.no_grad()
def val_loss(model: CodexModel, batches: Sequence[tuple[Tensor, Tensor]]) -> float:
    """Mean next-token cross-entropy (nats/token) over fixed validation batches."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    losses = [float(model(x.to(device), y.to(device)).loss) for x, y in batches]  # type: ignore[arg-type]
    model.train(was)
    return sum(losses) / len(losses)


@torch.no_grad()
def decode_tokens_per_s(model: CodexModel, *, batch: int = 8, prompt_len: int = 128, new_tokens: int = 32, repeats: int = 3) -> float:
    """Greedy cached decoding speed in generated tokens per second (all sequences counted).

    Prefills ``prompt_len`` random tokens into a fresh dynamic cache, then decodes
    ``new_tokens`` steps one token at a time; the median of ``repeats`` timed runs (after
    one warm-up) is reported. Prefill time is excluded.
    """
    device = next(model.parameters()).device
    model.eval()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.cfg.vocab_size, (batch, prompt_len), generator=gen).to(device)  # (B, T)

    def run() -> float:
        caches = make_dynamic_caches(model.cfg.n_layer)
        nxt = model(prompt, caches=caches, last_only=True).logits.argmax(-1)  # (B, 1)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(new_tokens):
            nxt = model(nxt, caches=caches, last_only=True).logits.argmax(-1)  # (B, 1)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    run()
    times = sorted(run() for _ in range(repeats))
    # tokens/s = batch * new_tokens / median decode time
    return batch * new_tokens / times[len(times) // 2]


def group_size_experiment(
    base: CodexModel,
    train_tokens: Tensor,
    val_batches: Sequence[tuple[Tensor, Tensor]],
    *,
    group_sizes: Sequence[int] = (1, 2, 4, 8),
    steps: int = 50,
    batch_size: int = 8,
    seq_len: int = 128,
    lr: float = 1e-3,
    decode_batch: int = 8,
    decode_prompt: int = 128,
    decode_tokens: int = 32,
    seed: int = 0,
) -> list[dict[str, float]]:
    """Convert ``base`` (MHA) to each group size, uptrain each the same number of steps.

    g = 1 is the unconverted model trained for the same extra steps: the control that
    separates "extra training" from "recovery after conversion".

    Returns:
        one record per g: ``g``, ``n_kv_head``, ``val_loss_converted`` (nats/token, right
        after mean-pooling), ``val_loss_uptrained`` (after ``steps`` steps),
        ``kv_bytes_per_token`` (of the model's dtype), ``kv_saving`` (1 - 1/g, measured from
        the bytes), ``decode_tok_s`` (cached greedy decoding, tokens/s).
    """
    assert base.cfg.n_kv_head is not None
    if base.cfg.n_kv_head != base.cfg.n_head:
        raise ValueError("the base model must be MHA (n_kv_head == n_head) so every g starts from the same point")
    bad = [g for g in group_sizes if g < 1 or base.cfg.n_head % g]
    if bad:
        raise ValueError(f"group sizes {bad} do not divide n_head={base.cfg.n_head}; build a base with more heads")
    dtype = next(base.parameters()).dtype
    mha_bytes = kv_bytes_per_token(base.cfg, dtype)
    rows = []
    for g in group_sizes:
        model = mha_to_gqa(base, base.cfg.n_head // g)
        converted = val_loss(model, val_batches)
        uptrain(model, train_tokens, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, seed=seed)
        per_tok = kv_bytes_per_token(model.cfg, dtype)
        rows.append({
            "g": g,
            "n_kv_head": model.cfg.n_kv_head,
            "val_loss_converted": converted,
            "val_loss_uptrained": val_loss(model, val_batches),
            "kv_bytes_per_token": per_tok,
            "kv_saving": 1.0 - per_tok / mha_bytes,
            "decode_tok_s": decode_tokens_per_s(model, batch=decode_batch, prompt_len=decode_prompt, new_tokens=decode_tokens),
        })
    return rows
