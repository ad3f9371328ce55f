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
# # Lesson 06: fast inference
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/notebooks/06_fast_inference.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# **Takeaway:** An inference lever counts only if it gives the plain path's tokens: you will
# build a KV cache, a continuous-batching scheduler and the speculative accept/reject rule,
# check each against uncached generation or the package, and measure what each buys on this
# machine.
#
# **You will build:**
#
# - a static KV cache (write a slot, attend up to the length), prefill then decode, held
#   equal to uncached generation;
# - a continuous-batching scheduler (admit, prefill, decode, retire), held equal to the
#   package's engine;
# - the speculative accept/reject rule, greedy and sampling (checked with a chi-square
#   test), and the distillation loss of a draft, held equal to the package's.
#
# **Run time:** fast mode on CPU: 50 s; full mode (GPU) and how this was measured: see the appendix.
#
# The article (section 3) names the levers: a KV cache that "grows linearly with sequence
# length", grouped KV heads, and better batch scheduling, with targets of TTFT < 100 ms and
# TBT < 20 ms (section 4). This lesson builds each lever, checks it against the plain path
# (same tokens), and measures it:
#
# 1. prefill vs decode: why generation is a different workload from training;
# 2. **build** a static KV cache (write a slot, attend up to the length), prefill then
#    decode, held equal to uncached generation; its bytes per token;
# 3. sampling knobs and per-request seeds;
# 4. **build** a continuous-batching scheduler (admit, prefill, decode, retire) in about 60
#    lines, held equal to the package's engine; then the engine at scale: throughput,
#    the batching timeline, TTFT/TBT;
# 5. **build** the speculative accept/reject rule: greedy (held equal to the target's
#    output) and the sampling rule that keeps the target distribution, with a chi-square test;
#    then a draft distilled from the target, its acceptance per kind of prompt, and what it
#    buys (or not) on this machine, measured beside the formula's prediction;
# 6. **measure** the interpreter out of the token loop: the same decode step eager, compiled
#    with `torch.compile` (a graph called through Python and dynamo's guards every token) and
#    compiled ahead of time (a C++ package the loop calls), same tokens, timed in alternating rounds.

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
from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.sampling import SamplingParams
from codex_lab.nn.accounting import kv_bytes_per_token
from codex_lab.nn.kv_cache import make_static_caches
import codex_lab.infer.speculative as cl_spec
from codex_lab.infer.speculative import expected_tokens_per_round, speculative_generate
from codex_lab.nn.surgery import truncated_draft
from codex_lab.lessons.l06_inference.draft import draft_meta, kl_to_target, load_draft, make_draft
from codex_lab.lessons.l06_inference.spec_scenarios import acceptance, typed_prompts

cl.seed_everything(0)
MODE = cl.lesson_header("06")  # resolves the mode once, prints it, why, and the expected time here
FAST = MODE.fast  # laptop sizes (fast and standard mode)
torch.set_grad_enabled(False)
ckpt = cl.load_pretrained("cpu")
model, tok, cfg = ckpt.model, ckpt.tokenizer, ckpt.config
print(cfg)
print(f"{model.num_params():,} parameters; fast mode: {FAST}")


# %%
from collections import deque  # the scheduler's waiting queue

# %% [markdown]
# ## 0. One knob before anything else: CPU threads
# A tiny model's matrix products take microseconds; splitting each over two threads costs a
# thread hand-off per op, and on a busy machine a hand-off can wait for a whole scheduler
# slice. Measure one decode loop both ways and keep the faster one for the rest of the lesson.

# %%
prompt = tok.encode("def parse_args(argv):\n    parser = argparse.ArgumentParser(")
n_new = MODE.pick(fast=16, full=64)
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
# memory traffic and per-call overhead. Per token, prefill should be far cheaper; the
# two are timed in alternating rounds (`cl.interleaved_times`) and compared round by round.

# %%
rows = []
for T in MODE.pick(fast=[16, 64, 256], full=[16, 64, 256, 512]):
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
    prefill(), decode_one()  # warm-up
    wall, _ = cl.interleaved_times({"prefill": prefill, "decode": decode_one}, repeats=MODE.pick(fast=5, full=11))
    t_pre, t_dec = float(np.median(wall["prefill"])), float(np.median(wall["decode"]))  # ms
    per_token = cl.timing_ratio(wall["decode"], [w / T for w in wall["prefill"]], a="a decode step", b="a prefill token")
    rows.append((T, t_pre, t_pre / T, t_dec, per_token))
    print(f"prompt {T:4d}: prefill {t_pre:7.2f} ms = {t_pre / T:.3f} ms/token; one decode step {t_dec:.2f} ms")
T_LONG, per_token = rows[-1][0], rows[-1][4]
print(f"at {T_LONG} tokens: {per_token.describe()}")
assert per_token.lo > 1.0, "per token, prefill should be cheaper than a decode step in every round"

# %% [markdown]
# ## 2. Build: a static KV cache
# Without a cache, every new token re-runs the whole context: O(T) work per token. With a
# cache, each step computes keys/values for the new tokens only and reads the stored ones.
#
# The model talks to a cache through one method: `update(k, v, positions)` stores this
# step's keys/values (B, H_kv, T, D) at their absolute positions and returns every key/value
# the step may attend to, with the position of each (-1 = an empty slot, which the
# attention mask hides; the causal mask hides the future). A **static** cache allocates its
# buffers once (gpt-fast style): slot `p` holds position `p`, so a write is one indexed
# assignment and "attend up to the length" is a slice of the first `length` slots.
# `rows` says which rows of the buffer this call's batch occupies (the scheduler of
# section 4 uses it; here it is every row).

# %%
class SlotCache:
    """One layer's preallocated keys/values: buffer row r, slot p = position p of that row."""

    def __init__(self, rows: int, n_kv_head: int, head_dim: int, max_len: int) -> None:
        self.k = torch.zeros(rows, n_kv_head, max_len, head_dim)  # (R, H_kv, L, D)
        self.v = torch.zeros(rows, n_kv_head, max_len, head_dim)  # (R, H_kv, L, D)
        self.pos = torch.full((rows, max_len), -1)  # (R, L) position held by each slot, -1 = empty
        self.rows = torch.arange(rows)  # (B,) buffer rows of the batch the next call brings

    def update(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor):
        r = self.rows[:, None]  # (B, 1)
        # write: slot = absolute position (advanced indices first: the value is (B, T, H_kv, D))
        self.k[r, :, positions] = k.transpose(1, 2)
        self.v[r, :, positions] = v.transpose(1, 2)
        self.pos[r, positions] = positions  # (B, T)
        length = int(self.pos[self.rows].max()) + 1  # slots 0 .. length-1 may be attended
        return self.k[self.rows, :, :length], self.v[self.rows, :, :length], self.pos[self.rows, :length]  # (B, H_kv, S, D) x2, (B, S)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


def new_caches(rows: int, max_len: int) -> list[SlotCache]:
    return [SlotCache(rows, cfg.n_kv_head, cfg.head_dim, max_len) for _ in range(cfg.n_layer)]

