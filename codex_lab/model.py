"""A small Llama-style decoder for code: RMSNorm, rotary positions (RoPE), SwiGLU.

Attention has two paths that tests hold equal: ``"reference"`` builds the scores and the
mask explicitly (obviously correct, O(T*S) memory) and ``"sdpa"`` calls PyTorch's fused
``scaled_dot_product_attention``. Grouped-query attention (``n_kv_head < n_head``) is
native in both. Parameter names follow Hugging Face Llama (q_proj, gate_proj, ...), which
keeps the interop converters one-to-one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .kv_cache import LayerCache
from .patterns import AttentionPattern, parse_pattern


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (no mean subtraction, no bias)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., dim) -> (..., dim); computed in float32 for stability."""
        xf = x.float()
        # y = x / sqrt(mean(x^2) + eps) * g
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rope_tables(head_dim: int, max_len: int, theta: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos/sin tables of rotary embeddings, each (max_len, head_dim), Llama layout."""
    # inv_freq_i = theta^(-2i / head_dim), i = 0 .. head_dim/2 - 1
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    # angle[p, i] = p * inv_freq_i
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (L, hd/2)
    emb = torch.cat([angles, angles], dim=-1)  # (L, hd)
    return emb.cos(), emb.sin()


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, H, T, hd) by position; cos/sin are (B, 1, T, hd)."""
    # x_rot = x * cos(p * f) + rotate_half(x) * sin(p * f)
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


# ---------------------------------------------------------------------------------------
# Attention kernels. Each takes q (B, H, T, D), k/v (B, H_kv, S, D) and a boolean mask
# (B or 1, 1, T, S) where True = may attend (None with is_causal = plain causal).
# ---------------------------------------------------------------------------------------


def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool = False, **_: object
) -> Tensor:
    """Explicit-scores attention: repeat K/V per group, score, mask, softmax, weight.

    A fully masked query row returns zeros (never NaN).
    """
    B, H, T, D = q.shape
    S = k.shape[2]
    g = H // k.shape[1]
    k = k.repeat_interleave(g, dim=1)  # (B, H, S, D)
    v = v.repeat_interleave(g, dim=1)  # (B, H, S, D)
    if mask is None and is_causal:
        if T != S:
            raise ValueError(f"is_causal needs as many queries as keys (got T={T}, S={S}); pass an explicit mask")
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril()[None, None]  # (1, 1, T, S)
    # scores = q k^T / sqrt(D)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1)  # (B, H, T, S)
    if mask is not None:
        probs = torch.where(mask.any(dim=-1, keepdim=True), probs, torch.zeros_like(probs))
    return probs.to(v.dtype) @ v  # (B, H, T, D)


def attention_sdpa(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool = False, **_: object
) -> Tensor:
    """PyTorch's fused attention; grouped K/V heads are broadcast, never copied."""
    grouped = q.shape[1] != k.shape[1]
    if mask is None and is_causal and q.shape[2] != k.shape[2]:
        # SDPA aligns is_causal top-left; the reference would disagree, so refuse instead
        raise ValueError(f"is_causal needs as many queries as keys (got T={q.shape[2]}, S={k.shape[2]}); pass an explicit mask")
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped)
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=grouped)


AttentionFn = Callable[..., Tensor]
_ATTENTION_IMPLS: dict[str, AttentionFn] = {"reference": attention_reference, "sdpa": attention_sdpa}


def register_attention_impl(name: str, fn: AttentionFn) -> None:
    """Register a kernel ``fn(q, k, v, mask, is_causal=False, *, pattern, q_pos, k_pos)``.

    Sparse kernels are called with ``mask=None`` and the layer's pattern plus the query
    positions (B, T) and key positions (B, S) (-1 = empty slot), and must return
    (B, H, T, D) equal to :func:`attention_reference` under the same pattern.
    """
    _ATTENTION_IMPLS[name] = fn


def get_attention_impl(name: str) -> AttentionFn:
    """Look up a kernel; block-sparse kernels register when ``codex_lab.sparse`` is imported."""
    if name not in _ATTENTION_IMPLS:
        try:
            from . import sparse  # noqa: F401  (registers "blocks" and "flex")
        except ImportError as exc:  # pragma: no cover - only before lesson 02 exists
            raise ValueError(f"attention impl {name!r} needs codex_lab.sparse: {exc}") from exc
    if name not in _ATTENTION_IMPLS:
        raise ValueError(f"unknown attention impl {name!r}; known: {sorted(_ATTENTION_IMPLS)}")
    return _ATTENTION_IMPLS[name]


