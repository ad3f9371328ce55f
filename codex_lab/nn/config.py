"""Model configuration: one dataclass, with room for every lesson's variant.

- ``n_kv_head`` < ``n_head`` gives grouped-query attention (lesson 03); 1 gives MQA.
- ``attn_patterns`` gives each layer an attention pattern spec (lesson 02), e.g.
  ``["dense", "dense", "window:128+blockstride:128:4", ...]``; ``None`` means all dense.
- ``moe_layers`` lists the layers whose feed-forward is a mixture of experts (lesson 04).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

ATTN_IMPLS = ("sdpa", "reference", "blocks", "flex")


@dataclass
class ModelConfig:
    """Shape of a Llama-style decoder (RMSNorm, RoPE, SwiGLU).

    Args:
        vocab_size: number of token ids.
        d_model: residual stream width.
        n_layer: number of transformer blocks.
        n_head: query heads per layer.
        n_kv_head: key/value heads (``None`` = ``n_head``, i.e. multi-head attention);
            must divide ``n_head``.
        ffn_hidden: SwiGLU hidden width (``None`` = 8/3 * d_model rounded up to 64).
        max_seq_len: longest sequence the RoPE tables cover, in tokens.
        rope_theta: RoPE base frequency.
        norm_eps: RMSNorm epsilon.
        tie_embeddings: share the input embedding and output projection weights.
        qkv_bias: biases on the q/k/v projections (Qwen2 has them, Llama does not).
        attn_patterns: one pattern spec per layer (see ``codex_lab.nn.patterns``), ``None`` = dense.
        attn_impl: attention kernel: "sdpa" (fused, default), "reference" (explicit scores),
            "blocks" or "flex" (block-sparse kernels for sparse layers, lesson 02).
        moe_layers: indices of layers whose FFN is a mixture of experts.
        n_experts: experts per MoE layer.
        moe_top_k: experts each token is routed to.
        n_shared_experts: always-on experts per MoE layer (0 = none).
        moe_ffn_hidden: hidden width of each expert (``None`` = ``ffn_hidden``).
        moe_aux_loss_coef: weight of the load-balancing loss added to the LM loss.
        moe_z_loss_coef: weight of the router z-loss.
        moe_capacity_factor: ``None`` = dropless; otherwise capacity per expert =
            factor * tokens * top_k / n_experts.
        moe_router_bias: auxiliary-loss-free balancing with a per-expert selection bias.
    """

    vocab_size: int = 4096
    d_model: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None
    ffn_hidden: int | None = None
    max_seq_len: int = 1024
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    qkv_bias: bool = False
    attn_patterns: list[str] | None = None
    attn_impl: str = "sdpa"
    moe_layers: list[int] = field(default_factory=list)
    n_experts: int = 8
    moe_top_k: int = 2
    n_shared_experts: int = 0
    moe_ffn_hidden: int | None = None
    moe_aux_loss_coef: float = 0.01
    moe_z_loss_coef: float = 0.0
    moe_capacity_factor: float | None = None
    moe_router_bias: bool = False

    def __post_init__(self) -> None:
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.ffn_hidden is None:
            # SwiGLU keeps ~the parameters of a 4*d MLP: hidden = 8/3 * d, rounded up to 64
            self.ffn_hidden = 64 * -(-(8 * self.d_model // 3) // 64)
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_head={self.n_head}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.n_kv_head < 1 or self.n_head % self.n_kv_head:
            raise ValueError(
                f"n_kv_head={self.n_kv_head} must divide n_head={self.n_head} "
                "(1 = multi-query, n_head = multi-head)"
            )
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl={self.attn_impl!r}; choose one of {ATTN_IMPLS}")
        if self.attn_patterns is not None and len(self.attn_patterns) != self.n_layer:
            raise ValueError(
                f"attn_patterns has {len(self.attn_patterns)} entries for {self.n_layer} layers; "
                "give one pattern spec per layer"
            )
        bad = [i for i in self.moe_layers if not 0 <= i < self.n_layer]
        if bad:
            raise ValueError(f"moe_layers {bad} are outside 0..{self.n_layer - 1}")
        if self.moe_layers and not 1 <= self.moe_top_k <= self.n_experts:
            raise ValueError(f"moe_top_k={self.moe_top_k} must be in 1..n_experts={self.n_experts}")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_head

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 = MHA, n_head = MQA)."""
        assert self.n_kv_head is not None
        return self.n_head // self.n_kv_head

    def pattern_for(self, layer: int) -> str:
        """Attention pattern spec of one layer ("dense" when none is set)."""
        return "dense" if self.attn_patterns is None else self.attn_patterns[layer]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-serialisable)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        """Inverse of :meth:`to_dict`; unknown keys are an error naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}; known fields: {sorted(known)}")
        return cls(**d)

    def save(self, path: str | Path) -> None:
        """Write the config as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        """Read a config written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text()))
