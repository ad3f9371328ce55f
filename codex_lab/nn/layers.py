"""The small layers of the model: RMSNorm, rotary position tables (RoPE) and SwiGLU.

Each is a few lines with its formula above the line that computes it; the model
(:mod:`codex_lab.nn.model`) and the mixture of experts (:mod:`codex_lab.nn.moe`) build on them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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
