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
# # Lesson 06: fast inference
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/notebooks/06_fast_inference.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# **Run time:** fast mode on CPU: 8 s (2 cores, measured with `scripts/time_notebooks.py`); full mode on one GPU: not yet measured.
#
# The article (section 3) names the levers: a KV cache that "grows linearly with sequence
# length", grouped KV heads, and better batch scheduling, with targets of TTFT < 100 ms and
# TBT < 20 ms (section 4). This lesson builds each lever, checks it against the plain path
# (same tokens), and measures it:
#
# 1. prefill vs decode: why generation is a different workload from training;
# 2. the KV cache: no cache -> concatenating cache -> preallocated static cache (+ rolling
#    window buffers), and its bytes per token;
# 3. sampling knobs and per-request seeds;
# 4. continuous batching with paged KV memory: who runs in which step, throughput, TTFT/TBT;
# 5. speculative decoding: a cheap draft guesses, the target checks, the output is unchanged.

# %%
import sys

if "google.colab" in sys.modules:  # Colab only: install the course (torch/numpy untouched)
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/codex-lab/codex-lab@main"], check=True)

# %%
import time

import matplotlib.pyplot as plt
import numpy as np
import torch

import codex_lab as cl
from codex_lab.lessons.l06_inference import bench as bench
from codex_lab.infer.generate import generate_ids_cached
from codex_lab.infer.engine import Engine, SamplingParams
from codex_lab.nn.accounting import kv_bytes_per_token
from codex_lab.nn.kv_cache import make_static_caches
import codex_lab.infer.speculative as cl_spec
from codex_lab.infer.speculative import expected_tokens_per_round, speculative_generate
from codex_lab.nn.surgery import truncated_draft

cl.seed_everything(0)
FAST = cl.lesson_header("06")  # prints the mode, why, and this lesson's expected time here
torch.set_grad_enabled(False)
ckpt = cl.load_pretrained("cpu")
model, tok, cfg = ckpt.model, ckpt.tokenizer, ckpt.config
print(cfg)
print(f"{model.num_params():,} parameters; fast mode: {FAST}")

# %% [markdown]
# ## 0. One knob before anything else: CPU threads
# A tiny model's matrix products take microseconds; splitting each over two threads costs a
# thread hand-off per op, and on a busy machine a hand-off can wait for a whole scheduler
# slice. Measure one decode loop both ways and keep the faster one for the rest of the lesson.

# %%
prompt = tok.encode("def parse_args(argv):\n    parser = argparse.ArgumentParser(")
n_new = cl.pick(fast=16, full=64)
ms_by_threads = {}
for threads in sorted({torch.get_num_threads(), 1}, reverse=True):
    torch.set_num_threads(threads)
    generate_ids_cached(model, prompt, max_new_tokens=4)  # warm-up
    t0 = time.perf_counter()
    generate_ids_cached(model, prompt, max_new_tokens=n_new)
    ms_by_threads[threads] = (time.perf_counter() - t0) * 1000 / n_new
    print(f"{threads} thread(s): {ms_by_threads[threads]:.2f} ms per decoded token")
best = min(ms_by_threads, key=ms_by_threads.get)
torch.set_num_threads(best)
print("using", best, "thread(s)")

# %% [markdown]
# ## 1. Prefill vs decode
# Generation has two phases. **Prefill** runs the whole prompt in one forward: T tokens at
# once, big matrix products, compute-bound. **Decode** produces one token per forward: every
# weight (and every cached key/value) is read to do a tiny amount of work, so it is bound by
# memory traffic and per-call overhead. Per token, prefill is far cheaper.

# %%
def timed(fn, repeats=3):
    fn()
    t = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return float(np.median(t))