# %% [markdown]
# **Prefill, then decode.** The prompt goes through in one forward (all its keys/values
# are written at once, the logits of its last position give the first new token); every
# later step feeds one token at the next position.

# %%
def greedy_cached(prompt_ids: list[int], n_new: int) -> list[int]:
    caches = new_caches(1, len(prompt_ids) + n_new)
    x = torch.tensor([prompt_ids])  # (1, T)
    logits = model(x, positions=torch.arange(len(prompt_ids))[None], caches=caches, last_only=True).logits[:, -1]  # (1, V) prefill
    out: list[int] = []
    for i in range(n_new):
        nxt = int(logits.argmax(-1))
        out.append(nxt)
        pos = len(prompt_ids) + i  # the new token's absolute position
        logits = model(torch.tensor([[nxt]]), positions=torch.tensor([[pos]]), caches=caches, last_only=True).logits[:, -1]  # (1, V) decode
    return out

# %% [markdown]
# **The oracle:** cached greedy generation must give exactly the tokens of the plain
# generator, which re-runs the whole context every step. Several prompt lengths, so a
# one-token and a multi-token prefill are both tried.

# %%
n_check = MODE.pick(fast=16, full=48)
for T in (1, 7, 96):
    p_ids = bench.code_prompts(tok, [T], seed=T)[0]
    plain, _ = cl.generate_ids(model, p_ids, max_new_tokens=n_check)  # no cache
    ours = greedy_cached(p_ids, n_check)
    assert ours == plain, (T, ours, plain)
    assert cl.generate_ids_cached(model, p_ids, max_new_tokens=n_check)[0] == plain  # the package's cache too
print(f"cached == uncached for prompts of 1, 7 and 96 tokens ({n_check} new tokens each):", repr(tok.decode(plain)[:60]))

# %% [markdown]
# The cache holds 2 (K and V) x layers x KV heads x head width numbers per token, so it grows
# linearly with length (the article's claim, exactly) and shrinks with fewer KV heads (GQA,
# lesson 03).

# %%
per_tok = cl.kv_bytes_per_token(cfg)
print(f"KV bytes per token: 2 x {cfg.n_layer} layers x {cfg.n_kv_head} KV heads x {cfg.head_dim} x 4 B = {per_tok:,} B")
for n in (256, 512, 1024):
    ours_b = sum(c.nbytes() for c in new_caches(1, n))
    assert ours_b == n * per_tok == sum(c.nbytes() for c in cl.make_static_caches(cfg, 1, n))  # linear in length
    print(f"  {n:5d} tokens: {ours_b / 2**20:.2f} MiB")
mqa = cl.ModelConfig(**{**cfg.to_dict(), "n_kv_head": 1})
print(f"same model with 1 KV head (MQA): {cl.kv_bytes_per_token(mqa):,} B/token, "
      f"{1 - cl.kv_bytes_per_token(mqa) / per_tok:.0%} smaller (1 - 1/group size)")

# %% [markdown]
# ### The cache ladder
# Tokens per second of decoding after a short and a long prompt: no cache, the
# concatenating cache (re-allocates every step), and the package's preallocated static cache,
# in alternating rounds (the range of each is printed).

# %%
NEW_TOK = MODE.pick(fast=16, full=64)
cache_cmps = {}
for n in MODE.pick(fast=[32, 256], full=[32, 256, 768]):
    p_n = torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    impls = {"no_cache": lambda: cl.generate_ids(model, p_n, max_new_tokens=NEW_TOK),
             "dynamic_cache": lambda: cl.generate_ids_cached(model, p_n, max_new_tokens=NEW_TOK, cache="dynamic"),
             "static_cache": lambda: cl.generate_ids_cached(model, p_n, max_new_tokens=NEW_TOK)}
    outs = {k: f()[0] for k, f in impls.items()}  # warm-up, and the same tokens from all three
    assert outs["no_cache"] == outs["dynamic_cache"] == outs["static_cache"], "cached != uncached tokens"
    wall, _ = cl.interleaved_times(impls, repeats=2)
    for k, ms in wall.items():
        print(f"prompt {n:4d}  {k:14s} {NEW_TOK * 1000 / float(np.median(ms)):8.1f} tokens/s "
              f"(rounds {min(ms):.0f}-{max(ms):.0f} ms)")
    cache_cmps[n] = cl.timing_ratio(wall["no_cache"], wall["static_cache"], a="no cache", b="the static cache")
long = max(cache_cmps)
cache_cmp = cache_cmps[long]
cache_speedup = cache_cmp.speedup
print(f"at {long} tokens: {cache_cmp.describe()}")
assert cache_cmp.lo > 1.5

# %% [markdown]
# ## 3. Sampling
# Greedy takes the argmax. Otherwise logits are divided by the temperature, filtered (top-k
# keeps the k best; top-p keeps the smallest set with mass >= p) and sampled. A per-request
# seed makes a sampled request reproducible however the engine batches it.

# %%
eng = cl.Engine(model, tok)
p_a = cl.SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=1, stop=["\n\n"])
ra, rb = eng.submit(prompt, p_a), eng.submit(prompt, p_a)
rc = eng.submit(prompt, cl.SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=2))
out = {f.rid: f for f in eng.run_until_done()}
assert out[ra].output_ids == out[rb].output_ids
print("seed 1, twice:", repr(out[ra].text), out[ra].finish_reason)
print("seed 2       :", repr(out[rc].text), out[rc].finish_reason)

# %% [markdown]
# ## 4. Build: a continuous-batching scheduler
# A decode step for one request barely uses the machine; a batch of B requests costs little
# more than one. **Continuous (iteration-level) batching** (Orca) lets a request join or
# leave at every step. The whole loop, greedy, in one function: every step it
#
# 1. **admits** waiting requests, first come first served, while a cache row is free;
# 2. **prefills** each newly admitted prompt (its first token);
# 3. **decodes** one token for every request that was already running, all in ONE forward
#    (rows of different lengths side by side: empty slots are masked);
# 4. **retires** requests that produced end-of-text or their last token, freeing the row.

