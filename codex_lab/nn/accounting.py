"""Counting what a model costs: KV-cache bytes (lesson 03) and parameters per token (lesson 04).

- :func:`kv_cache_bytes`: the cache size from the formula
  ``2 * layers * kv_heads * head_dim * seq_len * batch * bytes_per_element``, checked against
  the bytes of real cache tensors by :func:`measured_cache_bytes`;
- :func:`ffn_counts` / :func:`active_params`: the parameters one token uses in a model with
  mixture-of-experts layers (the experts a token skips do not count);
- :func:`attention_density`: the share of causal query-key pairs the layers' patterns attend to.
"""

from __future__ import annotations

import torch

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.kv_cache import make_dynamic_caches
from codex_lab.nn.model import CodexModel
from codex_lab.nn.moe import ffn_param_counts
from codex_lab.nn.patterns import parse_pattern


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
    """Prefill random (batch, seq_len) tokens into fresh caches; return the bytes the
    :class:`~codex_lab.nn.kv_cache.DynamicKVCache` objects then hold (all layers).

    The prefill is the model's own cached forward (this layer sits below ``infer``, whose
    :func:`~codex_lab.infer.generate.decode_step` is the same call); only the caches are read.
    """
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, model.cfg.vocab_size, (batch, seq_len), generator=gen).to(device)  # (B, T)
    caches = make_dynamic_caches(model.cfg.n_layer)
    model.eval()
    model(idx, caches=caches, last_only=True)
    return sum(c.nbytes() for c in caches)


def ffn_counts(cfg: ModelConfig) -> tuple[int, int]:
    """(active, total) feed-forward parameters per token, summed over layers."""
    active = total = 0
    for i in range(cfg.n_layer):
        if i in cfg.moe_layers:
            c = ffn_param_counts(cfg)
            active, total = active + c["active"], total + c["total"]
        else:
            assert cfg.ffn_hidden is not None
            # SwiGLU: gate, up and down projections, d x hidden each
            n = 3 * cfg.d_model * cfg.ffn_hidden
            active, total = active + n, total + n
    return active, total


def active_params(model: CodexModel) -> int:
    """Parameters one token uses (tied weights once): the total minus the experts it skips."""
    n = model.num_params()
    cfg = model.cfg
    if cfg.moe_layers:
        c = ffn_param_counts(cfg)
        # active = total - per MoE layer (total FFN - active FFN)
        n -= len(cfg.moe_layers) * (c["total"] - c["active"])
    return n


def attention_density(cfg: ModelConfig, n: int) -> float:
    """Mean over layers of the share of the N(N+1)/2 causal pairs each layer attends to."""
    return sum(parse_pattern(cfg.pattern_for(i)).density(n) for i in range(cfg.n_layer)) / cfg.n_layer