rows = []
for T in cl.pick(fast=[16, 64, 256], full=[16, 64, 256, 512]):
    x = torch.randint(0, cfg.vocab_size, (1, T))
    pos = torch.arange(T)[None]
    def prefill():
        return model(x, positions=pos, caches=make_static_caches(cfg, 1, T + 1), last_only=True)
    caches = make_static_caches(cfg, 1, T + 1)
    model(x, positions=pos, caches=caches)
    def decode_one():
        caches_ = caches
        for c in caches_:
            c.truncate(T)
        return model(x[:, :1], positions=torch.tensor([[T]]), caches=caches_, last_only=True)
    t_pre, t_dec = timed(prefill), timed(decode_one)
    rows.append((T, t_pre * 1000, t_pre * 1000 / T, t_dec * 1000))
    print(f"prompt {T:4d}: prefill {t_pre * 1000:7.2f} ms = {t_pre * 1000 / T:.3f} ms/token; one decode step {t_dec * 1000:.2f} ms")
assert rows[-1][2] < rows[-1][3], "per token, prefill should be cheaper than a decode step"
print(f"at {rows[-1][0]} tokens, a decode step costs {rows[-1][3] / rows[-1][2]:.0f}x a prefill token")

# %% [markdown]
# ## 2. The KV cache
# Without a cache, every new token re-runs the whole context: O(T) work per token. With a
# cache, each step computes keys/values for the new token only and reads the stored ones.
# The cache holds 2 (K and V) x layers x KV heads x head width numbers per token, so it grows
# linearly with length (the article's claim, exactly) and shrinks with fewer KV heads (GQA,
# lesson 03).

# %%
per_tok = kv_bytes_per_token(cfg)
print(f"KV bytes per token: 2 x {cfg.n_layer} layers x {cfg.n_kv_head} KV heads x {cfg.head_dim} x 4 B = {per_tok:,} B")
for n in (256, 512, 1024):
    caches = make_static_caches(cfg, 1, n)
    print(f"  {n:5d} tokens: {sum(c.nbytes() for c in caches) / 2**20:.2f} MiB")
    assert sum(c.nbytes() for c in caches) == n * per_tok  # linear in length
gqa = cl.ModelConfig(**{**cfg.to_dict(), "n_kv_head": 1})
print(f"same model with 1 KV head (MQA): {kv_bytes_per_token(gqa):,} B/token, "
      f"{1 - kv_bytes_per_token(gqa) / per_tok:.0%} smaller (1 - 1/group size)")
win = cl.ModelConfig(**{**cfg.to_dict(), "attn_patterns": ["dense", "window:64", "window:64", "window:64"]})
wc = make_static_caches(win, 1, 1024)
print(f"with 3 of 4 layers on a 64-token window (rolling buffers): {sum(c.nbytes() for c in wc) / 2**20:.2f} MiB at 1024 tokens")

# %% [markdown]
# **The oracle first:** cached greedy generation must give exactly the tokens of the plain
# generator (which re-runs everything). Tests check this for dense, sliding-window, GQA and
# MQA models, several prompt lengths and batch sizes; here on the shipped model.

# %%
plain, _ = cl.generate_ids(model, prompt, max_new_tokens=24)
for kind in ("dynamic", "static"):
    cached, _ = generate_ids_cached(model, prompt, max_new_tokens=24, cache=kind)
    assert cached == plain, kind
print("cached == uncached:", tok.decode(prompt) + tok.decode(plain))

# %% [markdown]
# ### The cache ladder
# Tokens per second of decoding after a short and a long prompt: no cache, the
# concatenating cache (re-allocates every step), and the preallocated static cache.

# %%
ladder = bench.bench_cache(model, cl.pick(fast=[32, 256], full=[32, 256, 768]), cl.pick(fast=16, full=64))
for r in ladder:
    print(f"prompt {r['prompt_len']:4d}  {r['impl']:14s} {r['tokens_per_s']:8.1f} tokens/s")
by = {(r["prompt_len"], r["impl"]): r["tokens_per_s"] for r in ladder}
long = max(r["prompt_len"] for r in ladder)
speedup = by[(long, "static_cache")] / by[(long, "no_cache")]
print(f"static cache vs no cache at {long} tokens: {speedup:.1f}x")
assert speedup > 1.5