# %%
def serve(requests: list[tuple[list[int], int]], max_batch: int, max_len: int) -> tuple[dict[int, list[int]], int]:
    """Greedy outputs of ``requests`` [(prompt ids, max new tokens)] by request index, and the steps taken."""
    caches = new_caches(max_batch, max_len)
    waiting = deque(range(len(requests)))  # request ids in arrival order
    free_rows = list(range(max_batch))  # cache rows nobody owns
    running: dict[int, int] = {}  # request id -> its cache row
    out: dict[int, list[int]] = {i: [] for i in range(len(requests))}
    length: dict[int, int] = {}  # request id -> tokens stored in its row

    def forward(rids: list[int], tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        for c in caches:
            c.rows = torch.tensor([running[r] for r in rids])  # (B,) which buffer rows this batch uses
        return model(tokens, positions=positions, caches=caches, last_only=True).logits[:, -1]  # (B, V)

    steps = 0
    while waiting or running:
        decoding = list(running)  # running before this step: they decode
        admitted = []
        while waiting and free_rows:  # 1. admit
            rid, row = waiting.popleft(), free_rows.pop(0)
            for c in caches:
                c.pos[row] = -1  # forget the previous owner's keys
            running[rid] = row
            admitted.append(rid)
        for rid in admitted:  # 2. prefill: the whole prompt in one forward, its first token
            p = requests[rid][0]
            logits = forward([rid], torch.tensor([p]), torch.arange(len(p))[None])  # (1, V)
            out[rid].append(int(logits.argmax(-1)))
            length[rid] = len(p)
        if decoding:  # 3. one decode step for all of them together
            toks = torch.tensor([[out[r][-1]] for r in decoding])  # (B, 1) each one's newest token
            pos = torch.tensor([[length[r]] for r in decoding])  # (B, 1) at its next position
            for r, nxt in zip(decoding, forward(decoding, toks, pos).argmax(-1).tolist()):
                out[r].append(nxt)
                length[r] += 1
        for rid in list(running):  # 4. retire
            if out[rid][-1] == tok.eot_id or len(out[rid]) == requests[rid][1]:
                free_rows.append(running.pop(rid))
                if out[rid][-1] == tok.eot_id:
                    out[rid].pop()  # end-of-text ends the request; it is not part of the output
        steps += 1
    return out, steps

# %% [markdown]
# **The oracle:** the package's engine (paged KV blocks, streaming, cancellation,
# deadlines: everything ours leaves out) on the same requests, greedy, must produce the same
# tokens for every request.

# %%
n_req = MODE.pick(fast=12, full=32)
reqs = bench.mixed_requests(tok, n_req, max_prompt=MODE.pick(fast=120, full=200), max_new=MODE.pick(fast=40, full=64))
t = time.perf_counter()
mine, my_steps = serve(reqs, max_batch=4, max_len=cfg.max_seq_len)
my_wall = time.perf_counter() - t
eng = cl.Engine(model, tok, max_batch_size=4)
rids = [eng.submit(p, cl.SamplingParams(max_tokens=m)) for p, m in reqs]
theirs = {f.rid: f.output_ids for f in eng.run_until_done()}
assert all(mine[i] == theirs[rid] for i, rid in enumerate(rids)), "our scheduler and the engine disagree"
print(f"our scheduler == package engine on {n_req} requests: {sum(map(len, mine.values()))} tokens, "
      f"{my_steps} steps (engine: {eng.steps}), ours took {my_wall:.2f} s")

# %% [markdown]
# **Exercises.** You now have everything `exercises/06_fast_inference.ipynb` grades: one
# decode step over a preallocated KV cache (section 2's `SlotCache`: write the new slot,
# attend up to the length), top-p (nucleus) filtering (section 3) and one admission step of
# a scheduler under a block budget (the admit step of `serve` above, with KV blocks as in
# the engine below). Grade it with `codex-lab grade exercises/06_fast_inference.py`.

# %% [markdown]
# ### At scale: the package engine, one at a time vs static vs continuous batching
# KV memory in the engine comes in fixed blocks with a block table per request
# (PagedAttention): a request is admitted when its blocks can be reserved, and frees them
# the moment it ends. **Static batching** starts B requests together and waits for the
# longest before starting the next group. Same tokens in every mode (asserted). The three
# modes run in alternating rounds, so the throughput ratio comes with its per-round range.

# %%
runs, walls, engines = {}, {}, {}
modes = {"one_at_a_time": dict(max_batch_size=1), "static_batching": dict(max_batch_size=4, static=True),
         "continuous_batching": dict(max_batch_size=4)}


def serve_mode(impl):
    runs[impl], walls[impl], engines[impl] = bench.run_engine(model, tok, reqs, **modes[impl])


mode_wall, _ = cl.interleaved_times({impl: (lambda impl=impl: serve_mode(impl)) for impl in modes}, repeats=2)
for impl in modes:
    n_tok = sum(len(f.output_ids) for f in runs[impl])
    lat = bench.latency_fields(runs[impl])
    print(f"{impl:20s} {n_tok / (np.median(mode_wall[impl]) / 1000):7.1f} tokens/s  {engines[impl].steps:4d} steps  "
          f"TTFT p50 {lat['ttft_p50_ms']:7.1f} ms  TBT p95 {lat['tbt_p95_ms']:6.1f} ms")
assert {tuple(f.output_ids) for f in runs["one_at_a_time"]} == {tuple(f.output_ids) for f in runs["continuous_batching"]}
batching = cl.timing_ratio(mode_wall["one_at_a_time"], mode_wall["continuous_batching"], a="one at a time",
                           b="continuous batching (4 slots)")
batch_ratio = batching.speedup
step_ratio = engines["static_batching"].steps / engines["continuous_batching"].steps
print(batching.describe())
print(f"static batching needs {step_ratio:.2f}x the engine steps of continuous batching (a count, not a timing)")
print("the README's batching goal is measured with more requests and slots: "
      "`codex-lab bench --mode fast inference --scenarios batching --json` (add `--slots 8`)")
assert batching.lo > 1.2

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
# ### TTFT and TBT at 4 concurrent streams
# Four clients each send a request (a 128-token code prompt, 64 new tokens in full mode) and
# the next one as soon as theirs ends. TTFT is measured from arrival (queueing included),
# TBT between consecutive tokens. The red lines are the article's targets.

# %%
row, done = bench.bench_streams(model, tok, MODE.pick(fast=8, full=32), streams=4, new_tokens=MODE.pick(fast=32, full=64))
row = row[0]
ttft = [f.ttft * 1000 for f in done]
tbt = [x * 1000 for f in done for x in f.tbt]
print(f"TTFT p50 {row['ttft_p50_ms']:.1f} ms, p95 {row['ttft_p95_ms']:.1f} ms (target < 100 ms); "
      f"TBT p50 {row['tbt_p50_ms']:.1f} ms, p95 {row['tbt_p95_ms']:.1f} ms (target < 20 ms); "
      f"{row['tokens_per_s']:.0f} tokens/s (under load)")
fig, axes = plt.subplots(1, 2, figsize=(10, 3))
axes[0].hist(ttft, bins=20); axes[0].axvline(100, color="r"); axes[0].set_xlabel("TTFT (ms)")
axes[1].hist(tbt, bins=40); axes[1].axvline(20, color="r"); axes[1].set_xlabel("TBT (ms)")
plt.show()
assert len(tbt) == sum(len(f.output_ids) - 1 for f in done)

# %% [markdown]
# The tail of TBT is the steps where a new request's prefill runs before the decode of
# the others (it stalls them for a whole prompt). Chunked prefill (vLLM, SGLang; the
# engine's `max_prefill_tokens`) splits long prompts over several steps to cap that stall.
#
# ## 5. Build: speculative decoding, the accept/reject rule
# A cheap draft model guesses `gamma` tokens; the target scores all of them in ONE forward
# (its logits after the context and after each guess, `gamma + 1` rows). Which guesses
# survive?
#
# **Greedy rule.** Keep the longest prefix of guesses that equal the target's argmax, then
# add the target's own token at the first disagreement (or after the last guess). Every
# emitted token is the target's argmax given the tokens before it, so the output *is* the
# target's greedy output, whatever the draft guesses.

# %%
def accept_greedy(guesses: list[int], target_logits: torch.Tensor) -> list[int]:
    """guesses: gamma draft tokens; target_logits (gamma + 1, V) after the context and after each guess."""
    best = target_logits.argmax(-1).tolist()  # (gamma + 1,) the target's own choices
    n = 0
    while n < len(guesses) and guesses[n] == best[n]:  # accepted prefix
        n += 1
    return guesses[:n] + [best[n]]  # + the target's token where they first disagree


def speculative_plain(target, draft, prompt_ids: list[int], n_new: int, gamma: int) -> tuple[list[int], int]:
    """Greedy speculative decoding without caches (plain on purpose); new ids and target forwards."""
    ids, calls = list(prompt_ids), 0
    while len(ids) - len(prompt_ids) < n_new:
        guesses: list[int] = []
        for _ in range(gamma):  # the draft guesses one token at a time
            guesses.append(int(draft(torch.tensor([ids + guesses])).logits[0, -1].argmax()))
        logits = target(torch.tensor([ids + guesses])).logits[0, -gamma - 1 :]  # (gamma + 1, V) one target forward
        calls += 1
        ids += accept_greedy(guesses, logits)
    return ids[len(prompt_ids) :][:n_new], calls

# %% [markdown]
# Our draft costs nothing to make: the target's first layers plus its own head (early exit,
# no training). **The oracle:** the speculative output equals the target's plain greedy
# output and the package's cached speculative decoder.

# %%
draft_layers = 2
draft = cl.truncated_draft(model, draft_layers)
prompts = bench.code_prompts(tok, [96] * MODE.pick(fast=2, full=8), seed=5)
n_new = MODE.pick(fast=24, full=96)
for p_ids in prompts:
    plain, _ = cl.generate_ids(model, p_ids, max_new_tokens=n_new)
    spec, calls = speculative_plain(model, draft, p_ids, n_new, gamma=4)
    assert spec == plain == cl.speculative_generate(model, draft, p_ids, max_new_tokens=n_new, gamma=4)[0]
    print(f"speculative == greedy target: {n_new} tokens in {calls} target forwards instead of {n_new}")

# %% [markdown]
# **Sampling rule** (Leviathan et al. 2023; Chen et al. 2023). With sampling, the target's
# output is a *distribution* $p$, and the draft drew its guess $x$ from its own $q$. Accept
# $x$ with probability $\min(1, p(x)/q(x))$; on rejection, draw from the residual
# $\mathrm{norm}(\max(0, p - q))$ and stop; if all `gamma` guesses survive, draw one bonus
# token from the target's next distribution. Then every emitted token is distributed
# exactly as $p$: $P(x) = q(x)\min(1, p/q) + (1 - \sum_y \min(p_y, q_y))\,\frac{\max(0, p - q)(x)}{\sum_y \max(0, p_y - q_y)} = \min(p, q) + \max(0, p - q) = p(x)$.

# %%
def accept_sample(p: torch.Tensor, q: torch.Tensor, guesses: list[int], gen: torch.Generator) -> list[int]:
    """p (gamma + 1, V) target probabilities, q (gamma, V) the draft's, guesses drawn from q."""
    out = []
    for i, x in enumerate(guesses):
        if float(torch.rand((), generator=gen)) < min(1.0, float(p[i, x] / q[i, x])):  # accept w.p. min(1, p/q)
            out.append(x)
            continue
        residual = (p[i] - q[i]).clamp(min=0)  # (V,) max(0, p - q)
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=gen)))  # norm(max(0, p - q))
        return out
    out.append(int(torch.multinomial(p[len(guesses)], 1, generator=gen)))  # all accepted: a bonus token from p
    return out

