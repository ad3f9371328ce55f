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
# # Lesson 00: tour and set-up
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/notebooks/00_tour.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# **Takeaway:** A code model only scores the next token; you will turn those scores into
# code with a sampling rule and a generation loop of your own, held equal to the package's,
# and measure, with a 95% interval, the share of its generated functions that parse.
#
# **You will build:**
#
# - the sampling rule, logits `(B, V)` to token ids `(B,)` (greedy, temperature, top-k),
#   held equal to `codex_lab.infer.sampling.sample_next`;
# - the generation loop (seeded; it stops at end-of-text or after `n_new` tokens), held
#   equal to the package's `cl.generate`.
#
# **Run time:** fast mode on CPU: 8 s; full mode (GPU) and how this was measured: see the appendix.
#
# This course builds, piece by piece, the machinery that makes a code-generation model fast
# and good, and measures every claim instead of repeating it. This tour shows the pieces
# every later lesson stands on: the device, the embedded code corpus, the tokenizer, the
# shipped tiny model, the fast-mode switch and how exercises work; and you **build** the
# first mechanism of the course, the sampling loop that turns the model's logits into code
# (temperature and top-k), held equal to the package's `codex_lab.infer.sampling`.

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
MODE = cl.lesson_header("00")  # resolves the mode once, prints it, why, and the expected time here
FAST = MODE.fast  # laptop sizes (fast and standard mode)
device = cl.get_device()
for key, value in cl.describe_environment(MODE).items():
    print(f"{key:>10}: {value}")

# %% [markdown]
# ## The mode
# One choice sizes every step count and model: fast (CI's sizes, on automatically when `CI`
# is set), standard (the default on a CPU: fast sizes, quality experiments long enough to
# plateau) or full (the article's sizes, for a GPU). The first cell resolved it once, into
# `MODE`; every size below is `MODE.pick(fast=..., full=...)`, and the mode is passed to the
# package's functions that need it, never read behind your back.

# %%
N_PROMPTS = MODE.pick(fast=40, full=200)
print("fast mode:", FAST, "| prompts to score below:", N_PROMPTS)

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
# ## Build: from logits to the next token
# The model maps a context of token ids to **logits**: one score per vocabulary entry for the
# next token. Generation is a loop around it: pick a token, append it, run again. How the
# token is picked is the *sampling rule*:
#
# - **greedy** (temperature 0): the argmax, the same text every time;
# - **temperature** `T`: sample from `softmax(logits / T)`; `T < 1` sharpens the distribution
#   towards the argmax, `T > 1` flattens it towards uniform;
# - **top-k**: before sampling, keep only the `k` largest logits (the rest get `-inf`, so
#   probability 0), which cuts the long tail of unlikely tokens.
#
# Write the rule in one function, logits `(B, V)` to ids `(B,)`:

# %%
def sample_token(logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator) -> torch.Tensor:
    """logits (B, V) -> ids (B,): argmax at temperature 0, else softmax(logits / T) over the top-k."""
    if temperature == 0:
        return logits.argmax(dim=-1)  # (B,)
    scaled = logits.float() / temperature  # (B, V): logits / T
    if 0 < top_k < scaled.size(-1):
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]  # (B, 1): the k-th largest score per row
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))  # below it: probability 0
    probs = torch.softmax(scaled, dim=-1)  # (B, V)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)  # (B,)


# %% [markdown]
# **Held equal to the package.** `codex_lab.infer.sampling.sample_next` is the rule every
# generator, the engine and the server use. With the same random generator state, ours must
# draw exactly the same tokens, for many rows, temperatures and `k`:

# %%
from codex_lab.infer.sampling import sample_next

checked = 0
for trial in range(20):
    logits = torch.randn(8, tok.vocab_size, generator=torch.Generator().manual_seed(trial)) * 3  # (8, V)
    for temperature, top_k in ((0.0, 0), (0.7, 0), (1.0, 20), (1.5, 5), (0.3, 1)):
        ours = sample_token(logits, temperature, top_k, torch.Generator().manual_seed(trial))
        theirs = sample_next(logits, temperature=temperature, top_k=top_k, generator=torch.Generator().manual_seed(trial))
        assert torch.equal(ours, theirs), (trial, temperature, top_k)
        checked += len(ours)
print(f"sample_token == codex_lab's sample_next on {checked} rows (greedy, T = 0.3-1.5, top-k 0/1/5/20)")

# %% [markdown]
# What temperature does to the model's own next-token distribution after a real prompt:
# the probability of the top token and how many tokens hold 90% of the mass.