fig, ax = plt.subplots(figsize=(6, 3))
impls = ["no_cache", "dynamic_cache", "static_cache"]
lens = sorted({r["prompt_len"] for r in ladder})
for i, n in enumerate(lens):
    ax.bar(np.arange(3) + i * 0.4, [by[(n, m)] for m in impls], width=0.4, label=f"prompt {n}")
ax.set_xticks(np.arange(3) + 0.2, impls); ax.set_ylabel("tokens/s"); ax.legend(); ax.set_title("the cache ladder")
plt.show()

# %% [markdown]
# ## 3. Sampling
# Greedy takes the argmax. Otherwise logits are divided by the temperature, filtered (top-k
# keeps the k best; top-p keeps the smallest set with mass >= p) and sampled. A per-request
# seed makes a sampled request reproducible however the engine batches it.

# %%
eng = Engine(model, tok)
p_a = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=1, stop=["\n\n"])
ra, rb = eng.submit(prompt, p_a), eng.submit(prompt, p_a)
rc = eng.submit(prompt, SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=2))
out = {f.rid: f for f in eng.run_until_done()}
assert out[ra].output_ids == out[rb].output_ids
print("seed 1, twice:", repr(out[ra].text), out[ra].finish_reason)
print("seed 2       :", repr(out[rc].text), out[rc].finish_reason)

# %% [markdown]
# ## 4. Continuous batching and paged KV memory
# A decode step for one request barely uses the machine; a batch of B requests costs little
# more than one. **Static batching** starts B requests together and waits for the longest
# before starting the next group; **continuous (iteration-level) batching** (Orca) lets a
# request join or leave at every step. KV memory comes in fixed blocks with a block table
# per request (PagedAttention): a request is admitted when its blocks can be reserved, and
# frees them the moment it ends. Same tokens in every mode (asserted).

# %%
n_req = cl.pick(fast=12, full=32)
reqs = bench.mixed_requests(tok, n_req, max_prompt=cl.pick(fast=120, full=200), max_new=cl.pick(fast=40, full=64))
runs, walls, engines = {}, {}, {}
for impl, kw in (("one_at_a_time", dict(max_batch_size=1)), ("static_batching", dict(max_batch_size=4, static=True)),
                 ("continuous_batching", dict(max_batch_size=4))):
    runs[impl], walls[impl], engines[impl] = bench.run_engine(model, tok, reqs, **kw)
    n_tok = sum(len(f.output_ids) for f in runs[impl])
    lat = bench.latency_fields(runs[impl])
    print(f"{impl:20s} {n_tok / walls[impl]:7.1f} tokens/s  {engines[impl].steps:4d} steps  "
          f"TTFT p50 {lat['ttft_p50_ms']:7.1f} ms  TBT p95 {lat['tbt_p95_ms']:6.1f} ms")
same = {tuple(f.output_ids) for f in runs["one_at_a_time"]} == {tuple(f.output_ids) for f in runs["continuous_batching"]}
assert same
ratio = walls["one_at_a_time"] / walls["continuous_batching"]
print(f"continuous batching: {ratio:.1f}x the throughput of one at a time "
      f"(goal: >= 3x with 8 slots on 2 idle cores; fewer slots or a busy machine shrink it)")
assert ratio > 1.2

# %% [markdown]
# ### The batching timeline
# Each row is a request, each column an engine step: a dark square is its prefill, a light
# one a decode step. Static batching leaves holes (finished requests wait for their group);
# continuous batching refills a slot the step after it frees.

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.5), sharey=True)
for ax, impl in zip(axes, ("static_batching", "continuous_batching")):
    grid = np.zeros((n_req, engines[impl].steps))
    for step, pre, dec in engines[impl].timeline:
        for r in dec:
            grid[r, step] = 1
        for r in pre:
            grid[r, step] = 2
    ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="Blues")
    ax.set_title(f"{impl}: {engines[impl].steps} steps"); ax.set_xlabel("engine step")
