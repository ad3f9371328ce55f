"""Model surgery: new models built from the weights of a trained one, without training.

- :func:`mha_to_gqa` (lesson 03): Ainslie et al. 2023 ("GQA: Training Generalized
  Multi-Query Transformer Models from Multi-Head Checkpoints"): each group's K and V
  projection heads are mean-pooled (:func:`mean_pool_heads`) into one head;
- :func:`convert` (lesson 08): K/V pooling plus "sparse upcycling" (Komatsuzaki et al. 2022):
  every expert of an MoE layer starts as a copy of the layer's dense FFN;
- :func:`truncated_draft` (lesson 06): the first layers of a model as the draft of
  speculative decoding (early exit, weights shared).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.layers import SwiGLU
from codex_lab.nn.model import CodexModel
from codex_lab.nn.moe import MoEFeedForward


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


@torch.no_grad()
def convert(model: CodexModel, cfg: ModelConfig, *, seed: int = 0) -> CodexModel:
    """A new model of config ``cfg`` initialised from the trained plain ``model``.

    K/V projections are mean-pooled to ``cfg.n_kv_head`` heads (:func:`mha_to_gqa`); each
    expert of an MoE layer gets a copy of that layer's dense SwiGLU weights (sparse
    upcycling), the router a fresh small random init (``seed``); everything else is copied.
    Attention patterns need no weights. ``model`` is not modified.

    Exactness: with copies, the renormalised top-k weights sum to 1, so an MoE layer equals
    the dense FFN it came from; with ``n_kv_head`` unchanged and all layers dense the new
    model equals ``model``.
    """
    src_cfg = model.cfg
    for f in ("vocab_size", "d_model", "n_layer", "n_head", "ffn_hidden", "max_seq_len", "rope_theta", "tie_embeddings", "qkv_bias"):
        if getattr(src_cfg, f) != getattr(cfg, f):
            raise ValueError(f"convert keeps the model's shape: {f} is {getattr(src_cfg, f)} in the model but "
                             f"{getattr(cfg, f)} in the target config; change only patterns, n_kv_head and MoE fields")
    if src_cfg.moe_layers:
        raise ValueError(f"convert starts from a dense-FFN model; this one has MoE layers {src_cfg.moe_layers}")
    if (cfg.moe_ffn_hidden or cfg.ffn_hidden) != src_cfg.ffn_hidden:
        raise ValueError("upcycled experts copy the dense FFN: leave moe_ffn_hidden unset (= ffn_hidden)")
    ref = next(model.parameters())
    with torch.random.fork_rng(devices=[]):  # seeded inits without touching the caller's RNG state
        torch.manual_seed(seed)
        pooled = mha_to_gqa(model, cfg.n_kv_head) if cfg.n_kv_head != src_cfg.n_kv_head else model  # type: ignore[arg-type]
        new = CodexModel(cfg).to(device=ref.device, dtype=ref.dtype)
    src = pooled.state_dict()
    for i, layer in enumerate(new.layers):
        if isinstance(layer.ffn, MoEFeedForward):
            for expert in layer.ffn.experts:
                assert isinstance(expert, SwiGLU)
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    getattr(expert, proj).weight.copy_(src[f"layers.{i}.ffn.{proj}.weight"])
    dst = new.state_dict()
    for name, t in dst.items():
        if name.startswith("layers.") and ".ffn." in name and int(name.split(".")[1]) in cfg.moe_layers:
            continue  # experts set above; router and selection bias keep their fresh init
        t.copy_(src[name])
    new.train(model.training)
    return new


def truncated_draft(model: CodexModel, n_layers: int) -> CodexModel:
    """A draft that is the target's first ``n_layers`` blocks plus its final norm and head
    (early exit; no training, weights shared with ``model``, not copied)."""
    if not 1 <= n_layers <= model.cfg.n_layer:
        raise ValueError(f"n_layers must be in 1..{model.cfg.n_layer}, got {n_layers}")
    cfg = copy.deepcopy(model.cfg)
    cfg.n_layer = n_layers
    if cfg.attn_patterns is not None:
        cfg.attn_patterns = cfg.attn_patterns[:n_layers]
    cfg.moe_layers = [i for i in cfg.moe_layers if i < n_layers]
    draft = CodexModel.__new__(CodexModel)
    nn.Module.__init__(draft)
    draft.cfg = cfg
    draft.embed, draft.norm, draft.lm_head = model.embed, model.norm, model.lm_head
    draft.layers = nn.ModuleList(list(model.layers[:n_layers]))
    draft.register_buffer("rope_cos", model.rope_cos, persistent=False)
    draft.register_buffer("rope_sin", model.rope_sin, persistent=False)
    return draft.eval()
