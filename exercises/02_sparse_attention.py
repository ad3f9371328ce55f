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
# # Lesson 02 exercises: sparse attention patterns
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/exercises/02_sparse_attention.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# Write each function between the markers, then run the `check(...)` cell below it.
# `check` runs the *public* checks and prints `passed`, `not yet done` or the failure.
# Cells that use your function run only once its check passes; until then they say so.
# Grade the whole file from a terminal with `codex-lab grade exercises/02_sparse_attention.py`.
#
# **Run time:** fast mode on CPU (2 cores): ~10 s; full mode on one GPU: not yet measured.

# %%
import sys

if "google.colab" in sys.modules:  # Colab only: install the course (torch/numpy untouched)
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/codex-lab/codex-lab@main"], check=True)

# %%
import torch

from codex_lab import check, seed_everything

seed_everything(0)


# %% [markdown]
# ## Exercise 1: the window + strided predicate
# The article's two-part pattern: a query at position `i` sees the key at `j` when the key
# is not in the future (`j <= i`) and either it is in the local window (`i - j < window`:
# the query itself and the `window - 1` keys before it) or it is on the stride
# (`(i - j) % stride == 0`, Child et al. 2019). `q_pos` and `k_pos` are integer tensors
# that broadcast against each other (for example `(n, 1)` and `(1, n)`). Return a bool tensor.

# %%
def window_strided_allowed(q_pos, k_pos, window, stride):
    """Bool tensor: may the query at ``q_pos`` attend to the key at ``k_pos``?"""
    raise NotImplementedError("exercise window_strided_allowed: not yet done")


# %%
if check(window_strided_allowed).status == "passed":
    pos = torch.arange(12)
    print(window_strided_allowed(pos[:, None], pos[None, :], 3, 4).int())
else:
    print("skipped: this cell needs window_strided_allowed (write it above)")

# %% [markdown]
# ## Exercise 2: attended pairs and density
# For a sequence of `n` tokens, count the (query, key) pairs the window + strided pattern
# allows, and its density: that count divided by the `n (n + 1) / 2` pairs of dense causal
# attention. Return `(pairs, density)`. (You may call your function from exercise 1.)

# %%
def pairs_and_density(n, window, stride):
    """(number of allowed pairs: int, fraction of causal pairs: float) for length n."""
    raise NotImplementedError("exercise pairs_and_density: not yet done")


# %%
if check(pairs_and_density).status == "passed":
    for n in [1024, 4096]:
        pairs, d = pairs_and_density(n, 128, 32)
        print(f"N={n}: {pairs:,} pairs, density {d:.3f}; the article's N*(w + N/s) = {n * (128 + n // 32):,}")
else:
    print("skipped: this cell needs pairs_and_density (write it above)")

# %% [markdown]
# ## Exercise 3: the tiles a block-sparse kernel computes
# A block-sparse kernel cuts the (n, n) mask into `block x block` tiles and computes only
# the tiles that hold at least one allowed pair. Given the bool mask and the block size,
# return the sorted list of `(query block, key block)` tiles to compute. The last block is
# partial when `n` is not a multiple of `block`.

# %%
def touched_tiles(mask, block):
    """Sorted list of (i, j): tiles of ``mask`` (n, n) holding at least one True."""
    raise NotImplementedError("exercise touched_tiles: not yet done")


# %%
if check(touched_tiles).status == "passed" and check(window_strided_allowed).status == "passed":
    n, bs = 1024, 128
    pos = torch.arange(n)
    for w, s in [(128, 32), (128, 16), (128, n + 1)]:  # stride n + 1: the window alone
        t = touched_tiles(window_strided_allowed(pos[:, None], pos[None, :], w, s), bs)
        name = f"window {w} + stride {s}" if s <= n else f"window {w} alone"
        print(f"{name:>22}: {len(t)} of {8 * 9 // 2} causal tiles")
else:
    print("skipped: this cell needs touched_tiles and window_strided_allowed (write them above)")