axes[0].set_ylabel("request")
plt.show()

# %% [markdown]
# ### KV memory in use
# The engine reports what it stores and what its blocks hold, step by step.

# %%
eng = Engine(model, tok, max_batch_size=4, block_size=16)
for p, m in reqs[:6]:
    eng.submit(p, SamplingParams(max_tokens=m, ignore_eos=True))
used, alloc = [], []
while eng.has_work():
    eng.step()
    s = eng.stats()
    used.append(s["kv_used_bytes"] / 2**20); alloc.append(s["kv_allocated_bytes"] / 2**20)
print(f"peak KV in use {max(used):.2f} MiB, in blocks {max(alloc):.2f} MiB, pool {s['kv_capacity_bytes'] / 2**20:.1f} MiB")
assert all(a >= u for a, u in zip(alloc, used)) and used[-1] == 0
fig, ax = plt.subplots(figsize=(6, 2.5))
ax.plot(used, label="stored K/V"); ax.plot(alloc, label="allocated blocks"); ax.set_xlabel("step"); ax.set_ylabel("MiB"); ax.legend()
plt.show()

# %% [markdown]
# ### TTFT and TBT at 4 concurrent streams
# Four clients each send a request (a 128-token code prompt, 64 new tokens in full mode) and
# the next one as soon as theirs ends. TTFT is measured from arrival (queueing included),
# TBT between consecutive tokens. The red lines are the article's targets.

# %%
row, done = bench.bench_streams(model, tok, cl.pick(fast=8, full=32), streams=4, new_tokens=cl.pick(fast=32, full=64))
row = row[0]
ttft = [f.ttft * 1000 for f in done]
tbt = [x * 1000 for f in done for x in f.tbt]
print(f"TTFT p50 {row['ttft_p50_ms']:.1f} ms, p95 {row['ttft_p95_ms']:.1f} ms (target < 100 ms); "
      f"TBT p50 {row['tbt_p50_ms']:.1f} ms, p95 {row['tbt_p95_ms']:.1f} ms (target < 20 ms); "
      f"{row['tokens_per_s']:.0f} tokens/s")
fig, axes = plt.subplots(1, 2, figsize=(10, 3))
axes[0].hist(ttft, bins=20); axes[0].axvline(100, color="r"); axes[0].set_xlabel("TTFT (ms)")
axes[1].hist(tbt, bins=40); axes[1].axvline(20, color="r"); axes[1].set_xlabel("TBT (ms)")
plt.show()
assert len(tbt) == sum(len(f.output_ids) - 1 for f in done)

# %% [markdown]
# The tail of TBT is the steps where a new request's prefill runs before the decode of
# the others (it stalls them for a whole prompt). Chunked prefill (vLLM, SGLang) splits long
# prompts over several steps to cap that stall.
#
# ## 5. Speculative decoding
# A draft model guesses `gamma` tokens; the target verifies all of them in ONE forward and
# keeps the longest agreeing prefix plus its own next token. The output is the target's
# greedy output, always (asserted). If each guess is accepted with probability `a`, a round
# yields `(1 - a^(gamma+1)) / (1 - a)` tokens. Our draft costs nothing to make: the target's
# first layer(s) + its own head (early exit, no training).

# %%
draft_layers = 2
draft = truncated_draft(model, draft_layers)
prompts = bench.code_prompts(tok, [96] * cl.pick(fast=2, full=8), seed=5)
n_new = cl.pick(fast=32, full=128)
plain = [generate_ids_cached(model, p, max_new_tokens=n_new)[0] for p in prompts]
spec_rows = []
for gamma in (1, 2, 4):
    res = [speculative_generate(model, draft, p, max_new_tokens=n_new, gamma=gamma) for p in prompts]
    assert [r[0] for r in res] == plain, "speculative output must equal the target's greedy output"
    acc = sum(r[2].accepted for r in res) / max(1, sum(r[2].accepted + r[2].rejections for r in res))
    per_round = sum(r[2].emitted for r in res) / max(1, sum(r[2].rounds for r in res))
    spec_rows.append((gamma, acc, per_round, expected_tokens_per_round(acc, gamma)))
    print(f"gamma {gamma}: acceptance a = {acc:.2f}; tokens per target forward {per_round:.2f} "
          f"(formula {expected_tokens_per_round(acc, gamma):.2f}); target forwards {sum(r[2].target_calls for r in res)} "
          f"for {sum(map(len, plain))} tokens")

