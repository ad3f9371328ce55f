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
# # Lesson 04 exercises: mixture of experts
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/solutions/04_moe.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# Write each function between the markers, then run the `check(...)` cell below it.
# `check` runs the *public* checks and prints `passed`, `not yet done` or the failure.
# Cells that use your function run only once its check passes; until then they say so.
# Grade the whole file from a terminal with `codex-lab grade exercises/04_moe.py`.
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

seed_everything(0)


# %% [markdown]
# ## Exercise 1: top-k routing with renormalised weights
# The router gives each token a logit per expert, `logits` of shape (N, E). Turn them into
# probabilities with a softmax, keep the `k` most probable experts per token, and divide
# their probabilities by their sum so the k weights add up to 1 (Mixtral's rule).
# Return `(expert_idx, weights)`, both (N, k).

# %%
def top_k_route(logits, k):
    """(N, E) logits -> expert_idx (N, k) int64 and renormalised weights (N, k)."""
    raise NotImplementedError("exercise top_k_route: not yet done")


# %%
if check(top_k_route).status == "passed":
    idx, w = top_k_route(torch.randn(3, 8), 2)
    print("experts:", idx.tolist(), "\nweights:", [[round(v, 3) for v in row] for row in w.tolist()])
else:
    print("skipped: this cell needs top_k_route (write it above)")


# %% [markdown]
# ## Exercise 2: the load-balancing loss (Switch Transformer)
# With `f_e` the share of all N*k assignments that went to expert e and `P_e` the mean
# router probability of e over the N tokens, the loss is `E * sum_e f_e * P_e`. It is 1.0
# when the load is perfectly even and grows to E when one expert takes everything. `f` is a
# count (no gradient); the gradient reaches the router through `P`.

# %%
def balancing_loss(probs, expert_idx):
    """probs (N, E), expert_idx (N, k) -> scalar tensor E * sum_e f_e P_e."""
    raise NotImplementedError("exercise balancing_loss: not yet done")


# %%
if check(balancing_loss).status == "passed":
    for temp in (0.1, 1.0, 10.0):  # a sharper router (larger logits) concentrates the load
        probs = torch.softmax(temp * torch.randn(64, 8) + torch.linspace(0, 2, 8), -1)
        print(f"logit scale {temp:4}: balancing loss {float(balancing_loss(probs, probs.topk(2, -1).indices)):.3f} "
              "(1.0 = even, 8.0 = one expert takes everything)")
else:
    print("skipped: this cell needs balancing_loss (write it above)")


# %% [markdown]
# ## Exercise 3: capacity-limited dispatch
# Each expert accepts at most `capacity` assignments. Serve all first choices before any
# second choice (slot by slot), and within a slot, earlier tokens first. Return a bool mask
# (N, k): True where the assignment is kept, False where it is dropped.

# %%
def capacity_mask(expert_idx, n_experts, capacity):
    """expert_idx (N, k) -> keep (N, k) bool; at most `capacity` kept per expert."""
    raise NotImplementedError("exercise capacity_mask: not yet done")


# %%
if check(capacity_mask).status == "passed":
    idx = torch.zeros(8, 1, dtype=torch.long)  # every token wants expert 0
    print("kept with capacity 2:", capacity_mask(idx, 4, 2).view(-1).tolist())
    idx = torch.stack([torch.randperm(8)[:2] for _ in range(64)])  # 64 tokens, top-2 of 8 experts
    for factor in (1.0, 1.25, 2.0):
        cap = int(-(-factor * 64 * 2 // 8))  # C = ceil(factor * N * k / E)
        print(f"capacity factor {factor}: C = {cap}, dropped {float((~capacity_mask(idx, 8, cap)).float().mean()):.1%}")
else:
    print("skipped: this cell needs capacity_mask (write it above)")

# %% [markdown]
# ## Exercise 4 (derive it): why a capacity factor of 1 drops tokens even when routing is balanced
# Suppose a router is perfectly balanced *in expectation*: each of `n_tokens` tokens picks one
# expert (top-1) uniformly at random among `n_experts`, independently. Each expert keeps at most
# `capacity` tokens. Derive the expected **fraction of tokens dropped**, exactly (no simulation),
# as a float. At `capacity = n_tokens / n_experts` (capacity factor 1) the expected load of every
# expert is exactly its capacity, yet the answer is not 0: your formula says how far from 0.
#
# Hints, to work out on paper first: how is one expert's load distributed? How many tokens
# does an expert with load $n$ drop? Is $E[\max(0, n - C)]$ the same as $\max(0, E[n] - C)$?
# The cell under the check compares your formula with `capacity_mask` on random routings.

# %%
def expected_drop_fraction(n_tokens, n_experts, capacity):
    """Expected share of tokens dropped (float in [0, 1]) under uniform independent top-1 routing."""
    raise NotImplementedError("exercise expected_drop_fraction: not yet done")


# %%
if check(expected_drop_fraction).status == "passed":
    for factor in (1.0, 1.25, 1.5, 2.0):
        cap = int(factor * 64 / 8)
        g = torch.Generator().manual_seed(0)
        sims = [float((~capacity_mask(torch.randint(0, 8, (64, 1), generator=g), 8, cap)).float().mean())
                for _ in range(500)]
        print(f"capacity factor {factor}: C = {cap}, your formula {expected_drop_fraction(64, 8, cap):.2%}, "
              f"500 random routings {sum(sims) / len(sims):.2%}")
else:
    print("skipped: this cell needs expected_drop_fraction (write it above)")
