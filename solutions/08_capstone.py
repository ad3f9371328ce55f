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
# # Lesson 08 project: your own optimised candidate, scored against the plain baseline
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/solutions/08_capstone.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# **Run time:** fast mode on CPU (2 cores): about 45 s of CPU time (estimated from a run on a
# loaded machine: the scorecard, then the whole pipeline); on one GPU: not yet measured.
#
# Lesson 08 built one candidate with every optimisation of the course and found what it
# costs. Now you design your own. You choose:
#
# - which layers use **sparse attention**, and with which pattern (lesson 02);
# - how many **K/V heads** (grouped-query attention, lesson 03);
# - which layers become a **mixture of experts**, how many experts, and the top-k (lesson 04);
# - the **balancer** of the multi-task fine-tuning (lesson 05).
#
# The shipped model is converted into your candidate (K/V heads mean-pooled, experts
# upcycled from the dense FFN) and given the same pre-training as the plain baseline (brief in
# fast mode; in standard mode, each model to its plateau, so its quality can be scored);
# the **scorecard** printed below scores it against the baseline, points per criterion. Then
# the whole capstone pipeline runs for your design (fine-tuning with your balancer, every
# release gate of lesson 07) and gives you the numbers for your written conclusion. Every choice
# trades something: fewer K/V heads save cache bytes but cost quality that a short training
# has to win back; more experts add capacity but cost decode time on a CPU.
#
# **Grading.** `my_design` and `design_to_config` are autograded (10 + 3 points). The
# written conclusion at the end is graded by a person with the rubric printed there (5
# points). From a terminal: `codex-lab grade exercises/08_capstone.py` (the scorecard trains
# two models briefly, about 15 s of CPU; on a loaded machine add `--timeout 120`).
# Inside this notebook, `check(...)` reuses the measurement you already made.

# %%
import sys

if "google.colab" in sys.modules:  # Colab only: install the course (torch/numpy untouched)
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/codex-lab/codex-lab@main"], check=True)

# %%
import torch

import codex_lab as cl
from codex_lab import ModelConfig, check
from codex_lab.lessons.l08_capstone import pipeline as cap
from codex_lab.lessons.l08_capstone.results import summary_table
from codex_lab.lessons.l08_capstone import scorecard as sc

cl.seed_everything(0)
torch.set_num_threads(1)  # the same one-thread setting the scorecard's timings were calibrated with
MODE = cl.resolve_mode()  # this notebook's mode: standard on a laptop, fast under CI, full on a GPU
CARD = "full" if MODE.name == "full" else "fast"  # the scorecard's margins (standard mode: the laptop's)
base_cfg = cl.load_pretrained().model.cfg
print(f"mode: {MODE.name} ({MODE.reason}); the grader scores at {sc.scoring_mode()} sizes on this machine")
print(f"the plain baseline: {base_cfg.n_layer} layers, {base_cfg.n_head} heads ({base_cfg.n_kv_head} K/V heads), "
      f"d_model {base_cfg.d_model}, FFN {base_cfg.ffn_hidden}, context {base_cfg.max_seq_len} tokens")
print("\nTHE SCORECARD (candidate against the baseline, same training budget):")
for c in sc.criteria(CARD):
    print(f"  {c.key:<13} {c.points} points: {c.rule}")


def attempt(fn, *args):
    """fn(*args), or None while the exercise still says 'not yet done'."""
    try:
        return fn(*args)
    except NotImplementedError:
        return None


# %% [markdown]
# ## Part 1: your design (10 points, on the scorecard)
# Return a dict with exactly these keys:
#
# | key | what | constraints |
# |---|---|---|
# | `sparse_layers` | layers (0-based) whose attention becomes sparse | non-empty, each in 0..n_layer-1 |
# | `pattern` | the sparse pattern, e.g. `"window:64+blockstride:64:4"` (lesson 02) | must attend to under 90% of the pairs at the model's context length |
# | `n_kv_head` | K/V heads | divides n_head, fewer than n_head |
# | `moe_layers` | layers whose FFN becomes a mixture of experts | non-empty, each in 0..n_layer-1 |
# | `n_experts`, `top_k` | experts per MoE layer, experts per token | n_experts >= 2, 1 <= top_k <= n_experts |
# | `balance` | fine-tuning balancer | one of `cl.STRATEGIES` (lesson 05) |
#
# Things worth knowing before you choose (all measured in lessons 02-05): the short fast-mode
# training cannot fully repair a big conversion; a window at least as long as the training
# sequences leaves those sequences' attention unchanged; an upcycled MoE layer computes
# exactly its old FFN at the start whatever k is, but every extra expert evaluated per token
# costs decode time; K/V heads are the only knob that moves the KV-cache bytes here.

