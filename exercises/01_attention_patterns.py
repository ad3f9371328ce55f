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
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# GENERATED from solutions/ by `codex-lab exercises generate`: do not edit by hand.

# %% [markdown]
# # Lesson 01 exercises: reading attention
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/exercises/01_attention_patterns.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# Write each function between the markers, then run the `check(...)` cell below it.
# `check` runs the *public* checks and prints `passed`, `not yet done` or the failure.
# Cells that use your function run only once its check passes; until then they say so.
# Grade the whole file from a terminal with `codex-lab grade exercises/01_attention_patterns.py`.
#
# **Run time:** fast mode on CPU (2 cores): ~10 s; on one GPU: not yet measured.

# %%
import sys

if "google.colab" in sys.modules:  # Colab only: install the course (torch/numpy untouched)
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/codex-lab/codex-lab@main"], check=True)

# %%
import inspect
import json.decoder

import torch

import codex_lab as cl
from codex_lab import check, seed_everything

seed_everything(0)
ckpt = cl.load_pretrained()
model, tok = ckpt.model, ckpt.tokenizer
ids = torch.tensor(tok.encode(inspect.getsource(json.decoder))[:256])  # 256 tokens of real code
maps = cl.attention_maps(model, ids)  # (L, H, T, T), the shipped model's attention
print("attention maps of the shipped model:", tuple(maps.shape))


# %% [markdown]
# ## Exercise 1: causal attention probabilities
# `q` and `k` are one layer's queries and keys, (H, T, D), already rotated by RoPE. Return
# the attention probabilities (H, T, T): `softmax(q k^T / sqrt(D))` over the keys, where a
# query at position `i` may only read keys `j <= i` (give the others score `-inf` before
# the softmax, so they get probability 0). Each row sums to 1.
# Off limits (absent while your file is graded): PyTorch's fused attention
# (`F.scaled_dot_product_attention`, its `torch.ops.aten` / math-kernel aliases) and
# `F.multi_head_attention_forward` (what `nn.MultiheadAttention` runs): write the softmax yourself.

# %%
def causal_attention_probs(q, k):
    """q, k (H, T, D) -> (H, T, T): row i is query i's distribution over keys j <= i."""
    raise NotImplementedError("exercise causal_attention_probs: not yet done")


# %%
if check(causal_attention_probs).status == "passed":
    q, k = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    p = causal_attention_probs(q, k)
    print("head 0:\n", p[0].numpy().round(2))
    print("rows sum to 1:", bool(torch.allclose(p.sum(-1), torch.ones(2, 5))))
else:
    print("skipped: this cell needs causal_attention_probs (write it above)")


# %% [markdown]
# ## Exercise 2: attention weight against distance
# For one head's map `p` (T, T), the weight query `i` puts on the key `d` tokens back is
# `p[i, i - d]`. Only the `T - d` queries `i >= d` have such a key. Return the (T,) tensor
# whose entry `d` is the mean of `p[i, i - d]` over those queries (hint: the diagonals of
# `p`, `torch.diagonal(p, offset=-d)`).

# %%
def distance_profile(p):
    """p (T, T) -> (T,): entry d = mean over i >= d of p[i, i - d]."""
    raise NotImplementedError("exercise distance_profile: not yet done")


# %%
if check(distance_profile).status == "passed":
    prof = distance_profile(maps[0, 0])  # layer 0, head 0
    T = maps.shape[-1]
    uniform = distance_profile(torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None])  # weight 1/(i+1) on each key
    for d in (0, 1, 2, 8, 64, 128):
        print(f"d={d:3d}: mean weight {float(prof[d]):.4f} (a uniform reader: {float(uniform[d]):.4f})")
    assert torch.allclose(prof, cl.mass_by_distance(maps)[0, 0], atol=1e-6)  # the package's analysis agrees
else:
    print("skipped: this cell needs distance_profile (write it above)")


# %% [markdown]
# ## Exercise 3: the share inside a window
# What fraction of a query's attention lands within `window` tokens, that is on keys with
# `0 <= i - j < window` (the query itself and the `window - 1` keys before it)? Average that
# share over the queries `i >= min_query` only: an early query has all its keys inside the
# window, so its share is 1 by construction. Return a Python float.

# %%
def window_share(p, window, min_query):
    """p (T, T) -> float: mean over queries i >= min_query of the weight on 0 <= i - j < window."""
    raise NotImplementedError("exercise window_share: not yet done")


# %%
if check(window_share).status == "passed":
    L, H = maps.shape[:2]
    for w in (16, 64, 128):
        shares = [window_share(maps[l, h], w, 128) for l in range(L) for h in range(H)]
        print(f"window {w:3d}: mean share {sum(shares) / len(shares):.2f}, least local head {min(shares):.2f}")
    assert abs(window_share(maps[0, 0], 64, 128) - float(cl.share_within(maps, 64, 128)[0, 0])) < 1e-6
else:
    print("skipped: this cell needs window_share (write it above)")

# %% [markdown]
# ## Exercise 4 (derive it): how local is a reader whose attention decays with distance?
# The uniform reader is one baseline. Another is a reader whose weight on a key falls by a
# factor `r` (0 < r < 1) per token of distance, normalised over the keys it can see: a query
# at position i puts weight proportional to $r^d$ on the key at distance d = 0..i (ALiBi's
# bias gives such a reader). Derive, in closed form, its share within `window` averaged over
# queries i >= `min_query` of a length-`T` sequence, as `window_share` measures it. Return a float.
#
# Hints: the weights of one query form a geometric series; what is its sum over d < w, and
# over all d <= i? Then: which `r` puts half the weight within 64 tokens for a far query?

# %%
def decay_share_within(T, window, min_query, r):
    """Mean over queries i in [min_query, T) of sum_{d < min(w, i+1)} r^d / sum_{d <= i} r^d (float)."""
    raise NotImplementedError("exercise decay_share_within: not yet done")


# %%
if check(decay_share_within).status == "passed":
    T_ = 512
    for r in (0.9, 0.98, 0.995):
        i = torch.arange(T_)
        d = (i[:, None] - i[None, :]).clamp(min=0).double()
        reader = torch.where(i[:, None] >= i[None, :], r ** d, torch.zeros(())).double()
        reader = reader / reader.sum(-1, keepdim=True)  # (T, T) rows of a decaying reader
        print(f"r = {r}: closed form {decay_share_within(T_, 64, 128, r):.4f}, "
              f"window_share of the matrix {window_share(reader, 64, 128):.4f}")
    print("half the weight within 64 tokens at a far query needs r = 0.5^(1/64) =", round(0.5 ** (1 / 64), 4))
else:
    print("skipped: this cell needs decay_share_within (write it above)")
