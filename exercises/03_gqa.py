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

# GENERATED from solutions/ by `codex-lab exercises generate`: do not edit by hand.

# %% [markdown]
# # Lesson 03 exercises: grouped-query attention
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/solutions/03_gqa.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# Write each function between the markers, then run the `check(...)` cell below it.
# `check` runs the *public* checks and prints `passed`, `not yet done` or the failure.
# Cells that use your function run only once its check passes; until then they say so.
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

import codex_lab as cl
from codex_lab import check, seed_everything

seed_everything(0)


# %% [markdown]
# ## Exercise 1: one grouped-query decode step over a padded cache
# While generating, each sequence of a batch adds one token per step: its queries `q` are
# (B, H, D), one row per sequence. The KV cache holds `H_kv` key/value heads per layer,
# `k` and `v` of shape (B, H_kv, S, D), but sequence `b` has only `lengths[b]` cached tokens
# (positions `0 .. lengths[b] - 1`); the slots after them are padding with leftover values.
# With group size `g = H / H_kv`, query head `h` reads K/V head `h // g`. Return the
# attention output (B, H, D): `softmax(q . k_s / sqrt(D))` over the valid positions `s`,
# times `v_s`. (The newest token may read every cached token, so there is no causal mask;
# padding gets score `-inf`.) Reshaping `q` to (B, H_kv, g, D) avoids copying K/V.
# Off limits (absent while your file is graded): PyTorch's fused attention
# (`F.scaled_dot_product_attention`, its `torch.ops.aten` / math-kernel aliases) and
# `F.multi_head_attention_forward` (what `nn.MultiheadAttention` runs): write the softmax yourself.

# %%
def grouped_decode_attention(q, k, v, lengths):
    """q (B, H, D), k/v (B, H_kv, S, D), lengths (B,) -> (B, H, D) over each row's valid cache."""
    raise NotImplementedError("exercise grouped_decode_attention: not yet done")


# %%
if check(grouped_decode_attention).status == "passed":
    q = torch.randn(2, 8, 16)  # 2 sequences, 8 query heads
    k, v = torch.randn(2, 2, 10, 16), torch.randn(2, 2, 10, 16)  # 2 K/V heads (g = 4), 10 slots
    lengths = torch.tensor([10, 6])
    out = grouped_decode_attention(q, k, v, lengths)
    k[1, :, 6:], v[1, :, 6:] = 9.0, 9.0  # overwrite sequence 1's padding
    same = torch.allclose(out, grouped_decode_attention(q, k, v, lengths))
    print("output", tuple(out.shape), "| unchanged when the padding changes:", same)
else:
    print("skipped: this cell needs grouped_decode_attention (write it above)")


# %% [markdown]
# ## Exercise 2: KV-cache bytes
# Every layer caches a key and a value tensor of shape (batch, n_kv_head, seq_len, head_dim).
# Return the total number of bytes for elements of `bytes_per_elem` bytes (4 for float32,
# 2 for bfloat16), as an int.

# %%
def kv_cache_bytes(n_layer, n_kv_head, head_dim, seq_len, batch, bytes_per_elem):
    """Bytes of the whole KV cache (int)."""
    raise NotImplementedError("exercise kv_cache_bytes: not yet done")


# %%
if check(kv_cache_bytes).status == "passed":
    for name, (layers, kv, hd) in {"Qwen2.5-Coder-0.5B": (24, 2, 64), "same shape as MHA": (24, 14, 64)}.items():
        print(f"{name:<20} one 32k-token sequence, bf16: {kv_cache_bytes(layers, kv, hd, 32768, 1, 2) / 2**30:.3f} GiB")
else:
    print("skipped: this cell needs kv_cache_bytes (write it above)")


# %% [markdown]
# ## Exercise 3: mean-pool K/V heads (MHA -> GQA, Ainslie et al. 2023)
# A K or V projection weight `w` has `n_heads * head_dim` output rows (head `i` owns rows
# `i*head_dim .. (i+1)*head_dim - 1`) and `d_in` columns. Return the weight with `n_groups`
# heads, where new head `j` is the mean of the `g = n_heads / n_groups` consecutive old
# heads `j*g .. j*g + g - 1`.

# %%
def mean_pool_kv(w, n_heads, n_groups):
    """w (n_heads*head_dim, d_in) -> (n_groups*head_dim, d_in), each group's heads averaged."""
    raise NotImplementedError("exercise mean_pool_kv: not yet done")


# %%
if check(mean_pool_kv).status == "passed":
    model = cl.load_pretrained().model
    w = model.layers[0].attn.k_proj.weight.detach()  # (4 heads * 64, 256)
    for n_groups in (4, 2, 1):
        pooled = mean_pool_kv(w, 4, n_groups)
        back = pooled.reshape(n_groups, 1, 64, -1).expand(n_groups, 4 // n_groups, 64, w.shape[1]).reshape(w.shape)
        lost = float((w - back).norm() / w.norm())  # what sharing throws away, as a share of the weight
        print(f"{n_groups} K/V head(s): shape {tuple(w.shape)} -> {tuple(pooled.shape)}, relative change {lost:.2f}")
else:
    print("skipped: this cell needs mean_pool_kv (write it above)")