# %%
def my_design():
    """Your candidate: a dict with the keys of the table above."""
    ### BEGIN SOLUTION
    # One sparse layer (the last), with a window as long as the fine-tuning sequences plus
    # a block stride, so it changes only long-range attention; group size 2 (the only GQA
    # choice with 4 heads that keeps more than one K/V head); one upcycled MoE layer with 4
    # experts and top-2 (half the expert compute of 8 experts); CoBa, the article's balancer.
    return {"sparse_layers": [3], "pattern": "window:128+blockstride:64:2", "n_kv_head": 2,
            "moe_layers": [3], "n_experts": 4, "top_k": 2, "balance": "coba"}
    ### END SOLUTION


# %%
design = attempt(my_design)
if design is None:
    print("my_design: not yet done; the cells that need your design skip until it returns one")
else:
    problems = sc.validate_design(design, base_cfg)
    print("your design:", design)
    print("valid" if not problems else "NOT VALID (fix before training):\n- " + "\n- ".join(problems))

# %% [markdown]
# ## Part 2: from design to config (3 points)
# Write the candidate's `ModelConfig`: the base config's shape (start from `base_cfg.to_dict()`),
# with `attn_patterns` (one spec per layer: the design's pattern for the sparse layers,
# `"dense"` for the others), `attn_impl="blocks"` (the sparse kernel with a CPU backward),
# `n_kv_head`, `moe_layers` (sorted), `n_experts`, `moe_top_k`, and `moe_ffn_hidden=None`
# (experts are copies of the dense FFN). Build it with `ModelConfig.from_dict(d)`.
# The package's own config builders are unavailable while the check runs.

# %%
def design_to_config(base_cfg, design):
    """The candidate's ModelConfig for ``design`` (a dict as in Part 1)."""
    ### BEGIN SOLUTION
    d = base_cfg.to_dict()
    d.update(
        attn_patterns=[design["pattern"] if i in design["sparse_layers"] else "dense" for i in range(base_cfg.n_layer)],
        attn_impl="blocks",
        n_kv_head=design["n_kv_head"],
        moe_layers=sorted(set(design["moe_layers"])),
        n_experts=design["n_experts"],
        moe_top_k=design["top_k"],
        moe_ffn_hidden=None,
    )
    return ModelConfig.from_dict(d)
    ### END SOLUTION


# %%
if check(design_to_config).status == "passed" and design is not None and not sc.validate_design(design, base_cfg):
    cfg = design_to_config(base_cfg, design)
    for i in range(cfg.n_layer):
        print(f"layer {i}: attention {cfg.pattern_for(i):<28} FFN {'MoE ' + str(cfg.n_experts) + ' experts, top-' + str(cfg.moe_top_k) if i in cfg.moe_layers else 'dense'}")
    print(f"KV-cache bytes per token (fp32): {cl.kv_bytes_per_token(cfg):,} vs the baseline's {cl.kv_bytes_per_token(base_cfg):,}")
else:
    print("skipped: the layer table needs design_to_config and a valid design")

# %% [markdown]
# ## Part 2b (derive it): the weights one decode step reads (2 points)
# At batch 1 a decode step is memory-bound: its time is mostly reading the weights it uses,
# once per token. Derive, from the config alone, how many parameters (numbers, not bytes) one
# step reads: every matrix, bias and norm gain of the layers it runs; in a MoE layer the router,
# the `moe_top_k` routed experts a token goes to (not all `n_experts`) and any shared experts;
# at the ends the final norm and the output layer (vocab x d). The input embedding is a lookup:
# one row of d. With `tie_embeddings` the output layer *is* that matrix: count it once.
# Return an int. Then compare your design with the baseline: which choice changes what a step
# reads, and by how much? (Sparse attention reads the same weights; what it saves is work over
# the cache.) The package's answer is not given: derive it.