class Attention(nn.Module):
    """Multi-head / grouped-query / multi-query self-attention with RoPE and a pattern."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        assert cfg.n_kv_head is not None
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.impl = cfg.attn_impl
        self.pattern: AttentionPattern = parse_pattern(cfg.pattern_for(layer_idx))
        d, hd = cfg.d_model, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.n_head * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, cfg.n_kv_head * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, cfg.n_kv_head * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_head * hd, d, bias=False)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        positions: Tensor,
        cache: LayerCache | None = None,
        plain_causal: bool = False,
    ) -> Tensor:
        """x (B, T, d) -> (B, T, d). ``positions`` (B, T) are absolute token positions.

        ``plain_causal`` says the batch is positions 0..T-1 with no cache, so dense layers
        may use the fast ``is_causal`` kernel instead of an explicit mask.
        """
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k_pos = positions
        if cache is not None:
            k, v, k_pos = cache.update(k, v, positions)  # (B, Hkv, S, hd), (B, S)
        impl = self.impl
        if impl not in ("sdpa", "reference") and self.pattern.is_dense:
            impl = "sdpa"  # block-sparse kernels only pay off on sparse layers
        fn = get_attention_impl(impl)
        if plain_causal and cache is None and self.pattern.is_dense:
            y = fn(q, k, v, None, is_causal=True)  # (B, H, T, hd)
        elif impl in ("sdpa", "reference"):
            # allowed[b, t, s] = pattern(q_pos, k_pos) and the key slot is filled
            allowed = self.pattern.allowed(positions[:, :, None], k_pos[:, None, :]) & (k_pos >= 0)[:, None, :]
            y = fn(q, k, v, allowed[:, None])  # mask (B, 1, T, S) -> (B, H, T, hd)
        else:
            # sparse kernels work from the pattern and positions, never from an N x N mask
            y = fn(q, k, v, None, pattern=self.pattern, q_pos=positions, k_pos=k_pos)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)  # (B, T, H*hd)
        return self.o_proj(y)


class SwiGLU(nn.Module):
    """Gated feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., d) -> (..., d)."""
        # y = W_down (silu(W_gate x) * (W_up x))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def make_ffn(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    """The feed-forward of one layer: SwiGLU, or a mixture of experts for ``moe_layers``.

    An MoE module sets ``self.aux_loss`` (a scalar tensor, already weighted) on every
    forward; the model adds it to its output's ``aux_loss``.
    """
    if layer_idx in cfg.moe_layers:
        from .moe import MoEFeedForward  # lesson 04

        return MoEFeedForward(cfg)
    assert cfg.ffn_hidden is not None
    return SwiGLU(cfg.d_model, cfg.ffn_hidden)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer_idx)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = make_ffn(cfg, layer_idx)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, cache: LayerCache | None, plain_causal: bool) -> Tensor:
        """x (B, T, d) -> (B, T, d)."""
        x = x + self.attn(self.attn_norm(x), cos, sin, positions, cache, plain_causal)
        return x + self.ffn(self.ffn_norm(x))


@dataclass
class ModelOutput:
    """logits (B, T, V); loss = mean cross-entropy over target tokens != -100 (or None);
    aux_loss = weighted sum of MoE balancing losses (0 without MoE)."""

    logits: Tensor
    loss: Tensor | None
    aux_loss: Tensor


class CodexModel(nn.Module):
    """Decoder-only language model over token ids."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)  # (L, hd)
        self.register_buffer("rope_sin", sin, persistent=False)  # (L, hd)
        self.apply(self._init_weights)
        # GPT-2 style: residual output projections scaled by 1/sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (tied weights counted once); optionally without the embedding."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.embed.weight.numel()
        return n

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        caches: Sequence[LayerCache] | None = None,
        last_only: bool = False,
    ) -> ModelOutput:
        """Run the model.

        Args:
            idx: token ids (B, T).
            targets: next-token ids (B, T); -100 marks tokens that carry no loss.
            positions: absolute positions (B, T); default 0..T-1, or continuing after the
                cache's length when ``caches`` are given and positions are omitted.
            caches: one :class:`~codex_lab.kv_cache.LayerCache` per layer, for decoding.
            last_only: compute logits for the last position only (generation).
        """
        B, T = idx.shape
        plain_causal = positions is None and caches is None
        if positions is None:
            start = 0
            if caches is not None:
                start = int(getattr(caches[0], "length", 0))
            positions = torch.arange(start, start + T, device=idx.device).expand(B, T)  # (B, T)
        if caches is not None and len(caches) != len(self.layers):
            raise ValueError(f"got {len(caches)} caches for {len(self.layers)} layers")
        max_pos = int(positions.max())
        if max_pos >= self.cfg.max_seq_len:
            raise ValueError(
                f"position {max_pos} is past max_seq_len={self.cfg.max_seq_len}; "
                "shorten the input or build the model with a larger max_seq_len"
            )
        cos = self.rope_cos[positions].unsqueeze(1)  # (B, 1, T, hd)
        sin = self.rope_sin[positions].unsqueeze(1)  # (B, 1, T, hd)
        x = self.embed(idx)  # (B, T, d)
        aux = x.new_zeros(())
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, positions, None if caches is None else caches[i], plain_causal)
            layer_aux = getattr(layer.ffn, "aux_loss", None)
            if layer_aux is not None:
                aux = aux + layer_aux
        x = self.norm(x)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, d)
        logits = self.lm_head(x)  # (B, T, V)
        loss = None
        if targets is not None:
            # loss = mean over valid targets of -log p(target)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
        return ModelOutput(logits=logits, loss=loss, aux_loss=aux)
