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
# # Lesson 08: capstone: one model with every optimisation, trained, gated and served
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/notebooks/08_capstone.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# **Takeaway:** You will answer the question a team asks before shipping, whether the
# optimised model is better than the plain one it replaces, by measuring what each
# optimisation buys (speed, KV-cache memory) and costs (quality, with an interval), alone
# and together, and letting the release gates decide.
#
# **You will build:**
#
# - the speed ablation: the shipped model converted with one optimisation at a time, then
#   all of them (`my_ablation_configs`, held equal to `ablation_configs`), timed in
#   interleaved rounds;
# - the quality cost of one design: paired per-seed differences and the non-inferiority
#   rule, held equal to the package's `tr.trade_costs`.
#
# **Run time:** fast mode on CPU: 17 s; full mode (GPU) and how this was measured: see the appendix.
#
# Every earlier lesson took one claim of the article apart. Here they come together the way
# the article proposes, in one model, and we ask the question a team would ask before
# shipping it: *is the optimised model better than the plain one it replaces?*
#
# 1. one config (`codex_lab.lessons.l08_capstone.pipeline.capstone_config`): dense attention in the first layers,
#    window + block-stride attention in the deeper ones (lesson 02), grouped-query attention
#    (lesson 03), mixture-of-experts feed-forwards in the deep layers (lesson 04);
# 2. built from the shipped model, not from scratch: K/V heads mean-pooled, every expert a copy
#    of the dense FFN it replaces ("sparse upcycling"), each conversion checked;
# 3. the same brief pre-training for the candidate and the plain baseline (the sparse layers
#    train through the block-sparse kernel on CPU);
# 4. the same multi-task fine-tuning with balanced losses (lesson 05);
# 5. the release gates of lesson 07 (syntax, function, style, latency): no worse than the baseline;
# 6. a registry and a live canary with automatic promotion or rollback;
# 7. a closing table: each seed claim beside what this notebook measured;
# 8. the scorecard of the lesson's project, applied to this candidate: in the project
#    (`exercises/08_capstone.ipynb`, graded with `codex-lab grade exercises/08_capstone.py`)
#    you design your own candidate and it is scored on that scorecard, criterion by criterion;
# 9. the measured trade: each optimisation alone (GQA at group sizes 4 and 8) and all together,
#    every design trained to its own plateau after conversion (at a smaller geometry), and on
#    those same trained models what each costs (quality, with an interval) and buys (prefill
#    and decode speed at a long context, KV-cache memory), and which design the gates promote.
#
# Steps 3-6 run at a brief budget (a few steps in fast and standard mode): they show every
# stage working, and the training-state rule says whether that budget reached a plateau.
# The decision at the end comes from step 9.

# %%
import sys

if "google.colab" in sys.modules:  # Colab only: install the course (torch/numpy untouched)
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/codex-lab/codex-lab@main"], check=True)

# %%
import math
import tempfile
import time

import matplotlib.pyplot as plt
import torch

import codex_lab as cl
from codex_lab.lessons.l08_capstone import pipeline as cap
from codex_lab.lessons.l08_capstone.architecture import ablation_configs, capstone_config, describe, max_logit_gap
from codex_lab.lessons.l08_capstone.claims import VERDICTS, capstone_claims
from codex_lab.lessons.l08_capstone.release import canary_release
from codex_lab.lessons.l08_capstone.results import StageLog, summary_table
from codex_lab.nn.surgery import convert
from codex_lab.nn.patterns import parse_pattern
from codex_lab.nn.sparse import tiles_computed

cl.seed_everything(0)
MODE = cl.lesson_header("08")  # resolves the mode once, prints it, why, and the expected time here
FAST = MODE.fast  # laptop sizes (fast and standard mode)
T_START = time.perf_counter()
device = cl.get_device()
sizes = cap.default_sizes(MODE.name)
print("fast mode:", FAST, "| device:", device, "| torch threads:", torch.get_num_threads())
print(sizes)

