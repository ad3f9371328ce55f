# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: -all
#     formats: ipynb,py:percent
#     notebook_metadata_filter: kernelspec,jupytext
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 03 exercises: grouped-query attention
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/solutions/03_gqa.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# Write each function between the markers, then run the `check(...)` cell below it.
# `check` runs the *public* checks and prints `passed`, `not yet done` or the failure.
# Grade the whole file from a terminal with `codex-lab grade exercises/03_gqa.py`.
#
# **Run time:** fast mode on CPU (2 cores): ~10 s; on one GPU: not yet measured.

# %%
import sys

if "google.colab" in sys.modules:  # Colab only: install the course (torch/numpy untouched)
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/codex-lab/codex-lab@main"], check=True)

# %%
import math

import torch

from codex_lab import check, seed_everything
from codex_lab.nn.config import ModelConfig
from codex_lab.lessons.l03_gqa.experiments import mha_to_gqa
from codex_lab.nn.model import CodexModel

seed_everything(0)


# %% [markdown]
# ## Exercise 1: grouped attention forward
# `q` has `H` query heads, `k` and `v` have `H_kv` heads (`H_kv` divides `H`, group size
# `g = H / H_kv`). Query head `h` reads K/V head `h // g`. Return causal attention
# `softmax(q k^T / sqrt(D) + mask) v` of shape (B, H, T, D). You may repeat K/V per group
# (`repeat_interleave`) or, better, reshape `q` to (B, H_kv, g, T, D) and broadcast.

# %%
def grouped_attention(q, k, v):
    """q (B, H, T, D), k/v (B, H_kv, T, D) -> causal attention output (B, H, T, D)."""
    ### BEGIN SOLUTION
    B, H, T, D = q.shape
    n_kv = k.shape[1]
    qg = q.view(B, n_kv, H // n_kv, T, D)  # (B, Hkv, g, T, D)
    scores = qg @ k.unsqueeze(2).transpose(-2, -1) / math.sqrt(D)  # (B, Hkv, g, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)  # (B, Hkv, g, T, T)
    return (probs @ v.unsqueeze(2)).reshape(B, H, T, D)
    ### END SOLUTION


# %%
check(grouped_attention)
q, k = torch.randn(1, 8, 6, 16), torch.randn(1, 2, 6, 16)
print("output shape with 8 query heads and 2 K/V heads:", tuple(grouped_attention(q, k, k).shape))


# %% [markdown]
# ## Exercise 2: KV-cache bytes
# Every layer caches a key and a value tensor of shape (batch, n_kv_head, seq_len, head_dim).
# Return the total number of bytes for elements of `bytes_per_elem` bytes (4 for float32,
# 2 for bfloat16), as an int.

# %%
def kv_cache_bytes(n_layer, n_kv_head, head_dim, seq_len, batch, bytes_per_elem):
    """Bytes of the whole KV cache (int)."""
    ### BEGIN SOLUTION
    return 2 * n_layer * n_kv_head * head_dim * seq_len * batch * bytes_per_elem
    ### END SOLUTION


# %%
check(kv_cache_bytes)
for name, (layers, kv, hd) in {"Qwen2.5-Coder-0.5B": (24, 2, 64), "same shape as MHA": (24, 14, 64)}.items():
    print(f"{name:<20} one 32k-token sequence, bf16: {kv_cache_bytes(layers, kv, hd, 32768, 1, 2) / 2**30:.3f} GiB")


# %% [markdown]
# ## Exercise 3: mean-pool K/V heads (MHA -> GQA, Ainslie et al. 2023)
# A K or V projection weight `w` has `n_heads * head_dim` output rows (head `i` owns rows
# `i*head_dim .. (i+1)*head_dim - 1`) and `d_in` columns. Return the weight with `n_groups`
# heads, where new head `j` is the mean of the `g = n_heads / n_groups` consecutive old
# heads `j*g .. j*g + g - 1`.

# %%
def mean_pool_kv(w, n_heads, n_groups):
    """w (n_heads*head_dim, d_in) -> (n_groups*head_dim, d_in), each group's heads averaged."""
    ### BEGIN SOLUTION
    g = n_heads // n_groups
    head_dim = w.shape[0] // n_heads
    return w.reshape(n_groups, g, head_dim, -1).mean(dim=1).reshape(n_groups * head_dim, -1)
    ### END SOLUTION


# %%
check(mean_pool_kv)
model = CodexModel(ModelConfig(vocab_size=64, d_model=32, n_layer=1, n_head=4, max_seq_len=32))
w = model.layers[0].attn.k_proj.weight.detach()
ours = mean_pool_kv(w, 4, 2)
theirs = mha_to_gqa(model, 2).layers[0].attn.k_proj.weight.detach()
print("matches codex_lab.lessons.l03_gqa.experiments.mha_to_gqa:", torch.allclose(ours, theirs), "| shape", tuple(w.shape), "->", tuple(ours.shape))