# %%
def weights_read_per_token(cfg):
    """A ModelConfig -> parameters one batch-1 decode step reads (int)."""
    ### BEGIN SOLUTION
    d, hd = cfg.d_model, cfg.d_model // cfg.n_head
    kv = (cfg.n_kv_head or cfg.n_head) * hd  # K/V width: n_kv_head heads of head_dim
    # attention: q and o are d x d, k and v d x kv (+ their biases), and two norm gains per layer
    attn = 2 * d * d + 2 * d * kv + (d + 2 * kv if cfg.qkv_bias else 0)
    total = 0
    for i in range(cfg.n_layer):
        total += attn + 2 * d
        if i in cfg.moe_layers:
            h = cfg.moe_ffn_hidden or cfg.ffn_hidden
            # router d x E, then (top-k routed + shared) experts of 3 d h each
            total += d * cfg.n_experts + (cfg.moe_top_k + cfg.n_shared_experts) * 3 * d * h
        else:
            total += 3 * d * cfg.ffn_hidden  # SwiGLU: gate, up (d -> h) and down (h -> d)
    # final norm, the output layer V x d, and one embedding row unless it is the same matrix
    total += d + cfg.vocab_size * d + (0 if cfg.tie_embeddings else d)
    return total
    ### END SOLUTION


# %%
if check(weights_read_per_token).status == "passed" and design is not None and not sc.validate_design(design, base_cfg):
    cand = design_to_config(base_cfg, design)
    w_base, w_cand = weights_read_per_token(base_cfg), weights_read_per_token(cand)
    print(f"read per token: baseline {w_base:,}, your design {w_cand:,} parameters ({w_cand / w_base:.2f}x): "
          f"a memory-bound step would run at about {w_base / w_cand:.2f}x the baseline's speed from this alone")
else:
    print("Part 2b not yet done (or no valid design): the comparison runs once check(weights_read_per_token) passes")

# %% [markdown]
# ## Part 3: the scorecard, then the whole pipeline
# **Scored.** Your candidate is converted from the shipped model and given the same
# pre-training as the plain baseline (same batches: brief in fast mode, each model to its
# plateau in standard mode); then validation loss, the syntax and style gates of lesson 07,
# and decode speed at batch 8 (the two models alternate, so a change in the machine's load
# hits both). `check(my_design)` scores the grader's sizes (`sc.scoring_mode()`: fast on a
# CPU): in fast mode it reads this measurement, in standard mode it measures again.
# (The functional gate runs generated code in a
# subprocess sandbox, which the grader's own sandbox does not allow: it is reported below,
# not scored.)

# %%
measured = None
if design is not None and not sc.validate_design(design, base_cfg):
    measured = sc.measure(design, mode=MODE.name)
    for name in ("baseline", "candidate"):
        r = measured[name]
        print(f"{name:>9}: val loss {r['val_loss']:.3f} nats/token, KV {r['kv_bytes_per_token']:,} B/token, "
              f"decode {r['decode_tokens_per_s']:.0f} tokens/s (under load), "
              + ", ".join(f"{k} {v:.2f}" for k, v in r["gates"].items()))
    print()
    print(sc.format_scorecard(sc.score(measured), measured["mode"]))
else:
    print("skipped: the scorecard needs a valid design from my_design")

# %%
check(my_design)

# %% [markdown]
# **Reported, for your conclusion.** The whole capstone pipeline for your design: the same
# pre-training, then multi-task fine-tuning of both models with *your* balancer, and every
# release gate (functional tests in the sandbox, latency through the engine).

# %%
full = None
if measured is not None:
    ckpt = cl.load_pretrained()
    full = cl.run_capstone(ckpt.model.eval(), ckpt.tokenizer, cl.load_corpus(), cfg=sc.design_config(base_cfg, design),
                           sizes=cap.default_sizes(MODE.name), balance=design["balance"])
    print(summary_table(full.log))
    print("candidate passes every release gate against the baseline:", full.passed, full.reasons)
else:
    print("skipped: the pipeline needs a valid design from my_design")