# %% [markdown]
# **A statistical test that the rule preserves the target distribution.** A vocabulary of 6
# tokens, a target $p$ and a deliberately different draft $q$, `gamma = 3`; many rounds,
# each drawing the guesses from $q$ and applying the rule. The first token emitted must
# follow $p$, and so must the second (when the first was accepted): Pearson's chi-square
# test of the counts against $N p$. The p-value comes from the chi-square survival function,
# $P(\chi^2_{V-1} > s) = Q\big(\tfrac{V-1}{2}, \tfrac{s}{2}\big)$, the regularised upper
# incomplete gamma function. Two wrong rules go through the same test: emitting the
# draft's guesses unchecked, and resampling from $p$ (not the residual) after a rejection.

# %%
V, GAMMA = 6, 3
p_true = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
q_draft = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.20, 0.30])
P, Q = p_true.expand(GAMMA + 1, V), q_draft.expand(GAMMA, V)
N = MODE.pick(fast=4000, full=40000)


def chi_square_pvalue(tokens: list[int], probs: torch.Tensor) -> tuple[float, float]:
    counts = torch.bincount(torch.tensor(tokens), minlength=len(probs)).double()
    expected = len(tokens) * probs.double()  # expected counts here are >= 100, far above the usual minimum of 5
    stat = float(((counts - expected) ** 2 / expected).sum())  # Pearson's s = sum (O - E)^2 / E
    return stat, float(torch.special.gammaincc(torch.tensor((len(probs) - 1) / 2), torch.tensor(stat / 2)))  # P(chi2_{V-1} > s)


def draft_only(p, q, guesses, gen):  # wrong: never checks the guesses
    return list(guesses)


def resample_from_p(p, q, guesses, gen):  # wrong: after a rejection draws from p, not the residual
    for i, x in enumerate(guesses):
        if float(torch.rand((), generator=gen)) >= min(1.0, float(p[i, x] / q[i, x])):
            return guesses[:i] + [int(torch.multinomial(p[i], 1, generator=gen))]
    return list(guesses) + [int(torch.multinomial(p[-1], 1, generator=gen))]


gen = torch.Generator().manual_seed(0)
guess_draws = torch.multinomial(q_draft, N * GAMMA, replacement=True, generator=gen).view(N, GAMMA).tolist()  # (N, gamma) from q
verdicts = {}
for name, rule in (("Leviathan/Chen rule", accept_sample), ("draft tokens unchecked", draft_only), ("resample from p", resample_from_p)):
    g = torch.Generator().manual_seed(1)
    emitted = [rule(P, Q, gs, g) for gs in guess_draws]
    first = [e[0] for e in emitted]
    second = [e[1] for e in emitted if len(e) > 1]
    s1, pv1 = chi_square_pvalue(first, p_true)
    s2, pv2 = chi_square_pvalue(second, p_true)
    verdicts[name] = (pv1, pv2, sum(map(len, emitted)) / N)
    print(f"{name:<24} first token: chi2 {s1:7.1f}, p-value {pv1:.3g};  second token: chi2 {s2:7.1f}, p-value {pv2:.3g};  "
          f"{sum(map(len, emitted)) / N:.2f} tokens per round")
