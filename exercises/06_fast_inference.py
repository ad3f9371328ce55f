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
# # Lesson 06 exercises: fast inference
#
# Write each function between the markers, then run the `check(...)` cell below it.
# `check` runs the *public* checks and prints `passed`, `not yet done` or the failure.
# Grade the whole file from a terminal with `codex-lab grade exercises/06_fast_inference.py`.
#
# **Run time:** fast mode on CPU: ~6 s; on one GPU: not yet measured.

# %%
import sys

if "google.colab" in sys.modules:  # Colab only: install the course (torch/numpy untouched)
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/codex-lab/codex-lab@main"], check=True)

# %%
import math

import torch

from codex_lab import check, seed_everything

seed_everything(0)


# %% [markdown]
# ## Exercise 1: one decode step over a preallocated KV cache
# The buffers `k_buf`, `v_buf` are (B, H, L, D) and already hold the keys/values of
# positions `0 .. length-1`. Write the new key/value (B, H, 1, D) into slot `length`
# (in place), then return the attention of the query `q` (B, H, 1, D) over slots
# `0 .. length`: `softmax(q k^T / sqrt(D)) v`. Empty slots must not take part.

# %%
def cached_attention(k_buf, v_buf, length, q, k_new, v_new):
    """Write k_new/v_new at slot ``length``; return (B, H, 1, D) attention over slots 0..length."""
    raise NotImplementedError("exercise cached_attention: not yet done")


# %%
check(cached_attention)

# %% [markdown]
# ## Exercise 2: top-p (nucleus) filtering
# Keep, in each row of `logits` (B, V), the smallest set of most likely tokens whose
# probabilities add up to at least `p`; set every other logit to `-inf`. The most likely
# token is always kept; `p = 1` keeps everything.

# %%
def nucleus_filter(logits, p):
    """(B, V) logits -> (B, V) logits with tokens outside the top-p set at -inf."""
    raise NotImplementedError("exercise nucleus_filter: not yet done")


# %%
check(nucleus_filter)
x = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
print("p=0.8 keeps", (~torch.isinf(nucleus_filter(x, 0.8))).sum().item(), "of 4 tokens")

# %% [markdown]
# ## Exercise 3: one scheduler step (admission)
# A continuous-batching engine admits waiting requests at every step. `waiting` is a list
# of `(rid, tokens)` in arrival order, where `tokens` = prompt + max new tokens. Each
# request needs `ceil(tokens / block_size)` KV blocks. Admit requests first come, first
# served while a batch slot (`max_batch - n_running` are free) and enough free blocks
# remain; stop at the first request that does not fit (no overtaking, so a long request
# cannot starve). Return the admitted rids in order.

# %%
def schedule_step(waiting, n_running, free_blocks, max_batch, block_size):
    """Rids admitted this step (first come, first served, no overtaking)."""
    raise NotImplementedError("exercise schedule_step: not yet done")


# %%
check(schedule_step)
print(schedule_step([(0, 100), (1, 20), (2, 300)], n_running=2, free_blocks=12, max_batch=4, block_size=16))