# %%
prompt = "def fibonacci(n):\n    "  # the body's indentation: the model continues inside the function
prompt_ids = tok.encode(prompt)
with torch.no_grad():
    next_logits = model(torch.tensor([prompt_ids], device=device)).logits[0, -1]  # (V,)
for temperature in (0.5, 1.0, 1.5):
    p = torch.softmax(next_logits.float() / temperature, dim=-1).sort(descending=True).values  # (V,)
    n90 = int((p.cumsum(0) < 0.9).sum()) + 1  # tokens needed to cover 90% of the probability
    print(f"T = {temperature}: top token {tok.decode([int(next_logits.argmax())])!r} has p = {p[0]:.2f}; "
          f"{n90} tokens hold 90% of the mass")

# %% [markdown]
# ## Build: the generation loop
# The plain loop re-runs the whole context for every new token (lesson 06 adds the KV
# cache that avoids it). It stops at end-of-text or after `n_new` tokens. Seeded, so the
# same seed gives the same text.

# %%
def generate_plain(prompt_ids: list[int], n_new: int, temperature: float = 0.0, top_k: int = 0, seed: int = 0) -> list[int]:
    """New token ids after ``prompt_ids``: the plain loop, no cache."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.tensor([prompt_ids], device=device)  # (1, T)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n_new):
            ctx = idx[:, -model.cfg.max_seq_len :]  # (1, <= L): the window the model was built for
            logits = model(ctx, last_only=True).logits[:, -1]  # (1, V): scores for the next token
            nxt = sample_token(logits, temperature, top_k, gen)  # (1,)
            if int(nxt) == tok.eot_id:
                break
            out.append(int(nxt))
            idx = torch.cat([idx, nxt[:, None]], dim=1)  # (1, T + 1)
    return out


t0 = time.perf_counter()
greedy_ids = generate_plain(prompt_ids, 48)
dt = time.perf_counter() - t0
assert greedy_ids == cl.generate_ids(model, prompt_ids, max_new_tokens=48, eos_id=tok.eot_id)[0]
sampled = {}
for seed in (1, 2):
    sampled[seed] = generate_plain(prompt_ids, 48, temperature=0.8, top_k=20, seed=seed)
    theirs = cl.generate_ids(model, prompt_ids, max_new_tokens=48, temperature=0.8, top_k=20, seed=seed, eos_id=tok.eot_id)[0]
    assert sampled[seed] == theirs, f"seed {seed}: our loop and codex_lab.generate_ids differ"
print("greedy (== cl.generate_ids):\n" + prompt + tok.decode(greedy_ids))
print(f"[{len(greedy_ids)} tokens in {dt:.2f} s = {len(greedy_ids) / dt:.1f} tokens/s with the plain loop]")
for seed, ids_ in sampled.items():
    print(f"--- T = 0.8, top-k 20, seed {seed} (== cl.generate_ids with the same seed):\n" + prompt + tok.decode(ids_))

# %% [markdown]
# Your loop and the package's give the same tokens, greedy and sampled, so from here on the
# course uses the package's `cl.generate` (and, for many prompts at once, the batched
# engine of lesson 06, which gives the same greedy tokens).

# %% [markdown]
# ## Does the code it writes parse?
# Prompts are signatures (+ docstrings) of functions in held-out files; each greedy
# completion is cut where the function ends and checked with `ast.parse`. A share measured
# on a few prompts says little (3 of 4 and 1 of 4 are both possible for the same model), so
# this uses enough prompts to give the share a 95% interval (Wilson's, for a proportion;
# `cl.wilson_interval`).

# %%
from codex_lab.lessons.l00_tour.experiments import syntax_rate

prompts = cl.function_prompts(corpus.texts("val"), N_PROMPTS)
t0 = time.perf_counter()
rate = syntax_rate(model, tok, prompts, max_new_tokens=MODE.pick(fast=48, full=96))
print(f"{rate.share.describe()} of generated functions parse ({time.perf_counter() - t0:.1f} s, batched engine)")
recorded = meta.get("syntax_validity")
if recorded is not None:
    print(f"shipped model's recorded rate: {recorded:.1%} over {meta.get('syntax_validity_prompts', '?')} prompts "
          f"({'inside' if rate.share.lo <= recorded <= rate.share.hi else 'outside'} this run's interval)")
print("so:", rate.verdict())
prompt0, body0, ok0 = next((s_ for s_ in rate.samples if s_[2]), rate.samples[0])
print("--- one completion:\n" + prompt0 + body0, "\nparses:", ok0)

# %% [markdown]
# ## Two attention paths, one answer
# The model's attention has a plain reference path (explicit scores and mask) and the
# fused `scaled_dot_product_attention` path. They must agree; whether the fused one is
# faster here is measured, in rounds that alternate the two (`cl.interleaved_times`), with
# the per-round spread of the ratio.

# %%
ref_cfg = cl.ModelConfig(**{**ckpt.config.to_dict(), "attn_impl": "reference"})
ref_model = cl.CodexModel(ref_cfg).to(device).eval()
ref_model.load_state_dict(model.state_dict())
x = torch.randint(0, tok.vocab_size, (4, 256), device=device)
with torch.no_grad():
    diff = (model(x).logits - ref_model(x).logits).abs().max().item()
    model(x), ref_model(x)  # warm-up
    # round-robin: one call of each per round, so a busy spell of the machine hits both alike
    wall, _ = cl.interleaved_times({"reference": lambda: ref_model(x), "SDPA": lambda: model(x)}, repeats=MODE.pick(fast=5, full=11))
speed = cl.timing_ratio(wall["reference"], wall["SDPA"], a="the reference path", b="SDPA")
print(f"max |logit difference| = {diff:.2e}")
print(speed.describe())
assert diff < 1e-3  # fp32 logits of size ~10; summation order differs between the paths

# %% [markdown]
# ## How exercises work
# Each lesson has an exercise notebook in `exercises/` (generated from `solutions/`).
# Fill in each function, run its `check(...)` cell, and grade the whole file with
# `codex-lab grade exercises/00_tour.py`. A pass means the *public checks* passed; the
# package's own function that answers an exercise is blocked while its check runs.
# `exercises/00_tour.ipynb` grades two warm-ups: `chars_per_token`, the tokenizer's
# compression pooled over several texts (section "The tokenizer" above has all it needs), and
# `cut_at_function_end`, the rule the syntax check above uses to cut a generated body where
# the function ends (`cl.cut_function` is the package's; write your own).
#
# ## What we measured
# Every number below was computed by this run; timings are interleaved rounds with their spread.

# %%
import math

print(f"- Corpus: {stats['train_files']:,} training and {stats['val_files']:,} validation files of the standard "
      "library, read from this Python install; nothing was downloaded.")
print(f"- Tokenizer: {summary['vocab_size']} tokens, {summary['chars_per_token']:.2f} characters per token on "
      "validation files; every string round-trips exactly.")
print(f"- Model: {model.num_params():,} parameters, validation loss {meta['val_loss']:.3f} nats/token "
      f"(perplexity {math.exp(meta['val_loss']):.1f}) after {meta['step']} training steps.")
print(f"- Sampling: your sample_token and generation loop gave codex_lab's tokens (greedy and seeded T = 0.8, "
      f"top-k 20); {len(greedy_ids)} greedy tokens at {len(greedy_ids) / dt:.1f} tokens/s with the plain loop "
      "(every token re-reads the whole context; lesson 06 makes this fast).")
print(f"- Code quality: {rate.share.describe()} of generated functions parse: {rate.verdict()}.")
print(f"- Kernels: the fused and reference attention paths agree to {diff:.1e} in the logits; {speed.describe()}.")

# %% [markdown]
# ## Questions to think about
# 1. Characters per token differs between code and English prose. Which parts of Python
#    source (indentation, names, punctuation) would you expect to compress best, and why
#    does that matter for the context length a model can read?
# 2. The validation split is chosen by a hash of each file's path, not at random per run.
#    What would go wrong in later lessons if it changed from one machine to the next?
# 3. Compare the shipped model's per-token loss with the share of its functions that parse
#    (both printed above). What does a per-token loss average over that "does the whole
#    function parse" does not, and why can a model with a good loss still break most functions?
# 4. The syntax share's interval came from about 40 prompts in fast mode. How many prompts
#    would halve its width, and why do a few prompts (4, say) tell you almost nothing?
# 5. Why keep a reference attention path in the package at all, when the fused one gives
#    the same logits? What would you lose if only the fused path existed?
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

# %% [markdown]
# ## Appendix: where the run-time figures come from
# The **Run time** line at the top and the figures below are read from one record,
# `codex_lab/assets/timings.json` (its `provenance` says how and when each was measured;
# `python scripts/update_figures.py` rewrites them, and `tests/test_figures.py` fails when
# the text and the record disagree). The header cell prints the estimate for your machine,
# scaled by its matrix-multiply calibration.
#
# - fast mode on CPU (CI's): the figure at the top;
# - standard mode (the CPU default): the report's section 00, 3 s on the reference machine
#   (`codex-lab --mode standard report --sections 00`);
# - full mode on one GPU: not yet measured (no GPU has been lent to the course).