# the right rule must pass at the 0.1% level; the test must have the power to reject both wrong ones
assert min(verdicts["Leviathan/Chen rule"][:2]) > 1e-3
assert max(verdicts["draft tokens unchecked"][:2]) < 1e-6 and min(verdicts["resample from p"][:2]) < 1e-6
accept_rate = float(torch.minimum(p_true, q_draft).sum())  # E[accept] = sum_x min(p(x), q(x))
print(f"acceptance rate sum_x min(p, q) = {accept_rate:.2f}; expected tokens per round "
      f"(1 - a^(gamma+1)) / (1 - a) = {cl.expected_tokens_per_round(accept_rate, GAMMA):.2f}")

# %% [markdown]
# ### A draft that earns its place: distilled from the target
# The early exit reads the hidden state after block 2 of 4 through a norm and head that were
# trained to read block 4's: it rarely guesses the target's token. A draft can instead be
# *trained to imitate the target* (knowledge distillation; DistillSpec, Zhou et al. 2024):
# one block of the target's width, the target's own embedding and head shared and frozen,
# started from a copy of the target's first block (so at step 0 it *is* the 1-block early
# exit) and trained on windows of the corpus's train split, half of them continued by the
# target's own greedy tokens (the text a draft is judged on; DistillSpec's on-policy data),
# to minimise, at every position,
#
# $$\mathrm{KL}(p\,\|\,q) = \sum_v p_v (\log p_v - \log q_v),$$
#
# $p$ the target's next-token distribution, $q$ the draft's. Written here, held equal to the
# package's loss; the trained block ships with the package (`load_draft`; remade by
# `python -m codex_lab.lessons.l06_inference.draft`, about 2-3 CPU minutes on one core), and its held-out
# curve (agreement with the target's greedy token) says whether training reached a plateau.

