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
# # Lesson 07 exercises: serving metrics and release gates
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/solutions/07_serving.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# Write each function between the markers, then run the `check(...)` cell below it.
# `check` runs the *public* checks and prints `passed`, `not yet done` or the failure.
# Grade the whole file from a terminal with `codex-lab grade exercises/07_serving.py`.
#
# **Run time:** fast mode on CPU (2 cores): ~15 s; on one GPU: not yet measured.

# %%
import sys

if "google.colab" in sys.modules:  # Colab only: install the course (torch/numpy untouched)
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/codex-lab/codex-lab@main"], check=True)

# %%
import json
import math
import time

import httpx

from codex_lab import ModelServer, ServerConfig, check, load_pretrained, parse_metrics, seed_everything, serve_in_background

seed_everything(0)
ckpt = load_pretrained()
server = ModelServer(ckpt.tokenizer, ServerConfig(model_name="codex-lab-tiny"))
server.add_version("v0001", ckpt.model)
bg = serve_in_background(server)  # a real server on a free 127.0.0.1 port
print("serving at", bg.url)


# %% [markdown]
# ## Exercise 1: TTFT and TBT from token timestamps
# A request arrives at `arrival` (seconds) and its tokens come out at `token_times`.
# Time to first token is `token_times[0] - arrival`; the times between tokens are the gaps
# between consecutive tokens (n tokens have n - 1 gaps), as a list. With no tokens, return `(None, [])`.

# %%
def ttft_tbt(arrival, token_times):
    """(TTFT in seconds or None, list of the gaps between consecutive tokens in seconds)."""
    raise NotImplementedError("exercise ttft_tbt: not yet done")


# %%
if check(ttft_tbt).status == "passed":
    # the same measurement on a real streamed request, as a client sees it
    t0, times = time.perf_counter(), []
    with httpx.stream("POST", bg.url + "/v1/completions",
                      json={"model": "codex-lab-tiny", "prompt": "def add(a, b):\n", "max_tokens": 16, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                times.append(time.perf_counter())
    ttft, tbt = ttft_tbt(t0, times)
    print(f"TTFT {ttft * 1000:.1f} ms, median TBT {sorted(tbt)[len(tbt) // 2] * 1000:.1f} ms over {len(times)} chunks (under load)")
else:
    print("skipped: the live measurement needs ttft_tbt")


# %% [markdown]
# ## Exercise 2: SLO attainment straight off a Prometheus histogram
# Prometheus histogram buckets are **cumulative**: the bucket `le=0.1` counts every
# observation <= 0.1 s, and `le=+Inf` counts all of them. So the share of requests within a
# target is `bucket(le=target) / bucket(le=+Inf)`, provided the target is a bucket edge
# (between edges the share is unknown: raise `ValueError`). No observations: return `nan`.
# `buckets` is a list of `(le, cumulative_count)` in any order.

# %%
def slo_attainment(buckets, target):
    """Share of observations <= target (a bucket edge) from cumulative buckets; nan if empty."""
    raise NotImplementedError("exercise slo_attainment: not yet done")


# %%
if check(slo_attainment).status == "passed":
    fams = parse_metrics(httpx.get(bg.url + "/metrics").text)
    buckets = [(float(lab["le"]), v) for lab, v in fams["codex_lab:inter_token_latency_seconds_bucket"]]
    print(f"share of token gaps within 20 ms on this server so far: {slo_attainment(buckets, 0.02):.1%}")
else:
    print("skipped: reading the server's histogram needs slo_attainment")


# %% [markdown]
# ## Exercise 3: the release-gate decision rule
# A candidate passes only if it is **no worse than the baseline on every gate**:
# `candidate[g] >= baseline[g] - tolerance.get(g, 0)` for each gate `g` of the baseline.
# A gate the candidate has no number for, or whose number is NaN (the gate did not run),
# fails. (An average over gates would let a regression on one gate hide behind a gain on
# another.) Write it yourself: the package's `gate_decision` is unavailable while the check runs.

# %%
def passes_gates(candidate, baseline, tolerance):
    """True when the candidate is no worse than the baseline on every gate (within tolerance)."""
    raise NotImplementedError("exercise passes_gates: not yet done")


# %%
if check(passes_gates).status == "passed":
    print("better syntax, worse functional:", passes_gates({"syntax": 0.9, "functional": 0.2}, {"syntax": 0.8, "functional": 0.3}, {}))
    print("a gate that did not run (NaN):", passes_gates({"syntax": float("nan")}, {"syntax": 0.8}, {}))
else:
    print("skipped: the examples need passes_gates")
bg.stop()

# %% [markdown]
# ## Exercise 4 (derive it): the largest batch that still meets the TBT target
# A continuous-batching engine gives every running stream one token per decode step, so each
# stream's time between tokens *is* the step time. On a CPU the step time grows with the batch
# B: model it as $t(B) = a + bB$ milliseconds, where $a$ is what a step pays once (reading the
# weights) and $b$ what each row adds. Derive, on paper first, the largest batch whose streams
# all meet a TBT target of $T$ ms ($t(B) \le T$), and the tokens per second the engine then
# produces. Return `(B, tokens_per_s)`: an int and a float; `(0, 0.0)` when even one stream
# misses the target. ($a \ge 0$, $b > 0$.)
#
# Hints: how many tokens does one step produce, and how long does it take? Which way do you
# round, and is a step time exactly at the target a hit? The cell under the check runs a toy
# engine whose step takes $a + bB$ and measures what your formula predicts.

# %%
def max_batch_under_tbt(a_ms, b_ms, tbt_ms):
    """Step time a + b B (ms) and a TBT target (ms) -> (largest batch meeting it, tokens/s there)."""
    raise NotImplementedError("exercise max_batch_under_tbt: not yet done")


# %%
if check(max_batch_under_tbt).status == "passed":
    a, b, target = 6.0, 1.5, 20.0  # an illustration, not a measurement
    batch, tps = max_batch_under_tbt(a, b, target)
    # a toy engine: each step serves every stream one token and takes a + b B milliseconds
    clock, gaps, tokens = 0.0, [], 0
    for _ in range(50):
        step = a + b * batch
        clock += step
        gaps.append(step)
        tokens += batch
    print(f"B = {batch}: every gap {max(gaps):.1f} ms <= {target} ms; {tokens / clock * 1000:.0f} tokens/s simulated, "
          f"{tps:.0f} by your formula; one more stream: {a + b * (batch + 1):.1f} ms per token")
else:
    print("exercise 4 not yet done: the toy engine runs once check(max_batch_under_tbt) passes")