# %% [markdown]
# ## Part 4: your conclusion (written, 5 points)
# Write, in this cell or one below, 150-300 words that answer:
#
# 1. What did your candidate win and what did it cost, *in this run's numbers* (KV bytes per
#    token, decode tokens/s, validation loss gap, each gate)?
# 2. Which single choice of your design do you think caused the largest cost, and what in
#    the numbers (or a second run with that choice changed) supports it?
# 3. Would you ship it? Say what the scorecard does not measure that you would want to know
#    first (longer contexts, a GPU, a longer training budget, real benchmarks).
#
# **Rubric** (the grader's, also in docs/INSTRUCTORS.md):
#
# | points | criterion |
# |---|---|
# | 2 | Cites this run's numbers for at least three criteria, with units, correctly (the scorecard's numbers, not the lesson's or the article's). |
# | 1 | Names one choice as the main cost and supports it with a measurement (a second run changing only that choice, or a number that isolates it); a plausible guess without evidence earns 0. |
# | 1 | Separates what holds at this scale from what would need checking at scale (fast-mode margins, CPU timings, 4-layer model), without claiming HumanEval-level results. |
# | 1 | A ship / don't-ship decision that follows from the numbers and names at least one thing the scorecard does not measure. |
#
# *Your conclusion:* ...

# %% [markdown]
# ## What we measured

# %%
if measured is not None:
    res = sc.score(measured)
    b, c = measured["baseline"], measured["candidate"]
    print(f"- Design: sparse layers {design['sparse_layers']} ({design['pattern']}), {design['n_kv_head']} K/V heads, "
          f"MoE layers {design['moe_layers']} ({design['n_experts']} experts, top-{design['top_k']}), balancer {design['balance']}.")
    print(f"- KV cache: {c['kv_bytes_per_token']:,} vs {b['kv_bytes_per_token']:,} bytes per token "
          f"({1 - c['kv_bytes_per_token'] / b['kv_bytes_per_token']:.0%} saved).")
    print(f"- Decode at batch 8 (under load): {measured['speed_ratio']:.2f}x the baseline's tokens/s.")
    print(f"- Validation loss after the same budget: {c['val_loss'] - b['val_loss']:+.3f} nats/token against the baseline "
          f"(the {CARD}-mode margin is {sc.VAL_MARGIN[CARD]:g}).")
    print(f"- Scorecard: {sum(r.points for r in res)}/{sum(r.max_points for r in res)}; failed: "
          f"{[r.key for r in res if not r.passed] or 'none'}.")
if full is not None:
    fb, fc = full.log.rows["baseline"], full.log.rows["candidate"]
    tasks = [k for k in fc if k.startswith("ft_val_")]
    print(f"- Whole pipeline with the {design['balance']} balancer: fine-tuned validation loss per task, candidate minus "
          "baseline: " + ", ".join(f"{k[7:]} {fc[k] - fb[k]:+.3f}" for k in tasks) + " nats/token.")
    print(f"- Release gates (all, including functional and latency): {'passed' if full.passed else 'refused: ' + '; '.join(full.reasons)}.")
else:
    print("nothing measured yet: write my_design")

# %% [markdown]
# ## Questions to think about
# 1. The fast-mode margin on validation loss is 0.5 nats/token, the full-mode one 0.10.
#    Why must a short training budget be judged with a wider margin, and what would a margin
#    that is too wide let through?
# 2. With 4 query heads, the only grouped-query choices are 2 or 1 K/V heads. How would the
#    trade-off change on a model with 32 heads?
# 3. Your sparse layers change nothing for sequences shorter than their window. What does
#    the scorecard then measure about them, and how would you test them properly?
# 4. Decode speed was measured on a CPU at batch 8. Which of your choices would look
#    different on a GPU, and why (lesson 04's grouped dispatch, lesson 06's memory-bound decoding)?
#
# ## Further reading
# - Ainslie et al. 2023, *GQA: training generalized multi-query transformer models from multi-head checkpoints* (mean-pooling, uptraining).
# - Komatsuzaki et al. 2022, *Sparse upcycling: training mixture-of-experts from dense checkpoints*.
# - Child et al. 2019, *Generating long sequences with sparse transformers*; Beltagy et al. 2020, *Longformer*.
# - Liu et al. 2023, *MFTCoder* (multi-task fine-tuning, CoBa convergence balancing).
# - Fedus et al. 2022, *Switch transformers*; Jiang et al. 2024, *Mixtral of experts*.
