"""Hugging Face interop for mixtures of experts: codex_lab <-> ``transformers`` Mixtral.

Mixtral routes exactly as :mod:`codex_lab.nn.moe` does (softmax, top-k, renormalise the k
weights), so one MoE layer maps onto one ``MixtralSparseMoeBlock``. transformers 5.x
stores a block's experts fused as 3-D parameters:

=====================================  ==============================================
codex_lab ``MoEFeedForward``           transformers ``MixtralSparseMoeBlock``
=====================================  ==============================================
``router.weight`` (E, d)               ``gate.weight`` (E, d)
``experts.e.gate_proj.weight`` (h, d)  ``experts.gate_up_proj[e, :h]`` (of (E, 2h, d))
``experts.e.up_proj.weight`` (h, d)    ``experts.gate_up_proj[e, h:]``
``experts.e.down_proj.weight`` (d, h)  ``experts.down_proj[e]`` (of (E, d, h))
=====================================  ==============================================

A whole model maps onto ``MixtralForCausalLM`` when every layer is an MoE layer (Mixtral
has no dense layers), with no shared experts, no capacity limit (Mixtral is dropless at
inference) and no selection bias; attention, norms and embeddings map as in
:mod:`codex_lab.hf.llama`. Anything else is refused with an error naming the setting.

Training losses do not convert exactly: ``router_aux_loss_coef`` is copied as a number, but
Hugging Face's load-balancing loss is k times codex_lab's and pools all layers' tokens,
while codex_lab sums one loss per layer. Forward outputs and generations are identical.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from codex_lab.nn.config import ModelConfig
from codex_lab.hf.llama import _name_map, _rope_settings
from codex_lab.nn.model import CodexModel
from codex_lab.nn.moe import MoEFeedForward

if TYPE_CHECKING:  # pragma: no cover
    from transformers import MixtralForCausalLM
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock


def _check_mixtral_compatible(cfg: ModelConfig, *, whole_model: bool) -> None:
    """Raise ValueError naming the first setting Mixtral cannot express."""
    if cfg.n_shared_experts:
        raise ValueError(f"n_shared_experts={cfg.n_shared_experts}: Mixtral has no shared experts; use 0")
    if cfg.moe_capacity_factor is not None:
        raise ValueError(f"moe_capacity_factor={cfg.moe_capacity_factor}: Mixtral is dropless; use None")
    if whole_model:
        if sorted(cfg.moe_layers) != list(range(cfg.n_layer)):
            raise ValueError(
                f"moe_layers={cfg.moe_layers}: every Mixtral layer is an MoE layer; "
                f"use moe_layers=list(range({cfg.n_layer}))"
            )
        if cfg.qkv_bias:
            raise ValueError("qkv_bias=True: Mixtral's attention has no biases")
        if cfg.attn_patterns is not None and any(p != "dense" for p in cfg.attn_patterns):
            raise ValueError(f"attn_patterns={cfg.attn_patterns}: Mixtral (sliding_window=None) is dense")


def _hidden(cfg: ModelConfig) -> int:
    h = cfg.moe_ffn_hidden or cfg.ffn_hidden
    assert h is not None
    return h


def mixtral_config(cfg: ModelConfig, **extra: Any) -> Any:
    """The ``MixtralConfig`` of a codex_lab MoE config (``extra`` overrides fields)."""
    from transformers import MixtralConfig

    kw: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=_hidden(cfg),
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
        hidden_act="silu", tie_word_embeddings=cfg.tie_embeddings, sliding_window=None,
        num_local_experts=cfg.n_experts, num_experts_per_tok=cfg.moe_top_k, router_jitter_noise=0.0,
        router_aux_loss_coef=cfg.moe_aux_loss_coef,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    kw.update(extra)
    return MixtralConfig(**kw)


def codex_config_from_mixtral(hf_config: Any, *, max_seq_len: int | None = None) -> ModelConfig:
    """Translate a ``MixtralConfig`` into a :class:`ModelConfig` (every layer MoE, dropless).

    Raises:
        ValueError: a setting codex_lab does not implement (named).
    """
    if getattr(hf_config, "model_type", None) != "mixtral":
        raise ValueError(f"model_type={getattr(hf_config, 'model_type', None)!r}; expected 'mixtral'")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={hf_config.hidden_act!r}: codex_lab's experts use SiLU only")
    if getattr(hf_config, "sliding_window", None) is not None:
        raise ValueError(f"sliding_window={hf_config.sliding_window}: convert a config with sliding_window=None")
    n_head, d = int(hf_config.num_attention_heads), int(hf_config.hidden_size)
    head_dim = getattr(hf_config, "head_dim", None) or d // n_head
    if head_dim * n_head != d:
        raise ValueError(f"head_dim={head_dim} * num_attention_heads={n_head} != hidden_size={d}")
    n_layer = int(hf_config.num_hidden_layers)
    return ModelConfig(
        vocab_size=int(hf_config.vocab_size), d_model=d, n_layer=n_layer, n_head=n_head,
        n_kv_head=int(hf_config.num_key_value_heads or n_head), ffn_hidden=int(hf_config.intermediate_size),
        max_seq_len=int(max_seq_len or hf_config.max_position_embeddings), rope_theta=_rope_settings(hf_config),
        norm_eps=float(hf_config.rms_norm_eps), tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        moe_layers=list(range(n_layer)), n_experts=int(hf_config.num_local_experts),
        moe_top_k=int(hf_config.num_experts_per_tok), moe_ffn_hidden=int(hf_config.intermediate_size),
        moe_aux_loss_coef=float(getattr(hf_config, "router_aux_loss_coef", 0.0)), moe_capacity_factor=None,
    )


@torch.no_grad()
def _moe_to_block_weights(moe: MoEFeedForward) -> dict[str, torch.Tensor]:
    """Block-relative HF tensors of one codex_lab MoE layer."""
    # gate_up_proj[e] = [W_gate_e; W_up_e]  (2h, d)
    gate_up = torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight], 0) for e in moe.experts])  # (E, 2h, d)
    down = torch.stack([e.down_proj.weight for e in moe.experts])  # (E, d, h)
    return {"gate.weight": moe.router.weight.detach().clone(), "experts.gate_up_proj": gate_up, "experts.down_proj": down}


@torch.no_grad()
def _load_block_weights(moe: MoEFeedForward, src: dict[str, torch.Tensor]) -> None:
    """Copy block-relative HF tensors into a codex_lab MoE layer (shapes checked)."""
    E, h = len(moe.experts), moe.experts[0].gate_proj.weight.shape[0]
    gate_up, down = src["experts.gate_up_proj"], src["experts.down_proj"]  # (E, 2h, d), (E, d, h)
    if src["gate.weight"].shape != moe.router.weight.shape or gate_up.shape[:2] != (E, 2 * h):
        raise ValueError(
            f"shape mismatch: HF gate {tuple(src['gate.weight'].shape)}, gate_up_proj {tuple(gate_up.shape)} "
            f"vs codex_lab router {tuple(moe.router.weight.shape)}, {E} experts of hidden {h}"
        )
    moe.router.weight.copy_(src["gate.weight"])
    for e, expert in enumerate(moe.experts):
        expert.gate_proj.weight.copy_(gate_up[e, :h])
        expert.up_proj.weight.copy_(gate_up[e, h:])
        expert.down_proj.weight.copy_(down[e])
    moe.expert_bias.zero_()


def moe_to_hf_block(moe: MoEFeedForward, cfg: ModelConfig, *, experts_implementation: str = "eager") -> "MixtralSparseMoeBlock":
    """A ``MixtralSparseMoeBlock`` computing the same function as ``moe`` (weights copied).

    Args:
        moe: the codex_lab layer; cfg: its config (dropless, no shared experts, no bias).
        experts_implementation: HF expert kernel, "eager" (a loop over hit experts) or
            "grouped_mm" / "batched_mm" (transformers' fused paths).
    """
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    _check_mixtral_compatible(cfg, whole_model=False)
    if cfg.moe_router_bias and bool(moe.expert_bias.abs().sum() > 0):
        raise ValueError("the layer has a non-zero selection bias (moe_router_bias); Mixtral has none")
    hf_cfg = mixtral_config(cfg)
    hf_cfg._experts_implementation = experts_implementation
    ref = moe.router.weight
    block = MixtralSparseMoeBlock(hf_cfg).to(device=ref.device, dtype=ref.dtype)
    weights = _moe_to_block_weights(moe)
    with torch.no_grad():
        for name, t in block.state_dict().items():
            t.copy_(weights[name])
    return block.eval()


def moe_from_hf_block(block: "MixtralSparseMoeBlock", cfg: ModelConfig) -> MoEFeedForward:
    """A codex_lab MoE layer (dropless, "grouped" dispatch) with a Mixtral block's weights."""
    _check_mixtral_compatible(cfg, whole_model=False)
    ref = block.gate.weight
    moe = MoEFeedForward(cfg).to(device=ref.device, dtype=ref.dtype)
    _load_block_weights(moe, dict(block.state_dict()))
    return moe.eval()


def _shared_name_map(cfg: ModelConfig) -> dict[str, str]:
    """Non-MoE weights: codex_lab name -> HF Mixtral name (the Llama map without the FFN)."""
    return _name_map(cfg, include_ffn=False)


@torch.no_grad()
def to_hf_mixtral(model: CodexModel, *, eos_token_id: int | None = None, pad_token_id: int | None = None) -> "MixtralForCausalLM":
    """The same network as a ``MixtralForCausalLM`` (copied weights, eval mode, same device).

    Raises:
        ValueError: the model uses something Mixtral lacks (named).
    """
    from transformers import MixtralForCausalLM

    cfg = model.cfg
    _check_mixtral_compatible(cfg, whole_model=True)
    hf_cfg = mixtral_config(cfg, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    ref = next(model.parameters())
    hf = MixtralForCausalLM(hf_cfg).to(device=ref.device, dtype=ref.dtype)
    src, dst = model.state_dict(), hf.state_dict()
    for ours, theirs in _shared_name_map(cfg).items():
        dst[theirs].copy_(src[ours])
    for i, layer in enumerate(model.layers):
        ffn = layer.ffn
        assert isinstance(ffn, MoEFeedForward)
        if bool(ffn.expert_bias.abs().sum() > 0):
            raise ValueError(f"layer {i} has a non-zero selection bias (moe_router_bias); Mixtral has none")
        for name, t in _moe_to_block_weights(ffn).items():
            dst[f"model.layers.{i}.mlp.{name}"].copy_(t)
    if cfg.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


@torch.no_grad()
def from_hf_mixtral(hf_model: "MixtralForCausalLM", *, max_seq_len: int | None = None) -> CodexModel:
    """A :class:`CodexModel` (every layer MoE, dropless) with a ``MixtralForCausalLM``'s weights.

    Raises:
        ValueError: unsupported setting or a missing/mis-shaped weight (named).
    """
    cfg = codex_config_from_mixtral(hf_model.config, max_seq_len=max_seq_len)
    src = hf_model.state_dict()
    ref = next(iter(src.values()))
    model = CodexModel(cfg).to(device=ref.device, dtype=ref.dtype)
    dst = model.state_dict()
    for ours, theirs in _shared_name_map(cfg).items():
        if theirs not in src:
            raise ValueError(f"HF weight {theirs!r} is missing (needed for {ours!r})")
        dst[ours].copy_(src[theirs])
    for i, layer in enumerate(model.layers):
        prefix = f"model.layers.{i}.mlp."
        block = {k[len(prefix):]: v for k, v in src.items() if k.startswith(prefix)}
        assert isinstance(layer.ffn, MoEFeedForward)
        _load_block_weights(layer.ffn, block)
    return model.eval()