# %% [markdown]
# ## 1. One config with every optimisation
# The shipped model has 4 layers of 4 heads. The candidate keeps its shape and changes three
# things: layers 2-3 attend through a 64-token window plus every 4th 64-token key block
# (block-granular, so a block-sparse kernel skips whole tiles; lesson 02), K/V heads are
# shared by groups of 2 query heads (lesson 03), and the FFNs of layers 2-3 become 8 experts
# with top-2 routing (the seed recommends 8-16 experts, top-k 2-4; lesson 04).
#
# With 4 query heads, the seed's group size 4-8 would mean a single K/V head (multi-query);
# group size 2 pools fewer heads together, so the conversion changes the model less before
# the short training below (lesson 03 measures the cost of each group size over seeds).

# %%
ckpt = cl.load_pretrained(device=device)
tok, base = ckpt.tokenizer, ckpt.model.eval()
cand_cfg = capstone_config(base.cfg)
log = StageLog()
models = cap.build_models(base, cand_cfg, log=log)
for name, m in models.items():
    d = describe(m, seq_len=base.cfg.max_seq_len)
    print(f"{name:>9}: layers {d['layers']}")
    print(f"{'':>9}  params {d['params']:,}, active per token {d['active_params']:,}, K/V heads {d['n_kv_head']}, "
          f"KV bytes/token (fp32) {d['kv_bytes_per_token']:,}, mean attention density at N={base.cfg.max_seq_len}: "
          f"{d[f'attn_density@{base.cfg.max_seq_len}']:.3f}")
cand = models["candidate"]
assert cand.cfg.moe_layers == [2, 3] and cand.cfg.n_kv_head == 2 and cand.cfg.attn_patterns[:2] == ["dense", "dense"]

# %% [markdown]
# What the sparse layers save grows with length. The article's cost N(w + N/s) and the exact
# count of attended pairs, and the share of 128-token tiles the kernel computes:

