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
# # Lesson 00: tour and set-up
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/notebooks/00_tour.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# **Run time:** fast mode on CPU: 15 s (2 idle cores, one math thread, measured with `scripts/time_notebooks.py` on 2026-12-01); full mode on one GPU: not yet measured.
#
# This course builds, piece by piece, the machinery that makes a code-generation model fast
# and good, and measures every claim instead of repeating it. This tour shows the pieces
# every later lesson stands on: the device, the embedded code corpus, the tokenizer, the
# shipped tiny model, one generation, the fast-mode switch, and how exercises work.

# %%
import sys

if "google.colab" in sys.modules:  # Colab only: install the course (torch/numpy untouched)
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/codex-lab/codex-lab@main"], check=True)

# %%
import time

import matplotlib.pyplot as plt
import torch

import codex_lab as cl
from codex_lab.data.tokenizer import tokenizer_summary

cl.seed_everything(0)
FAST = cl.lesson_header("00")  # prints the mode, why, and this lesson's expected time here
device = cl.get_device()
for key, value in cl.describe_environment().items():
    print(f"{key:>10}: {value}")

# %% [markdown]
# ## Fast mode
# One knob shrinks every step count and size: `CODEX_LAB_FAST=1` (on automatically when
# `CI` is set). `cl.pick(fast=..., full=...)` is how code chooses a size. Full mode is what
# you run on a GPU; fast mode keeps each notebook around a minute on a laptop CPU.

# %%
print("fast mode:", FAST, "| prompts to score below:", cl.pick(fast=4, full=32))

# %% [markdown]
# ## The embedded corpus: the Python standard library
# Every Python install ships about 1,800 files of real, reviewed code. Nothing is downloaded:
# `load_corpus()` reads the running interpreter's standard library (or any folder you pass),
# in a fixed order, without duplicates, with a train/validation split by a stable hash of
# each path (so it is the same on every machine).

# %%
corpus = cl.load_corpus()
stats = corpus.stats()
for key, value in stats.items():
    print(f"{key:>20}: {value:,}" if isinstance(value, int) else f"{key:>20}: {value}")
assert stats["train_files"] > 10 * stats["val_files"] > 0
print(corpus.val[0].path)
print(corpus.val[0].text[:300])

# %% [markdown]
# ## The tokenizer: byte-level BPE
# Trained with the `tokenizers` library on the corpus. Byte-level means every string
# round-trips exactly, so indentation survives. Special tokens for later lessons (end of
# text, fill-in-the-middle, task tags) are reserved up front.

# %%
ckpt = cl.load_pretrained(device)
tok, model = ckpt.tokenizer, ckpt.model
line = "    for i, item in enumerate(items):\n"
ids = tok.encode(line)
print(len(line), "characters ->", len(ids), "tokens:", [tok.decode([i]) for i in ids])
assert tok.decode(ids) == line
summary = tokenizer_summary(tok, corpus.texts("val")[:50])
print(f"vocabulary {summary['vocab_size']}, {summary['chars_per_token']:.2f} characters per token on validation files")
print("special tokens:", cl.SPECIAL_TOKENS)

# %% [markdown]
# ## The shipped model
# A Llama-style decoder (RMSNorm, rotary positions, SwiGLU) trained by `codex-lab train
# --preset tiny` on the standard library. Its recipe, curve and timing travel with it.

# %%
print(ckpt.config)
print(f"parameters: {model.num_params():,} ({model.num_params(non_embedding=True):,} without the embedding)")
meta = ckpt.meta
print(f"validation loss {meta['val_loss']:.3f} nats/token after {meta['step']} steps, "
      f"{meta['train_time_s'] / 60:.1f} min on {meta['device']}")
print("regenerate with:", meta.get("command", "codex-lab train --preset tiny"))
hist = meta["history"]
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot([h["step"] for h in hist], [h["train_loss"] for h in hist], label="train")
ax.plot([h["step"] for h in hist], [h["val_loss"] for h in hist], label="validation")
ax.set_xlabel("step"); ax.set_ylabel("loss (nats/token)"); ax.legend(); ax.set_title("shipped tiny model")
plt.show()

# %% [markdown]
# ## One generation
# Greedy decoding with the plain generator (the whole context re-run for every token;
# lesson 06 makes it fast and tests it against this one).

# %%
t0 = time.perf_counter()
g = cl.generate(model, tok, "def fibonacci(n):\n", max_new_tokens=48)
dt = time.perf_counter() - t0
print("def fibonacci(n):\n" + g.text)
print(f"[{len(g.ids)} tokens in {dt:.2f} s = {len(g.ids) / dt:.1f} tokens/s, finish: {g.finish_reason}]")

