"""Hugging Face interop: codex_lab models to and from ``transformers`` Llama / Qwen2.

A :class:`~codex_lab.nn.model.CodexModel` is a Llama-style decoder whose parameter names
already follow Hugging Face (``q_proj``, ``gate_proj``, ...) and whose RoPE uses the same
``rotate_half`` layout, so the weights map one-to-one:

====================================  =======================================
codex_lab                             transformers (``LlamaForCausalLM`` / ``Qwen2ForCausalLM``)
====================================  =======================================
``embed.weight``                      ``model.embed_tokens.weight``
``layers.i.attn_norm.weight``         ``model.layers.i.input_layernorm.weight``
``layers.i.attn.{q,k,v,o}_proj.*``    ``model.layers.i.self_attn.{q,k,v,o}_proj.*``
``layers.i.ffn_norm.weight``          ``model.layers.i.post_attention_layernorm.weight``
``layers.i.ffn.{gate,up,down}_proj``  ``model.layers.i.mlp.{gate,up,down}_proj.weight``
``norm.weight``                       ``model.norm.weight``
``lm_head.weight``                    ``lm_head.weight``
====================================  =======================================

Qwen2 is Llama plus biases on the q/k/v projections (``qkv_bias=True``). Anything the
codex_lab model does not implement (RoPE scaling, partial rotary, sliding windows,
biases elsewhere, activations other than SiLU, a head width that is not
``hidden_size / num_heads``) is refused with an error naming the setting, never
silently converted. ``transformers`` is imported lazily: it is an optional extra.

Loading a real code model (needs internet, e.g. on Colab)::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from codex_lab.hf.llama import from_hf
    hf = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-Coder-0.5B")
    tok = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-Coder-0.5B")
    model = from_hf(hf, max_seq_len=4096, dtype=torch.float32)  # 14 query / 2 KV heads
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel

SUPPORTED_ARCHS = ("llama", "qwen2")


def _rope_settings(cfg: Any) -> float:
    """RoPE base frequency of a HF config; refuse any RoPE variant other than the plain one."""
    params = getattr(cfg, "rope_parameters", None)
    if params is None:  # transformers 4.x: rope_theta and rope_scaling are separate attributes
        params = {**(getattr(cfg, "rope_scaling", None) or {}), "rope_theta": getattr(cfg, "rope_theta", None)}
    if params and "rope_type" not in params and "rope_theta" not in params:
        raise ValueError(
            f"rope_parameters={params!r} gives one setting per layer type; codex_lab supports "
            "a single plain RoPE for every layer"
        )
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(
            f"rope_type={rope_type!r} (RoPE scaling) is not implemented in codex_lab; only plain RoPE "
            "('default') converts. Load a checkpoint without rope scaling, or remove it from the "
            "config only if you accept different outputs past the original context length"
        )
    partial = params.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", None) or 1.0)
    if partial != 1.0:
        raise ValueError(f"partial_rotary_factor={partial} is not supported; codex_lab rotates the whole head")
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None))
    if theta is None:
        raise ValueError("the HF config gives no rope_theta; cannot build the RoPE tables")
    return float(theta)


def hf_config_to_codex(hf_config: Any, *, max_seq_len: int | None = None) -> ModelConfig:
    """Translate a ``LlamaConfig`` / ``Qwen2Config`` into a :class:`ModelConfig`.

    Args:
        hf_config: the ``config`` of a ``transformers`` Llama or Qwen2 model.
        max_seq_len: length of codex_lab's RoPE tables in tokens (default: the config's
            ``max_position_embeddings``; smaller saves memory for long-context models).

    Raises:
        ValueError: the architecture or one of its settings is not supported (named).
    """
    arch = getattr(hf_config, "model_type", None)
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"model_type={arch!r} is not supported; from_hf converts {SUPPORTED_ARCHS}")
    act = getattr(hf_config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r}: codex_lab's SwiGLU uses SiLU only")
    n_head = int(hf_config.num_attention_heads)
    d_model = int(hf_config.hidden_size)
    head_dim = getattr(hf_config, "head_dim", None) or d_model // n_head
    if head_dim * n_head != d_model:
        raise ValueError(
            f"head_dim={head_dim} * num_attention_heads={n_head} != hidden_size={d_model}; "
            "codex_lab requires head_dim = hidden_size / num_heads"
        )
    if arch == "llama":
        if getattr(hf_config, "attention_bias", False):
            raise ValueError(
                "attention_bias=True (biases on q/k/v *and* o_proj) is not supported; codex_lab has "
                "q/k/v biases only (qkv_bias, the Qwen2 layout)"
            )
        if getattr(hf_config, "mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported; codex_lab's SwiGLU has no biases")
        if (getattr(hf_config, "pretraining_tp", 1) or 1) != 1:
            raise ValueError(f"pretraining_tp={hf_config.pretraining_tp} is not supported; use 1")
        qkv_bias = False
    else:
        sliding = [t for t in (getattr(hf_config, "layer_types", None) or []) if t != "full_attention"]
        if getattr(hf_config, "use_sliding_window", False) or sliding:
            raise ValueError(
                "sliding-window attention (use_sliding_window / layer_types) is not supported by from_hf; "
                "convert a config with use_sliding_window=False"
            )
        qkv_bias = True
    n_kv = getattr(hf_config, "num_key_value_heads", None) or n_head
    return ModelConfig(
        vocab_size=int(hf_config.vocab_size),
        d_model=d_model,
        n_layer=int(hf_config.num_hidden_layers),
        n_head=n_head,
        n_kv_head=int(n_kv),
        ffn_hidden=int(hf_config.intermediate_size),
        max_seq_len=int(max_seq_len or hf_config.max_position_embeddings),
        rope_theta=_rope_settings(hf_config),
        norm_eps=float(hf_config.rms_norm_eps),
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
    )


def _name_map(cfg: ModelConfig, *, include_ffn: bool = True) -> dict[str, str]:
    """codex_lab parameter name -> Hugging Face parameter name (one-to-one).

    ``include_ffn=False`` leaves out the dense feed-forward weights (Mixtral maps its
    experts itself and shares everything else with this map).
    """
    m = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    if not cfg.tie_embeddings:
        m["lm_head.weight"] = "lm_head.weight"
    for i in range(cfg.n_layer):
        a, h = f"layers.{i}", f"model.layers.{i}"
        m[f"{a}.attn_norm.weight"] = f"{h}.input_layernorm.weight"
        m[f"{a}.ffn_norm.weight"] = f"{h}.post_attention_layernorm.weight"
        for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
            m[f"{a}.attn.{p}.weight"] = f"{h}.self_attn.{p}.weight"
        if cfg.qkv_bias:
            for p in ("q_proj", "k_proj", "v_proj"):
                m[f"{a}.attn.{p}.bias"] = f"{h}.self_attn.{p}.bias"
        if include_ffn:
            for p in ("gate_proj", "up_proj", "down_proj"):
                m[f"{a}.ffn.{p}.weight"] = f"{h}.mlp.{p}.weight"
    return m


@torch.no_grad()
def from_hf(hf_model: "PreTrainedModel", *, max_seq_len: int | None = None, dtype: torch.dtype | None = None) -> CodexModel:
    """A :class:`CodexModel` with the weights of a ``LlamaForCausalLM`` / ``Qwen2ForCausalLM``.

    Args:
        hf_model: a causal-LM ``transformers`` model (with ``lm_head``), Llama or Qwen2.
        max_seq_len: RoPE table length in tokens (default ``max_position_embeddings``).
        dtype: parameter dtype of the result (default: the HF model's).

    Returns:
        a new model in eval mode on the HF model's device; the HF model is left unchanged.

    Raises:
        ValueError: unsupported architecture or setting (named in the message).
    """
    cfg = hf_config_to_codex(hf_model.config, max_seq_len=max_seq_len)
    src = hf_model.state_dict()
    if "lm_head.weight" not in src and not cfg.tie_embeddings:
        raise ValueError(f"{type(hf_model).__name__} has no lm_head; pass the *ForCausalLM model")
    ref = next(iter(src.values()))
    model = CodexModel(cfg).to(device=ref.device, dtype=dtype or ref.dtype)
    dst = model.state_dict()
    for ours, theirs in _name_map(cfg).items():
        if theirs not in src:
            raise ValueError(f"HF weight {theirs!r} is missing (needed for {ours!r})")
        if src[theirs].shape != dst[ours].shape:
            raise ValueError(f"shape mismatch: HF {theirs} {tuple(src[theirs].shape)} vs codex_lab {ours} {tuple(dst[ours].shape)}")
        dst[ours].copy_(src[theirs])
    return model.eval()


@torch.no_grad()
def to_hf(model: CodexModel, *, arch: str | None = None, eos_token_id: int | list[int] | None = None,
          pad_token_id: int | None = None) -> "PreTrainedModel":
    """The same network as a ``transformers`` model, in eval mode on the model's device.

    Args:
        model: a dense codex_lab model (no sparse attention layers, no MoE layers).
        arch: "llama" or "qwen2"; default "qwen2" when the model has q/k/v biases, else "llama".
            A bias-free model may also be exported as Qwen2 (its biases are then zero).
        eos_token_id, pad_token_id: written into the HF config (``generate`` stops at eos; a list of
            ids stops at any of them).

    Returns:
        ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` with copied (not shared) weights.

    Raises:
        ValueError: the model uses something the HF architecture lacks (named).
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg = model.cfg
    arch = arch or ("qwen2" if cfg.qkv_bias else "llama")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"arch={arch!r}; choose one of {SUPPORTED_ARCHS}")
    if arch == "llama" and cfg.qkv_bias:
        raise ValueError("Llama has no q/k/v-only biases; export a qkv_bias model with arch='qwen2'")
    sparse = [i for i in range(cfg.n_layer) if not model.layers[i].attn.pattern.is_dense]
    if sparse:
        raise ValueError(f"layers {sparse} use sparse attention patterns, which {arch} does not have; export a dense model")
    if cfg.moe_layers:
        raise ValueError(f"moe_layers={cfg.moe_layers}: mixture-of-experts layers have no {arch} equivalent")
    common: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_hidden,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
        max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps, hidden_act="silu",
        tie_word_embeddings=cfg.tie_embeddings, rope_theta=cfg.rope_theta,  # plain RoPE (4.x and 5.x spelling)
        bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
    )
    if arch == "llama":
        hf_cfg = LlamaConfig(**common, head_dim=cfg.head_dim, attention_bias=False, mlp_bias=False)
        cls: Any = LlamaForCausalLM
    else:
        hf_cfg = Qwen2Config(**common, use_sliding_window=False)
        cls = Qwen2ForCausalLM
    ref = next(model.parameters())
    hf_model = cls(hf_cfg).to(device=ref.device, dtype=ref.dtype)
    src, dst = model.state_dict(), hf_model.state_dict()
    for ours, theirs in _name_map(cfg).items():
        dst[theirs].copy_(src[ours])
    if arch == "qwen2" and not cfg.qkv_bias:
        for name, t in dst.items():
            if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                t.zero_()
    if cfg.tie_embeddings:
        hf_model.tie_weights()
    return hf_model.eval()