# %%
pat = parse_pattern(cand_cfg.attn_patterns[-1])
print(f"deep-layer pattern {pat.spec}")
print(f"{'N':>6} {'density':>8} {'tiles computed':>14} {'pairs':>12} {'causal pairs':>13}")
dens = {}
for n in (256, 1024, 4096):
    causal_tiles = (n // 128) * (n // 128 + 1) // 2
    dens[n] = pat.density(n)
    print(f"{n:>6} {dens[n]:>8.3f} {tiles_computed(pat, n, 128) / causal_tiles:>14.0%} {pat.pairs(n):>12,} {n * (n + 1) // 2:>13,}")
# exponent of growth of the attended pairs between N=1024 and 4096: log(pairs ratio) / log(4)
growth = math.log(pat.pairs(4096) / pat.pairs(1024)) / math.log(4)
print(f"pairs grow like N^{growth:.2f} between N=1024 and 4096 (dense causal: N^2.00; N sqrt N: N^1.50)")
assert dens[4096] < dens[1024] < dens[256] <= 1.0

# %% [markdown]
# ## 2. Conversion, checked
# Each conversion has an oracle. Upcycling alone (experts = copies of the dense FFN) must not
# change the model: the top-2 weights are renormalised to sum to 1, so the layer computes
# exactly its old FFN. Sparse layers see every key while the text is shorter than their
# window, so for a 60-token input only GQA changes the function. The full conversion then
# costs some validation loss, which training has to win back.

# %%
idx = torch.randint(0, tok.vocab_size, (2, 60), generator=torch.Generator().manual_seed(0)).to(device)  # (B, T)
only_moe = convert(base, capstone_config(base.cfg, dense_layers=4, n_kv_head=4, moe_layers=[2, 3]))
only_sparse = convert(base, capstone_config(base.cfg, n_kv_head=4, moe_layers=[]))
gaps = {"upcycled MoE only": max_logit_gap(base, only_moe, idx),
        "sparse layers only (T=60 < window)": max_logit_gap(base, only_sparse, idx),
        "all three": max_logit_gap(base, cand, idx)}
for k, v in gaps.items():
    print(f"max |logit difference| vs the shipped model, {k}: {v:.2e}")
# fp32 logits are O(10); different summation order (grouped expert matmuls) moves them by ~1e-6
assert gaps["upcycled MoE only"] < 1e-4 and gaps["sparse layers only (T=60 < window)"] < 1e-4
assert gaps["all three"] > 1e-2  # mean-pooling K/V heads is a real change

# %% [markdown]
# ## 3. Brief pre-training, the same for both
# Both models see the same batches with the same optimiser (`cap.train_with_curve`: the brief
# pre-training of `codex_lab.training.pretrain.uptrain`, recording a held-out curve for the
# training-state rule). The
# sparse layers run the `"blocks"` kernel: plain PyTorch over the touched tiles, so it has a
# backward pass on CPU.

# %%
corpus = cl.load_corpus()
cap.pretrain_stage(models, tok, corpus, sizes, log)
for name in models:
    r = log.rows[name]
    print(f"{name:>9}: val loss {r['val_loss_start']:.3f} -> {r['val_loss_pretrained']:.3f} nats/token "
          f"after {r['pretrain_tokens']:,} tokens")
print(f"stage time {log.times['pretrain']:.1f} s")
gap_start = log.rows["candidate"]["val_loss_start"] - log.rows["baseline"]["val_loss_start"]
gap_pre = log.rows["candidate"]["val_loss_pretrained"] - log.rows["baseline"]["val_loss_pretrained"]
print(f"candidate minus baseline: {gap_start:+.3f} nats after conversion, {gap_pre:+.3f} after pre-training")
assert all(math.isfinite(log.rows[n]["val_loss_pretrained"]) for n in models)

# %% [markdown]
# ## 4. Multi-task fine-tuning with balanced losses
# Three tasks built from the corpus functions (lesson 05): completion (large), bug fixing
# (smaller), test generation from doctests (small and slow). Both models get the same tasks,
# batches and balancer. The balancer is the article's recipe, dynamic task weights from
# each task's convergence speed on validation data (`coba`, built and compared with naive
# token weighting in lesson 05, whose table says how much it helps at this scale). The
# tables show per-task validation loss before and after, and the spread of the relative
# gains across tasks (what balancing tries to keep small).

# %%
print("balancer:", cap.DEFAULT_BALANCE)
fts = cap.finetune_stage(models, tok, corpus, sizes, log)
for name, r in fts.items():
    print(f"--- {name}\n{r.table()}")
    assert (r.final < r.initial).all(), f"{name}: fine-tuning did not lower every task's validation loss"
print(f"stage time {log.times['finetune']:.1f} s")
fig, axes = plt.subplots(1, 2, figsize=(9, 2.8), sharey=True)
for ax, (name, r) in zip(axes, fts.items()):
    for t in sizes.tasks:
        ax.plot([e["step"] for e in r.evals], [e[f"val_{t}"] for e in r.evals], "o-", label=t)
    ax.set_title(name); ax.set_xlabel("fine-tuning step")
axes[0].set_ylabel("val loss (nats/token)"); axes[0].legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 5. Release gates: no worse than the baseline on every gate
# The lesson 07 suite: 8 function prompts, scored on syntax, functional tests (sandboxed),
# style consistency and latency attainment (first token within 100 ms, token gaps within
# 20 ms) through the continuous-batching engine.

# %%
reports, passed, reasons = cap.gate_stage(models, tok, sizes, log)
for name, rep in reports.items():
    print(f"{name:>9}: " + ", ".join(f"{k} {v:.2f}" for k, v in rep.scores().items())
          + f" | TTFT p95 {rep.ttft_p95_s * 1000:.0f} ms, TBT p95 {rep.tbt_p95_s * 1000:.1f} ms")
print("candidate passes the gates:", passed)
for r in reasons:
    print("  refused on", r)
assert passed == (not reasons)

# %% [markdown]
# ## Build: the speed ablation
# Where does the latency go? You write the ablation the capstone's claims rest on: the
# shipped model converted with **one optimisation at a time** (speed does not depend on the
# trained values, so untrained conversions are timed), then all of them. First the configs,
# held equal to the package's `ablation_configs`:

# %%
def my_ablation_configs(base_cfg, cand_cfg):
    """One config per optimisation of ``cand_cfg`` switched on alone over ``base_cfg``, plus all."""
    n = base_cfg.n_layer
    dense = sum(cand_cfg.pattern_for(i) == "dense" for i in range(n))  # the dense-early layers
    sparse = next(cand_cfg.pattern_for(i) for i in range(n) if cand_cfg.pattern_for(i) != "dense")
    common = dict(sparse=sparse, n_experts=cand_cfg.n_experts, top_k=cand_cfg.moe_top_k, attn_impl=cand_cfg.attn_impl)
    return {
        "plain": base_cfg,
        f"GQA (n_kv_head={cand_cfg.n_kv_head})": capstone_config(base_cfg, dense_layers=n, n_kv_head=cand_cfg.n_kv_head,
                                                                     moe_layers=[], **common),
        f"sparse layers {dense}..{n - 1}": capstone_config(base_cfg, dense_layers=dense, n_kv_head=base_cfg.n_kv_head,
                                                                moe_layers=[], **common),
        f"MoE layers {cand_cfg.moe_layers}": capstone_config(base_cfg, dense_layers=n, n_kv_head=base_cfg.n_kv_head,
                                                                 moe_layers=cand_cfg.moe_layers, **common),
        "all": cand_cfg,
    }


variants = my_ablation_configs(base.cfg, cand_cfg)
theirs = ablation_configs(base.cfg, cand_cfg)
assert list(variants) == list(theirs) and all(variants[k].to_dict() == theirs[k].to_dict() for k in variants)
print("my_ablation_configs == ablation_configs:", list(variants))

# %% [markdown]
# Then the timing. One decode step of a small model takes milliseconds, and the machine may
# be shared: timing each variant in a block of its own would give the first and the last
# different machines. So every round runs each variant once (`cl.interleaved_times`
# rotates the order), and each variant's speed-up over "plain" comes with its per-round
# range: a range that contains 1.0 means no difference was measured.

# %%
from codex_lab.infer.generate import stream_tokens


def decode_ms_per_step(m, prompt, n_steps):
    """Prefill ``prompt`` (B, T) untimed, then time ``n_steps`` cached greedy decode steps; ms per step."""
    tokens = stream_tokens(m, prompt, cl.SamplingParams(max_tokens=n_steps + 1), cache="dynamic")
    next(tokens)  # prefill + the first token: not part of a decode step
    t0 = time.perf_counter()
    for _ in range(n_steps):
        next(tokens)  # one forward of one token per sequence
    return (time.perf_counter() - t0) * 1000 / n_steps


conv = {name: (base if cfg is base.cfg else convert(base, cfg)).eval() for name, cfg in variants.items()}
N_STEPS, ROUNDS = MODE.pick(fast=8, full=32), MODE.pick(fast=3, full=7)
abl = []
with torch.no_grad():
    for b in (1, 8):
        prompt = torch.randint(0, tok.vocab_size, (b, 64), generator=torch.Generator().manual_seed(0)).to(device)  # (B, 64)
        ms = {name: [] for name in conv}
        for name, m in conv.items():
            decode_ms_per_step(m, prompt, N_STEPS)  # warm-up
        cl.interleaved_times({name: (lambda name=name: ms[name].append(decode_ms_per_step(conv[name], prompt, N_STEPS)))
                              for name in conv}, repeats=ROUNDS)
        for name, m in conv.items():
            rel = cl.timing_ratio(ms["plain"], ms[name], a="plain", b=name)
            # tokens/s = batch * 1000 ms / median ms per decode step
            abl.append({"variant": name, "kind": cap.ablation_kind(name), "batch": b,
                        "tokens_per_s": b * 1000 / float(torch.tensor(ms[name]).median()),
                        "kv_bytes_per_token": cl.kv_bytes_per_token(m.cfg), "params": m.num_params(),
                        "active_params": cl.active_params(m),
                        "vs_plain_median": rel.speedup, "vs_plain_lo": rel.lo, "vs_plain_hi": rel.hi, "cmp": rel})
print(f"{'variant':>22} {'batch':>5} {'tokens/s':>9} {'vs plain (rounds)':>22} {'KV B/token':>10} {'active params':>13}")
for r in abl:
    print(f"{r['variant']:>22} {r['batch']:>5} {r['tokens_per_s']:>9.0f} "
          f"{r['vs_plain_median']:>6.2f}x ({r['vs_plain_lo']:.2f}-{r['vs_plain_hi']:.2f}x) {r['kv_bytes_per_token']:>10,} "
          f"{r['active_params']:>13,}" + ("  inside the spread" if r["cmp"].within_spread and r["variant"] != "plain" else ""))
fig, ax = plt.subplots(figsize=(7, 2.8))
names = list(variants)
for j, b in enumerate((1, 8)):
    rs = [r for r in abl if r["batch"] == b]
    ax.bar([i + 0.4 * j for i in range(len(names))], [r["vs_plain_median"] for r in rs], width=0.4, label=f"batch {b}",
           yerr=[[r["vs_plain_median"] - r["vs_plain_lo"] for r in rs], [r["vs_plain_hi"] - r["vs_plain_median"] for r in rs]])
ax.set_xticks([i + 0.2 for i in range(len(names))], names, fontsize=8)
ax.axhline(1, color="k", lw=0.8); ax.set_ylabel("decode speed vs plain\n(median, round range)"); ax.legend()
plt.show()
assert all(r["tokens_per_s"] > 0 for r in abl) and {r["variant"] for r in abl} == set(ablation_configs(base.cfg, cand_cfg))
moe_name = next(k for k in variants if k.startswith("MoE"))
moe_rows = {r["batch"]: r["cmp"] for r in abl if r["variant"] == moe_name}
for b, c in moe_rows.items():
    print(f"batch {b}: " + c.describe())

# %% [markdown]
# ## 6. A registry and a live canary
# Both models go into a temporary registry (the baseline promoted, the candidate with its
# gate results in its manifest). The baseline serves; the candidate, loaded back from the
# registry (checksums verified), gets 30% of live traffic from 4 streaming clients, and the
# canary controller promotes or rolls it back from the live Prometheus series.
#
# A candidate refused by the gates gets no traffic under the seed's rule, and
# `canary_release` refuses to serve it. When that happens here we override it, on purpose
# and only in this lesson, to see whether the live check reaches the same verdict as the
# offline gates; the registry keeps the refusal either way.

# %%
rollout = canary_release(models["baseline"].cpu(), models["candidate"].cpu(), tok,
                             tempfile.mkdtemp(prefix="codex-lab-capstone-"),
                             gates={"passed": passed, "reasons": reasons, **reports["candidate"].scores()},
                             requests=MODE.pick(fast=40, full=200), promote_after=MODE.pick(fast=10, full=60),
                             min_requests=MODE.pick(fast=5, full=20), serve_refused=not passed)
load = rollout["load"]
print("canary decision:", rollout["action"], rollout["reasons"])
for side in ("canary", "primary"):
    w = rollout[side]
    print(f"{side:>8} window: {w['n']:.0f} requests, TTFT attainment {w['ttft_attainment']:.2f}, "
          f"TBT attainment {w['tbt_attainment']:.2f}, error rate {w['error_rate']:.2f}")
print(f"clients: {load['requests_ok']} ok, {load['errors']} errors; TTFT p95 {load['ttft_p95_ms']} ms, TBT p95 {load['tbt_p95_ms']} ms")
print("serving now:", rollout["serving"], "| registry current:", rollout["registry_current"])
for row in rollout["registry"]:
    print(row)
assert load["errors"] == 0 and rollout["action"] in ("promote", "rollback")
assert (rollout["serving"] == rollout["candidate"]) == (rollout["action"] == "promote")
assert (rollout["registry_current"] == rollout["candidate"]) == (rollout["action"] == "promote")
print("offline gates and live canary agree:", passed == (rollout["action"] == "promote"))

# %% [markdown]
# ## 7. Every seed claim beside what this notebook measured
# The verdict is computed from the numbers above; `codex-lab report` gathers the same kind of
# table from every lesson.

# %%
# the claims read decode speed per design kind: (median, lo, hi) of the per-round speed-ups, at batch 8
speed8 = {r["kind"]: {"decode_vs_plain": (r["vs_plain_median"], r["vs_plain_lo"], r["vs_plain_hi"]), "decode_batch": 8}
          for r in abl if r["batch"] == 8}
claims = capstone_claims(models=models, log=log, reports=reports, passed=passed, reasons=reasons,
                             speed=speed8, rollout=rollout)
w = max(len(c["claim"]) for c in claims)
for c in claims:
    print(f"{c['claim']:<{w}} | {c['verdict']:<28} | {c['measured']}")
# five rows, each on the candidate; the multi-task claim is lesson 05's (one pretrained model, each arm to its plateau)
assert len(claims) == 5 and all(c["verdict"] in VERDICTS for c in claims)

# %% [markdown]
# ## 8. The project's scorecard, applied to this candidate
# The project (`exercises/08_capstone.ipynb`) asks you to design your own candidate and
# scores it against the plain baseline on a stated scorecard, with points per criterion.
# Here is the same scorecard applied to the candidate above (validation loss after the
# pre-training stage, the syntax and style gates of section 5; its decode speed comes from
# your ablation's median round). A candidate with every
# optimisation switched on at once is a starting point, not the answer: look at which
# criteria it loses before you design yours.

# %%
from codex_lab.lessons.l08_capstone import scorecard as sc
from codex_lab.lessons.l08_capstone.score_training import quality_states

CARD_MODE = "full" if MODE.name == "full" else "fast"  # the scorecard's margins: laptop (fast, standard) or full sizes
tps8 = {r["variant"]: r["tokens_per_s"] for r in abl if r["batch"] == 8}
card_input = {"mode": CARD_MODE, "speed_ratio": tps8["all"] / tps8["plain"]}
for name, bench_name in (("baseline", "plain"), ("candidate", "all")):
    card_input[name] = {"kv_bytes_per_token": log.rows[name]["kv_bytes_per_token"],
                        "val_loss": log.rows[name]["val_loss_pretrained"],  # after the same brief pre-training
                        "decode_tokens_per_s": tps8[bench_name], "gates": dict(reports[name].scores())}
# the training-state rule: quality is scored only once every arm's held-out curve of the pre-training has plateaued
card_input["states"] = quality_states({name: [log.curves[name]] for name in ("baseline", "candidate")})
for st in card_input["states"].values():
    print(st.describe())
card = sc.score(card_input)
print(sc.format_scorecard(card, CARD_MODE))
assert sum(r.max_points for r in card) == sum(c.points for c in sc.criteria(CARD_MODE))
unscored = [r.key for r in card if not r.scored]
assert (unscored == list(sc.QUALITY_CRITERIA)) == (not all(st.trained for st in card_input["states"].values()))

# %% [markdown]
# ## 9. The measured trade: one set of designs, each trained to its plateau
# The runs above give the candidate a brief budget: a converted model that has not won back
# what conversion cost would be compared on its budget, not its design. Here each design
# trains until the training-state rule says it has levelled off. On a CPU that fits only at
# a smaller geometry (standard mode: 2 layers of width 64, 8 heads, 32-token training
# windows, an 8-token window plus every 4th 8-token block in the deep layer); the rule
# decides the steps. Per seed, a plain model is pre-trained for a fixed budget (the
# checkpoint a team converts), converted into each design (sparse deep layers, GQA at group
# sizes 4 and 8, upcycled MoE, all of them), and every design *and the plain model* (its
# pre-training continued) train on, each to its own plateau, then half as long again to
# check that the plateau holds. The seed draws the initialisation, the data
# order and the held-out windows.
#
# The quality cost of a design is its held-out loss minus the plain model's at their
# stopping points, paired by seed, judged for non-inferiority with a margin declared before
# the run (`tr.MARGIN_NATS`). What it buys is measured on *the same trained models* (the
# first seed's) at a context where each design is meant to pay: a long prefill for sparse
# attention, a batch decoding over a long cache for GQA. In fast mode the caps are far too
# short: expect "under-trained: no verdict".

# %%
from codex_lab.lessons.l08_capstone import trade as tr
from codex_lab.lessons.l08_capstone import trade_speed as tsp
from codex_lab.lessons.l08_capstone import trade_table as tt

tsizes = tr.trade_sizes(MODE.name)  # fast, standard or full: the mode this notebook runs in
print(tsizes.describe())
trade = tr.run_trade(corpus, tsizes)
fig = tt.plot_trade(trade)
plt.show()
tstates = tr.trade_states(trade)
print("\n".join(tt.trade_lines(trade)))

# %% [markdown]
# ### Beside this run: the shipped reference at the article's sizes
# This run is sized for a laptop. The course ships a reference run of the same trade at the
# sizes the article names (window 64 sparse deep layers, GQA with group 4, 8 experts top-2,
# on 256-token windows), made with `python scripts/reference_article.py --section 08` and
# stored with its provenance (commit, command, machine, date, compute time). It is data, not
# this run: its states and verdicts are printed as its own run computed them, and its curves
# are dashed, labelled "reference".

# %%
from codex_lab.reference import article_reference_lines, plot_reference

print("\n".join(article_reference_lines("08")))
ref_fig = plot_reference("l08_article")  # None when no reference is shipped
plt.show()

# %% [markdown]
# Write the cost of one design yourself: the paired per-seed differences and the
# non-inferiority rule (the one-sided 95% upper bound of the cost below the margin keeps
# quality), then hold it to the package's `tr.trade_costs`.

# %%
from codex_lab.stats import t_quantile

kind = "gqa4"
d = [x - p for x, p in zip(trade.arms[kind].final, trade.arms["plain"].final)]  # per seed, nats/token (> 0: worse)
mean_d = sum(d) / len(d)
# se = sample sd of the paired differences / sqrt(seeds)
se = (sum((x - mean_d) ** 2 for x in d) / (len(d) - 1)) ** 0.5 / len(d) ** 0.5
upper = mean_d + t_quantile(0.95, len(d) - 1) * se  # one-sided 95% upper bound of the cost
lower = mean_d - t_quantile(0.95, len(d) - 1) * se
mine = "holds" if upper < tr.MARGIN_NATS else ("fails" if lower > tr.MARGIN_NATS else "not resolved")
theirs = tr.trade_costs(trade)[kind]
print(f"{kind}: cost {mean_d:+.4f} nats/token, 90% interval [{lower:+.4f}, {upper:+.4f}], margin {tr.MARGIN_NATS}: {mine}")
print("package:", theirs.describe())
assert abs(theirs.diff - mean_d) < 1e-9 and abs(theirs.hi - upper) < 1e-6 and abs(theirs.lo - lower) < 1e-6
assert theirs.measured_verdict == mine  # the package then applies the training-state rule on top
assert theirs.verdict in (mine, "under-trained: no verdict")

# %% [markdown]
# Now what each design buys, timed on the trained models themselves, every design in the
# same interleaved rounds; then the table: costs and training state beside the buys, and the
# release gate. The gate's quality criterion is the same non-inferiority margin; a design
# must also not be slower than plain in every round of prefill or of decode, and must buy
# something (a smaller KV cache, or prefill or decode faster in every round). The gates
# promote the passing design that decodes fastest.

# %%
speed = tsp.speed_records({k: trade.model(k) for k in tr.KINDS}, context=tsizes.context,
                          decode_batch=tsizes.decode_batch, new_tokens=tsizes.new_tokens, rounds=tsizes.rounds)
rows = tt.trade_rows(trade, speed)
print(tt.trade_table(rows, context=tsizes.context, decode_batch=tsizes.decode_batch))
print()
for r in rows[1:]:
    print(f"{r.label}: " + ("passes every gate" if r.passed else "; ".join(r.reasons)))
decision = tt.trade_decision(rows)
print("DECISION:", decision["text"])
for r in rows:
    if r.kind != "plain":
        buys = r.kv_ratio < 1.0 or r.prefill[1] > 1.0 or r.decode[1] > 1.0
        assert r.passed == (r.cost.verdict == "holds" and r.prefill[2] >= 1.0 and r.decode[2] >= 1.0 and buys)
assert decision["promoted"] in [r.kind for r in rows if r.passed] + [None]
if not all(st.trained for st in tstates.values()):
    # the rule withheld a verdict (always in fast mode): that design is not promoted on quality
    assert decision["promoted"] is None or tstates[decision["promoted"]].trained

# %% [markdown]
# ## What we measured
# The two models side by side, every number measured above, then the verdicts in words.

# %%
print(summary_table(log))
print({k: round(v, 1) for k, v in log.times.items()}, f"| notebook {time.perf_counter() - T_START:.0f} s (under load)")
b, c = log.rows["baseline"], log.rows["candidate"]
print(f"- Conversion: upcycled MoE alone changed the logits by {gaps['upcycled MoE only']:.1e} (exact), all three conversions "
      f"by {gaps['all three']:.2f} (at 60 tokens only the K/V mean-pooling changes the function); validation loss {c['val_loss_start'] - b['val_loss_start']:+.3f} nats/token "
      f"against the baseline after conversion, {c['val_loss_pretrained'] - b['val_loss_pretrained']:+.3f} after the same pre-training.")
all8 = next(r["cmp"] for r in abl if r["variant"] == "all" and r["batch"] == 8)
print(f"- KV cache: {c['kv_bytes_per_token']:,} vs {b['kv_bytes_per_token']:,} bytes per token; decode at batch 8: "
      f"{all8.describe()}.")
print("- MoE alone against plain decode: " + "; ".join(f"batch {b_}: {c_.describe()}" for b_, c_ in moe_rows.items()) + ".")
print(f"- Gates: the candidate {'passed' if passed else 'was refused on ' + '; '.join(r.split(':')[0] for r in reasons)}; "
      f"the live canary {'promoted it' if rollout['action'] == 'promote' else 'rolled it back'} with {load['errors']} client errors.")
print(f"- Project scorecard for this candidate: {sum(r.points for r in card)}/{sum(r.max_points for r in card)} "
      f"(lost: {[r.key for r in card if not r.passed] or 'nothing'}).")
print(f"- Brief budget: the candidate {'passed' if passed else 'did not pass'} the gates against the plain baseline "
      f"and the live canary {'promoted it' if rollout['action'] == 'promote' else 'rolled it back'}; the pre-training curves: "
      + "; ".join(f"{st.arm} {st.short()}" for st in card_input["states"].values()) + ".")
print("- The trade (each arm to its plateau: " + ", ".join(f"{k} {v.short()}" for k, v in tstates.items())
      + f"; speed at {tsizes.context} tokens): " + "; ".join(
          f"{r.label} prefill {r.prefill[0]:.2f}x, decode {r.decode[0]:.2f}x, KV {r.kv_ratio:.2f}x, cost "
          + (f"{r.cost.diff:+.3f} ({r.cost.verdict})" if r.cost else "-") for r in rows if r.kind != "plain") + ".")
print(f"DECISION: {decision['text']}.")

# %% [markdown]
# ## Questions to think about
# 1. Which of the three conversions cost the most validation loss, and how would you show it
#    with one more run rather than by argument?
# 2. The offline gates and the live canary can disagree. Which should win when they do, and why?
# 3. Read the MoE-only rows of your ablation (median and per-round range at batch 1 and 8).
#    Which costs does an MoE decode step pay that a dense one does not (a router, gathering
#    each expert's rows, and two full-width experts per token: upcycled experts are copies
#    of the dense FFN), and how would the balance change on a GPU at batch 64?
# 4. Fast mode gives both models a few training steps. Which verdicts above would you expect to
#    flip with the full budget, and which are fixed by the architecture alone?
#
# ## Further reading
# - Ainslie et al. 2023, *GQA* (uptraining a multi-head checkpoint to grouped-query attention).
# - Komatsuzaki et al. 2022, *Sparse upcycling: training mixture-of-experts from dense checkpoints*.
# - Child et al. 2019, *Sparse transformers*; Zaheer et al. 2020, *Big Bird* (block-sparse patterns).
# - Liu et al. 2023, *MFTCoder* (multi-task fine-tuning and convergence balancing).
# - Google SRE Workbook (2018), chapter *Canarying releases*.

# %% [markdown]
# ## Appendix: where the run-time figures come from
# The **Run time** line at the top and the figures below are read from one record,
# `codex_lab/assets/timings.json` (its `provenance` says how and when each was measured;
# `python scripts/update_figures.py` rewrites them, and `tests/test_figures.py` fails when
# the text and the record disagree). The header cell prints the estimate for your machine,
# scaled by its matrix-multiply calibration.
#
# - fast mode on CPU (CI's): the figure at the top;
# - standard mode (the CPU default): the report's section 08, 179 s on the reference machine
#   (`codex-lab --mode standard report --sections 08`);
# - full mode on one GPU: not yet measured (no GPU has been lent to the course).