# %% [markdown]
# ## Does the code it writes parse?
# Prompts are signatures (+ docstrings) of functions in held-out files; each completion is
# cut where the function ends and checked with `ast.parse`.

# %%
prompts = cl.function_prompts(corpus.texts("val"), cl.pick(fast=4, full=32))
rep = cl.syntax_validity(model, tok, prompts, max_new_tokens=cl.pick(fast=48, full=96), progress=False)
print(f"{rep.rate:.0%} of {rep.n} generated functions parse (shipped model's recorded rate: {meta.get('syntax_validity', 'n/a')})")
prompt, body, ok = rep.samples[0]
print(prompt + body, "\nparses:", ok)

# %% [markdown]
# ## Two attention paths, one answer
# The model's attention has a plain reference path (explicit scores and mask) and the
# fused `scaled_dot_product_attention` path. They must agree; the fused one is faster.

# %%
ref_cfg = cl.ModelConfig(**{**ckpt.config.to_dict(), "attn_impl": "reference"})
ref_model = cl.CodexModel(ref_cfg).to(device).eval()
ref_model.load_state_dict(model.state_dict())
x = torch.randint(0, tok.vocab_size, (4, 256), device=device)
with torch.no_grad():
    diff = (model(x).logits - ref_model(x).logits).abs().max().item()
    t_fast = cl.median_ms(lambda: model(x), repeats=3)
    t_ref = cl.median_ms(lambda: ref_model(x), repeats=3)
print(f"max |logit difference| = {diff:.2e}; SDPA {t_fast:.1f} ms vs reference {t_ref:.1f} ms "
      f"({t_ref / t_fast:.2f}x)")
assert diff < 1e-3  # fp32 logits of size ~10; summation order differs between the paths

# %% [markdown]
# ## How exercises work
# Each lesson has an exercise notebook in `exercises/` (generated from `solutions/`).
# Fill in each function, run its `check(...)` cell, and grade the whole file with
# `codex-lab grade exercises/00_tour.py`. A pass means the *public checks* passed; the
# package's own function that answers an exercise is blocked while its check runs.
# `exercises/00_tour.ipynb` has one warm-up: the tokenizer's characters per token.
#
# ## What we measured
# Every number below was computed by this run (timings on a shared CPU are noisy).

# %%
import math

print(f"- Corpus: {stats['train_files']:,} training and {stats['val_files']:,} validation files of the standard "
      "library, read from this Python install; nothing was downloaded.")
print(f"- Tokenizer: {summary['vocab_size']} tokens, {summary['chars_per_token']:.2f} characters per token on "
      "validation files; every string round-trips exactly.")
print(f"- Model: {model.num_params():,} parameters, validation loss {meta['val_loss']:.3f} nats/token "
      f"(perplexity {math.exp(meta['val_loss']):.1f}) after {meta['step']} training steps.")
print(f"- Generation: {len(g.ids)} greedy tokens at {len(g.ids) / dt:.1f} tokens/s with the plain generator "
      "(every token re-reads the whole context; lesson 06 makes this fast).")
print(f"- Code quality: {rep.rate:.0%} of {rep.n} generated functions parse: a tiny model writes code-shaped text, "
      "not working programs.")
print(f"- Kernels: the fused and reference attention paths agree to {diff:.1e} in the logits; the fused one ran "
      f"{t_ref / t_fast:.2f}x the speed of the reference here.")

# %% [markdown]
# ## Questions to think about
# 1. Characters per token differs between code and English prose. Which parts of Python
#    source (indentation, names, punctuation) would you expect to compress best, and why
#    does that matter for the context length a model can read?
# 2. The validation split is chosen by a hash of each file's path, not at random per run.
#    What would go wrong in later lessons if it changed from one machine to the next?
# 3. The shipped model's per-token loss looks moderate, yet few of its functions parse. What
#    does a per-token loss average over that "does the whole function parse" does not?
# 4. Why keep a slow reference attention path in the package at all, when the fused one
#    gives the same logits and runs faster?
#
# ## Further reading
# - Sennrich, Haddow, Birch (2016), *Neural Machine Translation of Rare Words with Subword
#   Units* (BPE); Radford et al. (2019), *Language Models are Unsupervised Multitask
#   Learners* (byte-level BPE, GPT-2).
# - Touvron et al. (2023), *LLaMA: Open and Efficient Foundation Language Models* (RMSNorm,
#   SwiGLU, rotary positions: the architecture used here); Su et al. (2021), *RoFormer*.
# - Chen et al. (2021), *Evaluating Large Language Models Trained on Code* (Codex, HumanEval):
#   what "good at code" is measured by at scale.
# - Dao et al. (2022), *FlashAttention*: why a fused attention kernel is faster.