# %%
def kl_loss(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(p || q); logits (B, T, V); nats."""
    logp = torch.log_softmax(target_logits.float(), dim=-1)  # (B, T, V)
    logq = torch.log_softmax(draft_logits.float(), dim=-1)  # (B, T, V)
    return (logp.exp() * (logp - logq)).sum(-1).mean()  # sum_v p (log p - log q), averaged


x_held = torch.tensor([prompts[0]])  # a held-out window
early1, distilled = make_draft(model, 1), load_draft(model)
p_logits = model(x_held).logits  # (1, T, V)
kls = {name: kl_loss(p_logits, d(x_held).logits) for name, d in (("1-block early exit", early1), ("distilled draft", distilled))}
for name, d in (("1-block early exit", early1), ("distilled draft", distilled)):
    assert torch.allclose(kls[name], kl_to_target(p_logits, d(x_held).logits))
    agree = float((d(x_held).logits.argmax(-1) == p_logits.argmax(-1)).float().mean())
    print(f"{name:<19} KL to the target {float(kls[name]):.2f} nats/token, same argmax at {agree:.0%} of positions")
meta = draft_meta()
curve = [(s_, a_) for s_, a_, _ in meta["curve"]]
distill_state = cl.training_state([curve], higher_is_better=True, min_change=0.01, arm="distilled draft")
print(f"shipped with `{meta['command']}` ({meta['train_cpu_s']:.0f} CPU s): {distill_state.describe()}")
fig, ax = plt.subplots(figsize=(5, 2.6))
ax.plot(*zip(*curve), "o-"); ax.set_xlabel("distillation step"); ax.set_ylabel("held-out agreement"); ax.set_title("the draft's held-out curve")
plt.show()

# %% [markdown]
# **Acceptance per kind of prompt.** Guessing is easier in some code than in other: inside
# a function body, in a docstring, in a block of imports, and filling in the middle of a
# function (the shipped model is FIM-trained). Prompts of each kind are cut from held-out
# files; the same tokens are asserted for every draft.

# %%
typed = typed_prompts(tok, MODE.pick(fast=1, full=4), fim_format=ckpt.meta.get("fim_format", "psm"))
acc_by_kind = {}
for kind, ps in typed.items():
    ref_ids = [cl.generate_ids_cached(model, p_ids, max_new_tokens=n_new)[0] for p_ids in ps]
    for name, d in (("early exit (2 blocks)", draft), ("distilled (1 block)", distilled)):
        res = [cl.speculative_generate(model, d, p_ids, max_new_tokens=n_new, gamma=4) for p_ids in ps]
        assert [r[0] for r in res] == ref_ids, "speculative output must equal the target's greedy output"
        acc_by_kind[kind, name] = acceptance([r[2] for r in res])
print(f"{'prompt kind':<14}" + "".join(f"{name:>24}" for name in ("early exit (2 blocks)", "distilled (1 block)")))
for kind in typed:
    print(f"{kind:<14}" + "".join(f"{acc_by_kind[kind, name]:>24.2f}" for name in ("early exit (2 blocks)", "distilled (1 block)")))

# %% [markdown]
# ### At scale: what speculation buys on this model
# If each guess is accepted with probability `a`, a round yields `(1 - a^(gamma+1)) / (1 - a)`
# tokens (the line printed above, and the package's `expected_tokens_per_round`). Fewer
# target forwards buy time only when the draft is cheap: the expected speedup is
# E[tokens] / (gamma c + v), c the cost of a draft forward and v of verifying gamma + 1
# tokens, both in target decode steps. From here on the draft is the distilled one.

# %%
draft = distilled
plain_ids = [cl.generate_ids_cached(model, p_ids, max_new_tokens=n_new)[0] for p_ids in prompts]
spec_rows = []
for gamma in (1, 2, 4):
    res = [cl.speculative_generate(model, draft, p_ids, max_new_tokens=n_new, gamma=gamma) for p_ids in prompts]
    assert [r[0] for r in res] == plain_ids, "speculative output must equal the target's greedy output"
    acc = sum(r[2].accepted for r in res) / max(1, sum(r[2].accepted + r[2].rejections for r in res))
    per_round = sum(r[2].emitted for r in res) / max(1, sum(r[2].rounds for r in res))
    spec_rows.append((gamma, acc, per_round))
    print(f"gamma {gamma}: acceptance a = {acc:.2f}; tokens per target forward {per_round:.2f} "
          f"(formula {cl.expected_tokens_per_round(acc, gamma):.2f})")

ctx_ids = torch.tensor([prompts[0]])
T0 = ctx_ids.shape[1]


def step_fn(m, n=1):
    """One cached forward of ``n`` tokens after a ``T0``-token context (the cache is rewound each call)."""
    caches = cl.make_static_caches(m.cfg, 1, T0 + n, rolling=False)
    m(ctx_ids, positions=torch.arange(T0)[None], caches=caches)

    def one():
        for c_ in caches:
            c_.truncate(T0)
        m(ctx_ids[:, :n], positions=torch.arange(T0, T0 + n)[None], caches=caches, last_only=True)
    return one


# the forwards' costs, all in alternating rounds: target step, draft step, target verifying gamma + 1 tokens
steps_fns = {"target": step_fn(model), "draft": step_fn(draft)}
steps_fns.update({f"verify{g + 1}": step_fn(model, g + 1) for g, _, _ in spec_rows})
for fn in steps_fns.values():
    fn()  # warm-up
step_wall, _ = cl.interleaved_times(steps_fns, repeats=MODE.pick(fast=9, full=50))
# costs in target steps: the median over rounds of (this forward's time / the target step's time in the same round)
rel_cost = {k: cl.timing_ratio(v, step_wall["target"]).speedup for k, v in step_wall.items()}
c_draft = rel_cost["draft"]
print(f"draft forward: c = {c_draft:.2f} target steps (it shares the embedding and the {cfg.vocab_size}-way head); "
      + cl.timing_ratio(step_wall["target"], step_wall["draft"], a="a target step", b="a draft step").describe())
# whole generations, plain and speculative, alternating
gen_fns = {"plain": lambda: [cl.generate_ids_cached(model, p_ids, max_new_tokens=n_new) for p_ids in prompts]}
gen_fns.update({f"gamma{g}": (lambda g=g: [cl.speculative_generate(model, draft, p_ids, max_new_tokens=n_new, gamma=g)
                                           for p_ids in prompts]) for g, _, _ in spec_rows})
gen_wall, _ = cl.interleaved_times(gen_fns, repeats=3)
speedups, spec_cmp = {}, {}
for gamma, acc, per_round in spec_rows:
    v = rel_cost[f"verify{gamma + 1}"]
    spec_cmp[gamma] = cl.timing_ratio(gen_wall["plain"], gen_wall[f"gamma{gamma}"], a="plain decoding", b=f"speculation (gamma {gamma})")
    speedups[gamma] = (cl.expected_speedup(acc, gamma, c_draft, v), spec_cmp[gamma].speedup)
    print(f"gamma {gamma}: verify v = {v:.2f} steps; predicted speedup {speedups[gamma][0]:.2f}x; measured: {spec_cmp[gamma].describe()}")

a_grid = np.linspace(0, 0.99, 50)
fig, ax = plt.subplots(figsize=(5, 3))
for gamma, acc, per_round in spec_rows:
    line, = ax.plot(a_grid, [cl.expected_tokens_per_round(a, gamma) for a in a_grid], label=f"gamma={gamma}")
    ax.plot([acc], [per_round], "o", color=line.get_color())
ax.set_xlabel("acceptance rate a"); ax.set_ylabel("tokens per target forward"); ax.legend(); ax.set_title("measured (dots) vs formula")
plt.show()

# %% [markdown]
# The formula assumes guesses are accepted independently; real acceptances come in runs
# (easy stretches of code, then a hard token), so the measured tokens per round can sit
# above or below the curve. Here the draft shares the embedding and the 4096-way head, a
# large part of this tiny model's cost, and each eager forward pays a fixed per-operation
# overhead, so c stays large (printed above) however small the draft's block; the predicted
# speedup is what the formula gives at that c and the measured acceptance. With a 7B target
# and a 100M draft (c ~ 0.02) the formula turns the same acceptance rates into ~2-3x (a
# prediction, not measured here). The report and `codex-lab bench inference --scenarios
# speculative` also time the compiled `FastDecoder` beside it.

# %% [markdown]
# ### When speculation pays: prompt lookup on code edits
# The cheapest draft is no model at all: copy the tokens that followed the last n-gram's
# previous occurrence in the context (`cl.prompt_lookup_generate`, c = 0). It can pay only
# when the output repeats the prompt, as in an edit: below, the prompt is a function from
# held-out code followed by the renamed first line of the same function. On plain
# continuation of a file (the prompts above) there may be less to copy; and each verify
# forward of up to 17 tokens costs more than one decode step on a CPU. Which case gains
# more is measured (plain and lookup alternate, 3 rounds each), not assumed.

# %%
from codex_lab.lessons.l06_inference.fast_scenarios import code_edit_prompts

edit_prompts = code_edit_prompts(tok, MODE.pick(fast=2, full=6), max_prompt=cfg.max_seq_len - n_new)
lookup_rows = {}
for label, ps in (("code edit", edit_prompts), ("plain continuation", prompts)):
    plain = [cl.generate_ids_cached(model, p_ids, max_new_tokens=n_new)[0] for p_ids in ps]
    res = [cl.prompt_lookup_generate(model, p_ids, max_new_tokens=n_new, num_draft=16, min_ngram=2, max_ngram=4) for p_ids in ps]
    assert [r[0] for r in res] == plain, "prompt lookup must give the target's greedy tokens"
    lk_wall, _ = cl.interleaved_times({
        "plain": lambda: [cl.generate_ids_cached(model, p_ids, max_new_tokens=n_new) for p_ids in ps],
        "lookup": lambda: [cl.prompt_lookup_generate(model, p_ids, max_new_tokens=n_new, num_draft=16, min_ngram=2, max_ngram=4)
                           for p_ids in ps]}, repeats=3)
    acc = sum(r[2].accepted for r in res) / max(1, sum(r[2].accepted + r[2].rejections for r in res))
    per_call = sum(map(len, plain)) / sum(r[2].target_calls for r in res)
    lk = cl.timing_ratio(lk_wall["plain"], lk_wall["lookup"], a="plain decoding", b="prompt lookup")
    lookup_rows[label] = (acc, per_call, lk)
    print(f"{label:<19} acceptance {acc:.2f}, {per_call:.2f} tokens per target forward; {lk.describe()}")
edit_gain, plain_gain = lookup_rows["code edit"][1], lookup_rows["plain continuation"][1]
lookup_text = (f"prompt lookup saved more target forwards on {'code edits' if edit_gain > plain_gain else 'plain continuation'} "
               f"in this run ({edit_gain:.2f} tokens per forward on code edits, {plain_gain:.2f} on plain continuation)")
print(lookup_text)

# %% [markdown]
# ## 6. Measure: the interpreter out of the token loop
# Every step above is called from Python. Compiled with `torch.compile`, a step is one
# graph, but each call still enters Python and dynamo: the frame hook checks the guards (same
# shapes? same dtypes? same module?), the compiled wrapper unpacks the arguments, then the
# generated code runs. A batch-1 decode step of this model takes around a millisecond on a CPU
# (the rates below give this machine's), so that bookkeeping may be a real share: measured below. Compiled **ahead of time**, the step has none of
# it: `torch.export` captures the step once as a graph, AOTInductor writes C++ for it (the
# weights frozen in, the same kernels), and the package's runner is a C++ object; the Python
# loop calls it once per token and nothing else runs in between.
#
# `cl.FastDecoder` has the three: eager, `compile=True` (torch.compile) and `compile="aot"`
# (the package, built once in a child process and kept in the compile cache). Same step
# function, so the same tokens (checked first); then their loops alternate, rounds rotating.

# %%
aot_prompt = tok.encode("def read_config(path):\n    ")
N_AOT = MODE.pick(fast=48, full=128)
decoders = {"eager": cl.FastDecoder(model, max_len=256, compile=False),
            "torch.compile": cl.FastDecoder(model, max_len=256, compile=True),
            "ahead of time": cl.FastDecoder(model, max_len=256, compile="aot")}
first_call_s, aot_tokens = {}, {}
for name, d in decoders.items():
    t0 = time.perf_counter()
    aot_tokens[name] = d.generate(aot_prompt, N_AOT)[0]  # the first call compiles (or builds/loads the package)
    first_call_s[name] = time.perf_counter() - t0
    how = ("  (the package loaded from the compile cache: an earlier run built it)" if d.aot_from_disk else
           "  (the package built now)" if d.aot else "")
    print(f"{name:14s} first call {first_call_s[name]:6.1f} s{how}" + (f"  ({d.compile_error})" if d.compile_error else ""))
assert aot_tokens["torch.compile"] == aot_tokens["eager"] == aot_tokens["ahead of time"], "a compiled step changed the tokens"
aot_wall, _ = cl.interleaved_times({name: (lambda d=d: d.generate(aot_prompt, N_AOT)) for name, d in decoders.items()},
                                   repeats=MODE.pick(fast=5, full=9))
for name, ms in aot_wall.items():
    print(f"{name:14s} {N_AOT * 1000 / float(np.median(ms)):7.0f} tokens/s (rounds {min(ms):.0f}-{max(ms):.0f} ms)")
jit_cmp = cl.timing_ratio(aot_wall["eager"], aot_wall["torch.compile"], a="the eager step", b="the torch.compile'd step")
aot_cmp = cl.timing_ratio(aot_wall["torch.compile"], aot_wall["ahead of time"], a="the torch.compile'd step",
                          b="the ahead-of-time package")
print(jit_cmp.describe())
print(aot_cmp.describe())
# per token, the package's time minus the torch.compile'd step's (median round times, prefill included in both)
delta_us = (float(np.median(aot_wall["ahead of time"])) - float(np.median(aot_wall["torch.compile"]))) * 1000 / N_AOT
aot_delta = f"{abs(delta_us):.0f} us per token {'less' if delta_us < 0 else 'more'} than the torch.compile'd step"
print(f"the ahead-of-time package: {aot_delta}")

# %% [markdown]
# A restarted process does not compile again: a new decoder of the same weights and shape
# finds the package in the compile cache (keyed by the weights' bytes, the shape, the options,
# the torch build and the thread count) and loads it.

# %%
again = cl.FastDecoder(model, max_len=256, compile="aot")
load_s = again.prepare()
print(f"second decoder: package {'loaded from disk' if again.aot_from_disk else 'built'} in {load_s:.2f} s "
      f"(torch.compile's first call above: {first_call_s['torch.compile']:.1f} s, compiling again in every new process); "
      f"same tokens: {again.generate(aot_prompt, N_AOT)[0] == aot_tokens['eager']}")

# %% [markdown]
# ## Where the real systems take over
# vLLM and SGLang do all of this at scale: paged attention kernels that read the block table
# directly (no gather), chunked prefill, prefix caching, CUDA graphs for decode, and
# speculative decoding with trained draft heads (Medusa, EAGLE). The ideas are the ones
# above. `codex-lab bench inference --threads 1` times them all (HF `generate` on the same
# weights included); the opt-in `torch.compile` rung is `--scenarios compile`.
#
# Compiling pays only when the step has a **fixed shape** (gpt-fast's recipe); compiled as
# written above, the step sees a new length every token and recompiles. The package has
# the two fixed-shape steps, each held to the eager path token for token by the tests:
# - `cl.FastDecoder` (batch 1): a static cache of fixed length, every step attends over all
#   its slots under a mask, the position is a tensor, so one graph serves every token
#   (`--scenarios decode` prints its tokens/s against HF `generate`, with and without a
#   static cache and `torch.compile`, and its recompile count). At batch 1 a step reads every
#   weight once for a few FLOPs each, so its speed is how fast the weights can be read: the
#   decoder freezes them into the graph (the global `torch._inductor.config.freezing` must be
#   on while dynamo traces; the `options=` flag alone leaves them graph inputs) so that
#   Inductor's C++ GEMM template can pack them once and split each matrix-vector product
#   over the cores. Compiled on a
#   CPU, its decode step computes the one query's attention in plain tensor ops
#   (`cl.one_query_attention`: q.k for every slot, the masked softmax, the weighted sum of v),
#   which Inductor fuses into its own loops, where ATen's flash attention hands each head's
#   one-query products to MKL (`codex-lab bench inference --scenarios decode` times the two in
#   the same rounds; docs/PROFILE.md has both under the profiler);
# - `cl.FastDecoder(model, compile="aot")`: the same step compiled *ahead of time*
#   (`torch.export`, then AOTInductor): a package of C++ the Python loop calls once per token,
#   with no dynamo frame or guard inside a step, kept in the compile cache so a later process
#   loads it in milliseconds instead of compiling (`cl.aot_step`; `codex-lab generate --aot`).
#   Its `verify` step takes the last token and the guesses padded to one of a few fixed sizes
#   (`cl.verify_sizes`: 1, 2, 4, ... guesses), so prompt lookup runs on the compiled path too
#   (`cl.prompt_lookup_generate` given the decoder; `--scenarios code_edit` times both beside
#   the eager rows, tokens compared). There a verify is not free: each size's call is timed once
#   (`cl.verify_costs`), and each round verifies only the guesses that pay, the count with the
#   most expected tokens per millisecond at the acceptance seen so far (`cl.draft_length`);
# - `cl.Engine(..., compile=True)`: the batch is padded to `max_batch_size` rows (padding
#   rows write a scratch block no request owns) and each block table to a *bucket* (1, 1.5,
#   2, 3, 4, ... times 128 tokens), one graph per bucket, compiled before serving
#   (`--scenarios batching` adds the row `continuous_batching_compiled`). `codex-lab serve`
#   runs it with `cl.served_step_options(...)`: buckets from 48 tokens, and arriving prompts
#   ride in the same compiled step, one row per prompt token at its own position
#   (`cl.mixed_step`), in a second shape of twice the rows; `codex-lab bench serving
#   --compiled --prefill batched` compares it with the eager prefill beside the step. The
#   server compiles FastDecoder's options (frozen weights, the C++ GEMM template), which
#   Inductor does not cache, so there each shape is ONE graph symbolic in the table's length
#   (three in all, with a one-row shape for a request decoding alone) instead of one per bucket,
#   and each is compiled ahead of time as section 6's step is (`cl.paged_aot_step`: the same
#   step exported with the table's length a `torch.export.Dim`), kept in the compile cache: a
#   restarted server loads its three graphs instead of compiling them again (`python
#   scripts/restart_time.py` times a cold start and a restart; the record is printed below).
#
# How these steps compare with the strongest CPU engine, llama.cpp, on the same weights (an F32
# GGUF export), and where a lone stream's time goes in the serving engine, are recorded runs of
# `codex-lab bench inference --peer llama.cpp` and `codex-lab bench inference --scenarios single_stream --threads 1`
# (too slow for this notebook: both compile), as is prompt lookup on the compiled decoder
# (`--mode full --scenarios code_edit`, with what caps it); `--scenarios token_profile` splits a lone stream's
# time per token by operator (matmuls, attention, sampling, the compiled graph, other ops, and
# the Python no operator accounts for) under `torch.profiler`, and `--scenarios native_profile`
# puts FastDecoder and llama.cpp under one sampling profiler (Linux perf), so the two engines'
# decode steps split into the same categories: what llama.cpp does differently, measured. The
# cell prints the records, labelled as such, with their dates and conditions; rerun the commands
# for this machine's figures.

# %%
from codex_lab.lessons.l06_inference.report import (code_edit_lines, native_profile_lines, peer_lines, restart_lines,
                                                    single_stream_lines, token_profile_lines)

print(peer_lines())
print()
print(code_edit_lines())
print()
print(single_stream_lines())
print()
print(restart_lines())
print()
print(token_profile_lines())
print()
print(native_profile_lines())

# %% [markdown]
# ## What we measured
# Every line below is computed from this run; compared timings are alternating rounds with their range.

# %%
g_best = max(spec_rows, key=lambda r: r[2])
lines = [
    f"1. Our static cache (write a slot, attend up to the length) gives the plain generator's tokens for prompts of 1, 7 and 96 tokens; "
    f"it holds {per_tok:,} B per token, linear in length; at {long} tokens {cache_cmp.describe()}.",
    f"2. Per token, a {T_LONG}-token prefill costs {rows[-1][2]:.3f} ms and a decode step {rows[-1][3]:.2f} ms: {per_token.describe()}.",
    f"3. Our {n_req}-request scheduler (admit, prefill, decode, retire) produced the engine's tokens for every request in {my_steps} steps "
    f"(engine: {eng.steps}); {batching.describe()}; static batching needed {step_ratio:.2f}x the steps.",
    f"4. At 4 streams: TTFT p50 {row['ttft_p50_ms']:.0f} ms ({'meets' if row['ttft_p50_ms'] < 100 else 'misses'} the 100 ms target), "
    f"TBT p95 {row['tbt_p95_ms']:.0f} ms ({'meets' if row['tbt_p95_ms'] < 20 else 'misses'} the 20 ms target).",
    f"5. The speculative sampling rule kept the target distribution: chi-square p-values {verdicts['Leviathan/Chen rule'][0]:.2f} (first token) and "
    f"{verdicts['Leviathan/Chen rule'][1]:.2f} (second) over {N} rounds, while the two wrong rules were rejected (p-values "
    f"{max(verdicts['draft tokens unchecked'][:2]):.1e} and {min(verdicts['resample from p'][:2]):.1e}).",
    f"6. Greedy speculation equals the target's output. Acceptance at gamma 4 by prompt kind, early exit vs distilled draft: "
    + ", ".join(f"{k} {acc_by_kind[k, 'early exit (2 blocks)']:.2f} vs {acc_by_kind[k, 'distilled (1 block)']:.2f}" for k in typed)
    + f" (the distilled draft: {distill_state.describe()}). "
    f"On the code prompts the distilled draft is accepted at a = {g_best[1]:.2f} (gamma {g_best[0]}: "
    f"{g_best[2]:.2f} tokens per target forward), and costs c = {c_draft:.2f} target steps; measured: "
    + "; ".join(spec_cmp[g].describe() for g in spec_cmp)
    + (": speculation was slower than plain decoding in every round at every gamma on this model."
       if all(c.hi < 1.0 for c in spec_cmp.values()) else "."),
    f"7. Prompt lookup (no draft model) on code edits: acceptance {lookup_rows['code edit'][0]:.2f}, {edit_gain:.2f} tokens "
    f"per target forward, {lookup_rows['code edit'][2].describe()}; on plain continuation: acceptance "
    f"{lookup_rows['plain continuation'][0]:.2f}, {plain_gain:.2f} tokens per forward, {lookup_rows['plain continuation'][2].describe()}; "
    f"{lookup_text}.",
    f"8. Out of the token loop: {jit_cmp.describe()}; {aot_cmp.describe()} ({aot_delta}); a second "
    f"decoder {'loaded' if again.aot_from_disk else 'built'} the package in {load_s:.2f} s.",
]
print("\n".join(lines))

# %% [markdown]
# ## Questions to think about
# 1. Our cache returns slots up to the longest row's length, and rows of different lengths
#    share one forward. What would break if empty slots carried position 0 instead of -1?
# 2. The scheduler admits strictly first come, first served. Construct a queue where letting
#    a short request overtake a long one lowers mean TTFT, and say what it costs the long one.
# 3. In the sampling rule, why must a rejection draw from $\max(0, p - q)$ and not from $p$?
#    Check your answer against the chi-square line of the "resample from p" rule.
# 4. From `expected_speedup`, what acceptance rate would the distilled draft need to break
#    even at gamma = 4, given the measured c and v? What would halve c here: a smaller head
#    (a draft vocabulary of the most frequent tokens), or a compiled draft step?
# 5. Prefill is compute-bound and decode memory-bound. Which of the two does GQA (lesson 03)
#    speed up, and which does continuous batching?
#
# ## Further reading
# - Pope et al. 2022, *Efficiently Scaling Transformer Inference*: prefill vs decode, KV-cache memory.
# - Yu et al. 2022, *Orca: A Distributed Serving System for Transformer-Based Generative Models* (OSDI): iteration-level (continuous) batching.
# - Kwon et al. 2023, *Efficient Memory Management for Large Language Model Serving with PagedAttention* (SOSP, vLLM).
# - Leviathan, Kalman, Matias 2023, *Fast Inference from Transformers via Speculative Decoding* (ICML), and Chen et al. 2023, *Accelerating Large Language Model Decoding with Speculative Sampling*: the accept/reject rule and its proof.
# - Holtzman et al. 2020, *The Curious Case of Neural Text Degeneration*: top-p (nucleus) sampling.
# - Agrawal et al. 2024, *Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve*: chunked prefill.

# %% [markdown]
# ## Appendix: where the run-time figures come from
# The **Run time** line at the top and the figures below are read from one record,
# `codex_lab/assets/timings.json` (its `provenance` says how and when each was measured;
# `python scripts/update_figures.py` rewrites them, and `tests/test_figures.py` fails when
# the text and the record disagree). The header cell prints the estimate for your machine,
# scaled by its matrix-multiply calibration.
#
# - fast mode on CPU (CI's): the figure at the top;
# - standard mode (the CPU default): the report's section 06, 71 s on the reference machine
#   (`codex-lab --mode standard report --sections 06`);
# - full mode on one GPU: not yet measured (no GPU has been lent to the course).
