"""The capstone's architecture (lesson 08): the candidate's config, its ablation variants and
the numbers that describe a model (parameters, KV bytes, attention density, layout).

The weights of a candidate come from the trained plain model by :func:`codex_lab.nn.surgery.convert`
(K/V heads mean-pooled, every expert a copy of the dense FFN).
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
from torch import Tensor

from codex_lab.nn.accounting import active_params, attention_density, kv_bytes_per_token
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.nn.patterns import parse_pattern

# Deep-layer pattern: a 64-token local window (the seed's 64-128) plus every 4th 64-token key
# block (a block-granular stride: whole tiles a block-sparse kernel can skip, lesson 02).
DEFAULT_SPARSE = "window:64+blockstride:64:4"


def capstone_config(
    base: ModelConfig,
    *,
    dense_layers: int | None = None,
    sparse: str = DEFAULT_SPARSE,
    n_kv_head: int | None = None,
    moe_layers: Sequence[int] | None = None,
    n_experts: int = 8,
    top_k: int = 2,
    attn_impl: str = "blocks",
) -> ModelConfig:
    """The candidate's config: ``base``'s shape with every optimisation switched on.

    Args:
        base: the plain model's config (dense, usually MHA, no MoE).
        dense_layers: how many first layers keep dense attention (default: half of them).
        sparse: pattern spec of the deeper layers (see :func:`codex_lab.nn.patterns.parse_pattern`).
        n_kv_head: K/V heads (default: ``n_head // 2``, group size 2; must divide ``n_head``).
        moe_layers: layers whose FFN becomes a mixture of experts (default: the sparse ones).
        n_experts: experts per MoE layer (the seed recommends 8-16).
        top_k: experts per token (the seed recommends 2-4).
        attn_impl: kernel of the sparse layers ("blocks" trains on CPU; "flex" is inference-only there).
    """
    n = base.n_layer
    dense_layers = n // 2 if dense_layers is None else dense_layers
    if not 0 <= dense_layers <= n:
        raise ValueError(f"dense_layers={dense_layers} must be in 0..n_layer={n}")
    if parse_pattern(sparse).is_dense:
        raise ValueError(f"sparse={sparse!r} is a dense pattern; give a window/stride spec such as {DEFAULT_SPARSE!r}")
    kv = max(1, base.n_head // 2) if n_kv_head is None else n_kv_head
    moe = list(range(dense_layers, n)) if moe_layers is None else sorted(set(moe_layers))
    d = copy.deepcopy(base.to_dict())
    d.update(
        attn_patterns=["dense"] * dense_layers + [parse_pattern(sparse).spec] * (n - dense_layers),
        attn_impl=attn_impl, n_kv_head=kv, moe_layers=moe, n_experts=n_experts, moe_top_k=top_k,
        moe_ffn_hidden=None,
    )
    return ModelConfig.from_dict(d)


def describe(model: CodexModel, *, seq_len: int) -> dict[str, Any]:
    """Architecture numbers of one model: params (total, active per token), KV bytes per token
    (fp32), mean attention density at ``seq_len`` tokens, and the per-layer layout."""
    cfg = model.cfg
    return {
        "params": model.num_params(), "active_params": active_params(model),
        "kv_bytes_per_token": kv_bytes_per_token(cfg), f"attn_density@{seq_len}": attention_density(cfg, seq_len),
        "layers": [f"{cfg.pattern_for(i)}{' +MoE' if i in cfg.moe_layers else ''}" for i in range(cfg.n_layer)],
        "n_kv_head": cfg.n_kv_head,
    }


@torch.no_grad()
def max_logit_gap(a: CodexModel, b: CodexModel, idx: Tensor) -> float:
    """max |logits_a - logits_b| over token ids ``idx`` (B, T), both in eval mode."""
    was_a, was_b = a.training, b.training
    a.eval(), b.eval()
    gap = float((a(idx).logits - b(idx).logits).abs().max())  # (B, T, V) -> scalar
    a.train(was_a), b.train(was_b)
    return gap


def ablation_configs(base: ModelConfig, cand: ModelConfig) -> dict[str, ModelConfig]:
    """One config per optimisation of ``cand`` switched on alone over ``base``, plus all of them."""
    dense = sum(cand.pattern_for(i) == "dense" for i in range(cand.n_layer))
    sparse = next((cand.pattern_for(i) for i in range(cand.n_layer) if cand.pattern_for(i) != "dense"), DEFAULT_SPARSE)
    common = dict(sparse=sparse, n_experts=cand.n_experts, top_k=cand.moe_top_k, attn_impl=cand.attn_impl)
    n = base.n_layer
    return {
        "plain": base,
        f"GQA (n_kv_head={cand.n_kv_head})": capstone_config(base, dense_layers=n, n_kv_head=cand.n_kv_head, moe_layers=[], **common),
        f"sparse layers {dense}..{n - 1}": capstone_config(base, dense_layers=dense, n_kv_head=base.n_kv_head, moe_layers=[], **common),
        f"MoE layers {cand.moe_layers}": capstone_config(base, dense_layers=n, n_kv_head=base.n_kv_head, moe_layers=cand.moe_layers, **common),
        "all": cand,
    }
