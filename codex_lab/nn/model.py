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
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from codex_lab.nn import sparse  # noqa: F401  (registers the "blocks" and "flex" kernels)
from codex_lab.nn.attention import get_attention_impl, one_query_attention
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.kv_cache import LayerCache
from codex_lab.nn.layers import RMSNorm, SwiGLU, apply_rope, rope_tables
from codex_lab.nn.moba import moba_attention
from codex_lab.nn.moe import MoEFeedForward
from codex_lab.nn.patterns import AttentionPattern, MoBA, parse_pattern


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
        if isinstance(self.pattern, MoBA):
            # learned blocks (content-based): the explicit mask for "reference", else the fast path
            # (the native kernel where it applies, the same mask otherwise)
            y = moba_attention(q, k, v, self.pattern, "reference" if impl == "reference" else "fast", q_pos=positions, k_pos=k_pos)
        elif plain_causal and cache is None and self.pattern.is_dense:
            y = fn(q, k, v, None, is_causal=True)  # (B, H, T, hd)
        elif impl in ("sdpa", "reference"):
            # allowed[b, t, s] = pattern(q_pos, k_pos) and the key slot is filled
            allowed = self.pattern.allowed(positions[:, :, None], k_pos[:, None, :]) & (k_pos >= 0)[:, None, :]
            if impl == "sdpa" and T == 1 and getattr(cache, "one_query", False):
                # a cache that asks for it (the engine's compiled CPU step): one query per row in
                # plain tensor ops Inductor fuses, equal to SDPA (tests/test_one_query_attention.py)
                y = one_query_attention(q, k, v, allowed[:, None])  # mask (B, 1, 1, S) -> (B, H, 1, hd)
            else:
                y = fn(q, k, v, allowed[:, None])  # mask (B, 1, T, S) -> (B, H, T, hd)
        else:
            # sparse kernels work from the pattern and positions, never from an N x N mask
            y = fn(q, k, v, None, pattern=self.pattern, q_pos=positions, k_pos=k_pos)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)  # (B, T, H*hd)
        return self.o_proj(y)


def make_ffn(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    """The feed-forward of one layer: SwiGLU, or a mixture of experts for ``moe_layers``.

    An MoE module sets ``self.aux_loss`` (a scalar tensor, already weighted) on every
    forward; the model adds it to its output's ``aux_loss``.
    """
    if layer_idx in cfg.moe_layers:
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
        last_index: Tensor | None = None,
    ) -> ModelOutput:
        """Run the model.

        Args:
            idx: token ids (B, T).
            targets: next-token ids (B, T); -100 marks tokens that carry no loss.
            positions: absolute positions (B, T); default 0..T-1, or continuing after the
                cache's length when ``caches`` are given and positions are omitted.
            caches: one :class:`~codex_lab.nn.kv_cache.LayerCache` per layer, for decoding.
            last_only: compute logits for the last position only (generation).
            last_index: (B,) compute logits only at position ``last_index[b]`` of row b
                (right-padded batched prefill); logits (B, 1, V).
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
        # the check reads a value off the tensor (a graph break in torch.compile); a compiled
        # caller (the engine's fixed-shape step) checks positions before it calls
        max_pos = -1 if torch.compiler.is_compiling() else int(positions.max())
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
        if last_index is not None:
            x = x[torch.arange(B, device=x.device), last_index][:, None]  # (B, 1, d): row b at last_index[b]
        elif last_only:
            x = x[:, -1:, :]  # (B, 1, d)
        logits = self.lm_head(x)  # (B, T, V)
        loss = None
        if targets is not None:
            # loss = mean over valid targets of -log p(target)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
        return ModelOutput(logits=logits, loss=loss, aux_loss=aux)