# what does it buy in time? Cost of one draft forward (c) and of verifying gamma + 1 tokens
# (v), both in target decode steps
ctx_ids = torch.tensor([prompts[0]])
T0 = ctx_ids.shape[1]
def step_time(m, n=1):
    caches = make_static_caches(m.cfg, 1, T0 + n, rolling=False)
    m(ctx_ids, positions=torch.arange(T0)[None], caches=caches)
    def one():
        for c_ in caches:
            c_.truncate(T0)
        m(ctx_ids[:, :n], positions=torch.arange(T0, T0 + n)[None], caches=caches, last_only=True)
    return timed(one, repeats=cl.pick(fast=15, full=50))
t_target = step_time(model)
c = step_time(draft) / t_target
t_plain = timed(lambda: [generate_ids_cached(model, p, max_new_tokens=n_new) for p in prompts], repeats=1)
print(f"draft forward: c = {c:.2f} target steps (it shares the embedding and the {cfg.vocab_size}-way head)")
for gamma, acc, per_round, _ in spec_rows:
    v = step_time(model, gamma + 1) / t_target
    t_spec = timed(lambda: [speculative_generate(model, draft, p, max_new_tokens=n_new, gamma=gamma) for p in prompts], repeats=1)
    print(f"gamma {gamma}: verify v = {v:.2f} steps; predicted speedup E/(gamma c + v) = "
          f"{cl_spec.expected_speedup(acc, gamma, c, v):.2f}x, measured {t_plain / t_spec:.2f}x")

a_grid = np.linspace(0, 0.99, 50)
fig, ax = plt.subplots(figsize=(5, 3))
for gamma, acc, per_round, _ in spec_rows:
    line, = ax.plot(a_grid, [expected_tokens_per_round(a, gamma) for a in a_grid], label=f"gamma={gamma}")
    ax.plot([acc], [per_round], "o", color=line.get_color())
ax.set_xlabel("acceptance rate a"); ax.set_ylabel("tokens per target forward"); ax.legend(); ax.set_title("measured (dots) vs formula")
plt.show()

# %% [markdown]
# The formula assumes guesses are accepted independently; real acceptances come in runs
# (easy stretches of code, then a hard token), so the measured tokens per round can sit
# above or below the curve. Fewer target forwards buy time only when the draft is cheap:
# the expected speedup is E[tokens] / (gamma * c + v). Here the draft shares the embedding
# and the 4096-way head, a large part of this tiny model's cost, so c is large and
# speculation barely pays or loses (the measured figure is lower still: each round also pays
# Python bookkeeping and cache rollback); with a 7B target and a 100M draft (c ~ 0.02) the same
# acceptance rates give ~2-3x. `codex-lab bench inference --scenarios speculative` times it too.
#
# ## Where the real systems take over
# vLLM and SGLang do all of this at scale: paged attention kernels that read the block table
# directly (no gather), chunked prefill, prefix caching, CUDA graphs for decode, and
# speculative decoding with trained draft heads. The ideas are the ones above.
#
# Run the full benchmark (HF `generate` on the same weights included) with
# `codex-lab bench inference --threads 1`. The opt-in `torch.compile` rung of the ladder
# (`--scenarios compile`, off by default: compiling takes minutes on a small CPU) is
# `codex_lab.infer.generate.compiled_forward(model)`, passed as `forward=` to
# `generate_batch_cached`.
