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
# # Lesson 06 exercises: fast inference
#
# Write each function between the markers, then run the `check(...)` cell below it.
# `check` runs the *public* checks and prints `passed`, `not yet done` or the failure
# (naming the mistake it recognises). Cells that use your function run only once its check
# passes; until then they say so. Grade the whole file from a terminal with
# `codex-lab grade exercises/06_fast_inference.py`. While a check runs, the package's own
# versions (the KV caches and attention kernels, `top_p_filter`, the engine's scheduler, the
# speculative formulas) are blocked: write these yourself; plain PyTorch is fine.
#
# **Run time:** fast mode on CPU: ~6 s (estimate, loaded shared machine); on one GPU: not yet measured.

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
# Off limits (absent while your file is graded): PyTorch's fused attention
# (`F.scaled_dot_product_attention`, its `torch.ops.aten` / math-kernel aliases) and
# `F.multi_head_attention_forward` (what `nn.MultiheadAttention` runs): write the softmax yourself.

# %%
def cached_attention(k_buf, v_buf, length, q, k_new, v_new):
    """Write k_new/v_new at slot ``length``; return (B, H, 1, D) attention over slots 0..length."""
    raise NotImplementedError("exercise cached_attention: not yet done")


# %%
if check(cached_attention).status == "passed":
    # decoding one token at a time through the cache == causal attention over the whole sequence
    g = torch.Generator().manual_seed(0)
    B, H, T, D = 1, 2, 5, 4
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    kb, vb = torch.zeros(B, H, 8, D), torch.zeros(B, H, 8, D)
    steps = torch.cat([cached_attention(kb, vb, t, q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1]) for t in range(T)], dim=2)
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
    print("cached decode == causal attention over the sequence:", torch.allclose(steps, full, atol=1e-5))
else:
    print("exercise 1 not yet done: the comparison runs once check(cached_attention) passes")

# %% [markdown]
# ## Exercise 2: top-p (nucleus) filtering
# Keep, in each row of `logits` (B, V), the smallest set of most likely tokens whose
# probabilities add up to at least `p`; set every other logit to `-inf`. The most likely
# token is always kept; `p = 1` keeps everything.
# Off limits (absent while your file is graded): Hugging Face's `TopPLogitsWarper`.

# %%
def nucleus_filter(logits, p):
    """(B, V) logits -> (B, V) logits with tokens outside the top-p set at -inf."""
    raise NotImplementedError("exercise nucleus_filter: not yet done")


# %%
if check(nucleus_filter).status == "passed":
    x = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    print("probabilities", [round(v, 3) for v in torch.softmax(x, -1)[0].tolist()])
    for p in (0.5, 0.8, 0.95):
        print(f"p={p} keeps", int((~torch.isinf(nucleus_filter(x, p))).sum()), "of 4 tokens")
else:
    print("exercise 2 not yet done: the example runs once check(nucleus_filter) passes")

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
if check(schedule_step).status == "passed":
    # 100 tokens = 7 blocks, 20 = 2, 300 = 19: the third does not fit in the 3 blocks left
    print(schedule_step([(0, 100), (1, 20), (2, 300)], n_running=2, free_blocks=12, max_batch=4, block_size=16))
else:
    print("exercise 3 not yet done: the example runs once check(schedule_step) passes")

# %% [markdown]
# ## Exercise 4 (derive it): tokens per round when acceptance changes along the draft
# The lesson's formula $(1 - a^{\gamma+1}) / (1 - a)$ assumes every guess is accepted with the
# same probability $a$. A real draft is surer of its first guess than of its fifth. Derive, from
# the accept/reject rule of section 5, the expected number of tokens one verification round
# emits when guess $i$ faces the target's distribution `p[i]` and the draft's `q[i]`:
# `p` is (gamma + 1, V) (its last row is where the bonus token would be drawn), `q` is
# (gamma, V). Treat the rows as given (the context each guess sees is fixed). Return a float.
#
# Hints, to work out on paper first: with what probability is guess $i$ accepted, given that
# the ones before it were? What does a round emit when it stops at guess $j$, and when it
# accepts all $\gamma$? The cell under the check compares your formula with a simulation
# of the rule itself.
# Off limits (absent while your file is graded): the package's `expected_tokens_per_round`.

# %%
def expected_tokens(p, q):
    """p (gamma + 1, V), q (gamma, V) probabilities -> expected tokens one round emits (float)."""
    raise NotImplementedError("exercise expected_tokens: not yet done")


# %%
if check(expected_tokens).status == "passed":
    g = torch.Generator().manual_seed(0)
    gamma, V = 4, 12
    p = torch.softmax(torch.randn(gamma + 1, V, generator=g) * 2, -1)
    # the draft drifts from the target along the draft: surer early than late
    q = torch.stack([torch.softmax(torch.log(p[i]) + 0.6 * i * torch.randn(V, generator=g), -1) for i in range(gamma)])
    emitted = []
    for _ in range(20000):  # simulate the rule: accept x ~ q_i with probability min(1, p_i(x) / q_i(x))
        n = 0
        while n < gamma:
            x = int(torch.multinomial(q[n], 1, generator=g))
            if float(torch.rand((), generator=g)) >= min(1.0, float(p[n, x] / q[n, x])):
                break
            n += 1
        emitted.append(n + 1)  # the accepted prefix, then the correction (or the bonus)
    sim = sum(emitted) / len(emitted)
    se = (sum((e - sim) ** 2 for e in emitted) / (len(emitted) - 1) / len(emitted)) ** 0.5
    print(f"your formula {expected_tokens(p, q):.3f}; a simulation of the rule {sim:.3f} (+- {1.96 * se:.3f}, 95%)")
else:
    print("exercise 4 not yet done: the simulation runs once check(expected_tokens) passes")
