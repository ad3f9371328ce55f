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
# # Lesson 05 exercises: balanced multi-task losses
#
# Write each function between the markers, then run the `check(...)` cell below it.
# `check` runs the *public* checks and prints `passed`, `not yet done` or the failure
# (naming the mistake it recognises). Cells that use your function run only once its check
# passes; until then they say so. Grade the whole file from a terminal with
# `codex-lab grade exercises/05_multitask.py`. While a check runs, the package functions
# that compute the same thing (`codex_lab.token_losses`, the balancers, the CoBa helpers)
# are blocked: write these yourself; plain PyTorch is fine.
#
# **Run time:** fast mode on CPU: ~5 s (estimate, loaded shared machine); on one GPU: not yet measured.

# %%
import sys

if "google.colab" in sys.modules:  # Colab only: install the course (torch/numpy untouched)
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/codex-lab/codex-lab@main"], check=True)

# %%
import torch
import torch.nn.functional as F

from codex_lab import check, load_pretrained, seed_everything

seed_everything(0)


# %% [markdown]
# ## Exercise 1: the loss counts only valid tokens
# In a fine-tuning batch, the prompt and the padding carry target `-100`: only the answer
# tokens ("valid tokens") are learned. Return the mean cross-entropy over the positions whose
# target is not -100, as a scalar tensor. `logits` is (B, T, V), `targets` (B, T).
# Off limits (absent while your file is graded): PyTorch's built-in losses `F.cross_entropy`
# and `F.nll_loss` (whose `ignore_index=-100` default would do the masking for you) and their
# `torch._C._nn` / `torch.ops.aten` aliases: write `log_softmax`, the gather and the mean.

# %%
def masked_token_loss(logits, targets):
    """Mean of -log p(target) over positions with targets != -100 (scalar tensor)."""
    ### BEGIN SOLUTION
    B, T, V = logits.shape
    valid = targets != -100  # (B, T)
    logp = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    nll = -logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, T)
    return (nll * valid).sum() / valid.sum()
    ### END SOLUTION


# %%
done_1 = check(masked_token_loss).status == "passed"

# %% [markdown]
# Use it on the shipped model: a code prompt whose answer is the function body. Only the
# answer's tokens count; with every position counted, the loss also scores how well the
# model "predicts" the prompt, which fine-tuning does not train.

# %%
if done_1:
    ckpt = load_pretrained("cpu")
    tok = ckpt.tokenizer
    prompt_ids = tok.encode("def mean(xs):\n    ")
    answer_ids = tok.encode("return sum(xs) / len(xs)\n")
    ids = torch.tensor([prompt_ids + answer_ids])  # (1, n)
    x, y = ids[:, :-1], ids[:, 1:].clone()  # (1, n-1): y is x shifted by one
    y[:, : len(prompt_ids) - 1] = -100  # the prompt's targets carry no loss
    with torch.no_grad():
        logits = ckpt.model(x).logits  # (1, n-1, V)
    print(f"answer tokens only: {float(masked_token_loss(logits, y)):.3f} nats/token; "
          f"every position: {float(F.cross_entropy(logits[0], ids[0, 1:])):.3f}")
else:
    print("exercise 1 not yet done: this demo runs once check(masked_token_loss) passes")

# %% [markdown]
# ## Exercise 2: each task averaged over its own tokens (MFTCoder "case3")
# Pooling all valid tokens lets the task with the most (and longest) answers dominate.
# Instead: for every task k present in the batch, L_k = (sum of its valid-token losses) /
# (its number of valid tokens); return the plain mean of L_k over the tasks present.
# `token_loss` and `targets` are (B, T), `task` (B,) holds each row's task index.

# %%
def task_token_mean_loss(token_loss, targets, task, n_tasks):
    """(1/K') * sum over the K' tasks present of (task's valid-token loss sum / its valid tokens)."""
    ### BEGIN SOLUTION
    valid = (targets != -100).float()  # (B, T)
    row_sum = (token_loss * valid).sum(dim=1)  # (B,)
    row_n = valid.sum(dim=1)  # (B,)
    means = []
    for k in range(n_tasks):
        rows = task == k
        n = row_n[rows].sum()
        if n > 0:
            means.append(row_sum[rows].sum() / n)
    return torch.stack(means).mean()
    ### END SOLUTION


# %%
if check(task_token_mean_loss).status == "passed":
    # a big task (0) with long answers and a small task (1) with short, badly predicted ones
    tl = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.2, 1.0, 0.8, 1.0], [5.0, 0.0, 0.0, 0.0]])  # (B, T)
    tg = torch.tensor([[7, 7, 7, 7], [7, 7, 7, 7], [7, -100, -100, -100]])
    tk = torch.tensor([0, 0, 1])
    pooled = (tl * (tg != -100)).sum() / (tg != -100).sum()
    print(f"pooled over tokens: {float(pooled):.2f} (the small task is 1 token of 9); "
          f"case 3: {float(task_token_mean_loss(tl, tg, tk, 2)):.2f} (each task counts half)")
else:
    print("exercise 2 not yet done: the comparison runs once check(task_token_mean_loss) passes")

# %% [markdown]
# ## Exercise 3: convergence weights from validation curves
# `history` is (W, K): the last W validation losses of K tasks, oldest first.
# 1. Normalise each task by its first loss: h = history / history[0].
# 2. Fit a least-squares slope per task against steps 0..W-1:
#    alpha_k = sum_t (t - tbar)(h_tk - hbar_k) / sum_t (t - tbar)^2.
# 3. Relative convergence score: RCS = softmax(K * alpha / sum_j |alpha_j|) (slow tasks,
#    alpha near 0, score higher than fast ones, alpha very negative).
# 4. A diverging task (alpha_k > 0) gets RCS 0; renormalise RCS to sum 1.
# 5. Return w = floor + (1 - K * floor) * RCS, so every weight is at least `floor`.

# %%
def convergence_weights(history, floor):
    """CoBa-style task weights (K,) from a (W, K) validation-loss history."""
    ### BEGIN SOLUTION
    W, K = history.shape
    h = history / history[0]
    t = torch.arange(W, dtype=h.dtype)
    t = t - t.mean()
    alpha = (t[:, None] * (h - h.mean(dim=0))).sum(dim=0) / (t**2).sum()  # (K,)
    rcs = torch.softmax(K * alpha / alpha.abs().sum(), dim=0)
    rcs = torch.where(alpha > 0, torch.zeros_like(rcs), rcs)
    rcs = rcs / rcs.sum()
    return floor + (1 - K * floor) * rcs
    ### END SOLUTION


# %%
if check(convergence_weights).status == "passed":
    w = convergence_weights(torch.tensor([[4.0, 2.0], [3.0, 1.95], [2.2, 1.9]]), 0.05)
    print("fast task vs slow task weights:", [round(x, 3) for x in w.tolist()])
else:
    print("exercise 3 not yet done: the example runs once check(convergence_weights) passes")
