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
# # Lesson 07: a monitored server, release gates, canary and rollback
# <a href="https://colab.research.google.com/github/codex-lab/codex-lab/blob/main/notebooks/07_serving.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open in Colab"/></a>
#
# **Run time:** fast mode on CPU: 26 s (2 cores, measured with `scripts/time_notebooks.py`); full mode on one GPU: not yet measured.
#
# The article (section 4 of the seed) asks a code model in production for: time to first
# token (TTFT) under 100 ms, time between tokens (TBT) under 20 ms, every request done within
# 30 s, peak memory and success rate watched, at least two previous versions kept, and every
# new version gated on syntax, function and style tests and compared with the baseline before
# it gets traffic. This lesson builds all of it around the continuous-batching engine of
# lesson 06 and measures it:
#
# 1. an OpenAI-compatible server (`codex_lab.serve.app`) with Prometheus metrics (`codex_lab.serve.metrics`);
# 2. TTFT/TBT from token timestamps, and SLO attainment read straight off histogram buckets;
# 3. load: 4 streams against the targets, 64 streams with clients hanging up, 200 malformed requests;
# 4. a model registry with checksums (`codex_lab.serve.registry`);
# 5. release gates (`codex_lab.serve.gates`) that refuse a damaged candidate;
# 6. a canary (`codex_lab.serve.canary`): a slow candidate gets live traffic and is rolled back
#    automatically, with no failed client request; a healthy one is promoted.

# %%
import sys

if "google.colab" in sys.modules:  # Colab only: install the course (torch/numpy untouched)
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/codex-lab/codex-lab@main"], check=True)

# %%
import copy
import json
import math
import tempfile
import threading
import time

import httpx
import ipywidgets as widgets
import matplotlib.pyplot as plt
import openai
import torch
from IPython.display import display

import codex_lab as cl
from codex_lab.serve.canary import CanaryController, CanaryPolicy
from codex_lab.serve.gates import SUITE, engine_completer, gate_decision, run_gates
from codex_lab.serve.loadtest import malformed_storm, run_load
from codex_lab.serve.metrics import ServerMetrics, histogram_attainment, parse_metrics
from codex_lab.serve.registry import ChecksumError, Registry
from codex_lab.serve.app import ModelServer, ServerConfig, serve_in_background

cl.seed_everything(0)
FAST = cl.fast_mode()
# The engine thread, the HTTP event loop and the load clients share this machine's cores:
# one intra-op thread per matrix multiply avoids threads spinning against each other
# (on a busy 2-core machine, 2 threads made the engine over 10x slower in our runs).
torch.set_num_threads(1)
print("fast mode:", FAST, "| torch threads:", torch.get_num_threads())

# %% [markdown]
# ## 1. A registry, and a server in the background
# The shipped tiny model becomes version `v0001` of a registry: a folder per version with
# the weights (safetensors), config, tokenizer and a manifest (parent, creation time, a
# SHA-256 per file, gate results). The server runs uvicorn in a background thread on a free
# loopback port; each served version has its own engine thread.

# %%
reg = Registry(tempfile.mkdtemp(prefix="codex-lab-registry-"))
ckpt = cl.load_pretrained()
v1 = reg.add(ckpt.model, ckpt.tokenizer, note="shipped tiny model")
reg.promote(v1)
base = reg.load()  # verified against its checksum, then loaded
server = ModelServer(base.tokenizer, ServerConfig(model_name="codex-lab-tiny", max_batch_size=8, max_waiting=64))
server.add_version(v1, base.model)
bg = serve_in_background(server)
print("serving", reg.current(), "at", bg.url, "| manifest sha256", reg.manifest(v1).sha256[:16])
print(httpx.get(bg.url + "/health").json())

# %% [markdown]
# The official `openai` client works unchanged: point `base_url` at the server.

# %%
client = openai.OpenAI(base_url=bg.url + "/v1", api_key="not-needed", max_retries=0)
r = client.completions.create(model="codex-lab-tiny", prompt="def fibonacci(n):", max_tokens=24, temperature=0)
print(repr(r.choices[0].text), r.choices[0].finish_reason, r.usage)
pieces = [c.choices[0].text for c in client.completions.create(model="codex-lab-tiny", prompt="def fibonacci(n):",
                                                                max_tokens=24, temperature=0, stream=True) if c.choices]
print(len(pieces), "streamed chunks")
assert "".join(pieces) == r.choices[0].text  # streaming and plain give the same greedy text

# %% [markdown]
# ## 2. TTFT and TBT, from scratch and from the histograms
# A client timestamps each streamed chunk: TTFT = first token - request sent, TBT = gaps
# between tokens. The server records the same quantities into Prometheus histograms whose
# bucket edges include 0.1 s and 0.02 s, so the share within the SLO is one bucket divided
# by the total (buckets are cumulative). We check the bucket reading against a direct count
# of the raw observations.

# %%
def ttft_tbt(arrival, token_times):
    """(TTFT, [gaps]) in seconds from a request's arrival and its token times."""
    if not token_times:
        return None, []
    return token_times[0] - arrival, [b - a for a, b in zip(token_times, token_times[1:])]


metrics = ServerMetrics("codex-lab-tiny")  # the server's metrics class, fresh (empty histograms)
raw_ttft, raw_tbt = [], []
for i, prob in enumerate(SUITE[:4]):
    t0, times = time.perf_counter(), []
    with httpx.stream("POST", bg.url + "/v1/completions",
                      json={"model": "codex-lab-tiny", "prompt": prob.prompt, "max_tokens": 16, "stream": True}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                times.append(time.perf_counter())
    ttft, tbt = ttft_tbt(t0, times)
    raw_ttft.append(ttft)
    raw_tbt += tbt
    metrics.observe_request("demo", arrival=t0, token_times=times, prompt_tokens=0, finish_reason="length")
fams = parse_metrics(metrics.render().decode())
tbt_buckets = [(float(lab["le"]), v) for lab, v in fams["codex_lab:inter_token_latency_seconds_bucket"]]
from_hist = histogram_attainment(tbt_buckets, 0.02)
direct = sum(x <= 0.02 for x in raw_tbt) / len(raw_tbt)
print(f"TTFT per request (ms): {[round(x * 1000, 1) for x in raw_ttft]}")
print(f"TBT <= 20 ms: {from_hist:.1%} from the histogram, {direct:.1%} counted directly ({len(raw_tbt)} gaps)")
assert math.isclose(from_hist, direct)  # same observations, and 0.02 is an exact bucket edge

# %% [markdown]
# ## 3. Load: 4 concurrent streams against the seed's targets
# `codex_lab.serve.loadtest` opens concurrent streaming clients (loopback only, bounded in
# requests and time) and reports what the clients see. A live dashboard (ipywidgets) reads
# `/metrics` while the load runs.

# %%
dash = widgets.HTML()
display(dash)


def refresh_dashboard() -> dict:
    """Read /metrics and show the headline numbers; return them."""
    m = parse_metrics(httpx.get(bg.url + "/metrics").text)
    val = lambda name: sum(v for _, v in m.get(name, []))  # noqa: E731
    ttft_b = [(float(lab["le"]), v) for lab, v in m.get("codex_lab:time_to_first_token_seconds_bucket", [])]
    itl_b = [(float(lab["le"]), v) for lab, v in m.get("codex_lab:inter_token_latency_seconds_bucket", [])]
    row = {
        "running": val("codex_lab:num_requests_running"), "waiting": val("codex_lab:num_requests_waiting"),
        "KV usage": f"{val('codex_lab:kv_cache_usage_perc'):.1%}",
        "peak memory MiB": round(val("codex_lab:peak_memory_bytes") / 2**20),
        "generated tokens": val("codex_lab:generation_tokens_total"),
        "TTFT<=100ms": f"{histogram_attainment(ttft_b, 0.1):.1%}" if ttft_b else "-",
        "TBT<=20ms": f"{histogram_attainment(itl_b, 0.02):.1%}" if itl_b else "-",
        "errors": val("codex_lab:request_errors_total"),
    }
    dash.value = "<table>" + "".join(f"<tr><td>{k}</td><td><b>{v}</b></td></tr>" for k, v in row.items()) + "</table>"
    return row


result = {}
load = threading.Thread(target=lambda: result.update(rep=run_load(bg.url, concurrency=4, requests=cl.pick(fast=16, full=64),
                                                                  max_tokens=32, duration_s=60)))
load.start()
while load.is_alive():
    refresh_dashboard()
    time.sleep(0.5)
load.join()
row = refresh_dashboard()
s4 = result["rep"].summary()
print(json.dumps({k: s4[k] for k in ("requests_ok", "errors", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tbt_p50_ms",
                                     "tbt_p95_ms", "tbt_p99_ms", "ttft_share_under_100ms", "tbt_share_under_20ms",
                                     "tokens_per_s")}, indent=1))
print(f"seed targets at p95 with 4 streams: TTFT {s4['ttft_p95_ms']:.0f} ms (< 100: {s4['ttft_p95_ms'] < 100}), "
      f"TBT {s4['tbt_p95_ms']:.1f} ms (< 20: {s4['tbt_p95_ms'] < 20})")
assert s4["errors"] == 0 and s4["requests_ok"] == cl.pick(fast=16, full=64)

# %%
m = parse_metrics(httpx.get(bg.url + "/metrics").text)
fig, axes = plt.subplots(1, 2, figsize=(9, 3))
for ax, name, target in ((axes[0], "time_to_first_token_seconds", 0.1), (axes[1], "inter_token_latency_seconds", 0.02)):
    b = sorted((float(lab["le"]), v) for lab, v in m[f"codex_lab:{name}_bucket"] if lab["version"] == v1)
    edges = [le for le, _ in b[:-1]]
    ax.step(edges, [v / b[-1][1] for _, v in b[:-1]], where="post")
    ax.axvline(target, color="red", ls="--", label=f"target {target * 1000:.0f} ms")
    ax.set_xscale("log"); ax.set_xlabel("seconds"); ax.set_ylabel("share <= x"); ax.set_title(name); ax.legend()
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 4. Stress: 64 streams, clients hanging up at random; then 200 malformed requests
# A client that disconnects mid-stream must free its slot at once (the server cancels it in
# the engine); nothing may leak. Bad input must get an OpenAI-shaped 4xx, never a crash.

# %%
stress_s = cl.pick(fast=4.0, full=60.0)
t0 = time.perf_counter()
rep64 = run_load(bg.url, concurrency=64, requests=100_000, duration_s=stress_s, max_tokens=24, disconnect_prob=0.5, seed=1)
s64 = rep64.summary()
time.sleep(0.3)
h = httpx.get(bg.url + "/health").json()
print(f"{stress_s:.0f} s of issuing, {time.perf_counter() - t0:.1f} s total: {s64['requests_ok']} completed, "
      f"{s64['disconnected']} hung up, {s64['errors']} errors; {s64['tokens_per_s']} tokens/s")
print("after the storm:", {k: h[k] for k in ("in_flight", "running", "waiting", "kv_used_tokens")})
assert s64["errors"] == 0 and s64["disconnected"] > 0
assert h["in_flight"] == h["running"] == h["waiting"] == h["kv_used_tokens"] == 0  # zero leaked slots

# %%
storm = malformed_storm(bg.url, 200)
print(storm)
assert storm["server_errors"] == 0 and storm["non_4xx"] == 0 and storm["bad_error_shape"] == [] and storm["healthy_after"]

# %% [markdown]
# ## 5. Release gates: a damaged candidate is refused
# The suite: 8 fixed function prompts with tests. Gates: syntax (the body parses and is not
# empty), functional (the tests pass in the sandbox: subprocess, time and memory limits, no
# network, a temporary folder), style (an explicit consistency measure: 4-space indentation,
# snake_case names, lines <= 79), and latency attainment. A candidate passes only if it is no
# worse than the baseline on every gate. The candidate here is the shipped model with noise
# added to every weight (a botched fine-tune, say).

# %%
max_new = 48  # tokens per answer (about 1 s per suite run on one CPU thread)
baseline_gates = run_gates(engine_completer(base.model, base.tokenizer), max_tokens=max_new)
damaged = copy.deepcopy(base.model)
g = torch.Generator().manual_seed(0)
with torch.no_grad():
    for p in damaged.parameters():
        p.add_(torch.randn(p.shape, generator=g) * p.std())  # noise as large as each tensor's spread
damaged_gates = run_gates(engine_completer(damaged, base.tokenizer), max_tokens=max_new)
ok_damaged, why = gate_decision(damaged_gates.scores(), baseline_gates.scores())
for name, rep in (("baseline", baseline_gates), ("damaged", damaged_gates)):
    print(f"{name:>9}: " + ", ".join(f"{k} {v:.2f}" for k, v in rep.scores().items()))
print("damaged candidate passes:", ok_damaged, why)
print("a baseline answer:", repr(baseline_gates.samples[0][1][:120]))
v2 = reg.add(damaged, base.tokenizer, gates={"passed": ok_damaged, "reasons": why, **damaged_gates.scores()},
             note="noise-damaged candidate")
assert not ok_damaged

# %% [markdown]
# A copy of the baseline passes against the baseline (greedy decoding gives the same text;
# latency attainment has a tolerance of 0.10 because timing on a shared machine is noisy).

# %%
same_gates = run_gates(engine_completer(copy.deepcopy(base.model), base.tokenizer), max_tokens=max_new)
ok_same, why_same = gate_decision(same_gates.scores(), baseline_gates.scores())
print("copy passes:", ok_same, why_same)
v3 = reg.add(copy.deepcopy(base.model), base.tokenizer, gates={"passed": ok_same, **same_gates.scores()},
             note="re-release of v0001")
assert (same_gates.syntax, same_gates.functional, same_gates.style) == (
    baseline_gates.syntax, baseline_gates.functional, baseline_gates.style)

# %% [markdown]
# ## 6. Canary: a slow candidate rolled back, a healthy one promoted
# The canary gets a share of live traffic; the controller compares its live metrics with the
# primary's over the same window. The slow candidate has an injected delay of 0.1 s per
# engine step (as if it ran on a slower kernel): every token misses the 20 ms target.
# Rolling back only stops new traffic to it; its requests in flight finish, so clients see
# no failure.

# %%
policy = CanaryPolicy(share=0.3, min_requests=cl.pick(fast=5, full=20), promote_after=cl.pick(fast=10, full=60))
canary = CanaryController(server, policy, registry=reg)
canary.start("v0003-slow", reg.load(v3).model, step_delay_s=0.1)
canary.watch(interval_s=0.2, timeout_s=120)
rep_c = run_load(bg.url, concurrency=4, requests=cl.pick(fast=24, full=120), max_tokens=16, duration_s=120)
d = canary.join(120)
print(d.action, d.reasons)
print("canary window:", {k: round(v, 3) for k, v in d.canary.items() if k in ("n", "ttft_attainment", "tbt_attainment", "error_rate")})
print("primary window:", {k: round(v, 3) for k, v in d.primary.items() if k in ("n", "ttft_attainment", "tbt_attainment", "error_rate")})
print("client errors during the canary:", rep_c.summary()["errors"], "| serving now:", server.primary, server.canary)
assert d.action == "rollback" and rep_c.summary()["errors"] == 0 and server.canary is None

# %%
canary2 = CanaryController(server, policy, registry=reg)
canary2.start(v3, reg.load(v3).model)
canary2.watch(interval_s=0.2, timeout_s=120)
rep_p = run_load(bg.url, concurrency=4, requests=cl.pick(fast=40, full=200), max_tokens=16, duration_s=120)
d2 = canary2.join(120)
print(d2.action, d2.reasons, "| serving now:", server.primary, "| registry current:", reg.current())
print("decisions along the way:", [x.action for x in canary2.decisions][-5:])
assert rep_p.summary()["errors"] == 0
if d2.action == "promote":
    assert server.primary == v3 and reg.current() == v3

# %% [markdown]
# ## 7. Registry: rollback, retention, tampering
# Rollback goes back to the previous promoted version that still passes its checksum. The
# registry keeps the current version, two previously promoted ones, and candidates newer
# than the current one. A checkpoint changed on disk after registration fails its checksum
# and is refused.

# %%
for v in (v3,) if reg.current() != v3 else ():
    reg.promote(v)
print("history:", reg.history())
print("rolled back to:", reg.rollback())
print("versions on disk:", reg.versions(), "(the refused candidate was pruned when v0003 was promoted)")
w = reg.path(v3) / "model.safetensors"  # flip one byte of the version we just left
blob = bytearray(w.read_bytes()); blob[-3] ^= 0xFF; w.write_bytes(bytes(blob))
try:
    reg.promote(v3)
    refused = False
except ChecksumError as exc:
    refused = True
    print("refused:", str(exc)[:110], "...")
for row in reg.table():
    print(row)
assert refused and reg.current() == v1

# %% [markdown]
# ## Summary
# The numbers above are this run's; `codex-lab report` records them with verdicts,
# `codex-lab loadtest --json` measures any running server the same way, and
# `codex-lab bench serving --concurrency 1,4,8` compares concurrency levels in one run.
# Latency on a shared machine moves with its load: measure on a quiet one before judging
# the 100 ms / 20 ms targets.

# %%
print(f"4 streams: TTFT p95 {s4['ttft_p95_ms']:.0f} ms (target 100), TBT p95 {s4['tbt_p95_ms']:.1f} ms (target 20); "
      f"{s4['ttft_share_under_100ms']:.0%} / {s4['tbt_share_under_20ms']:.0%} within target")
print(f"64 streams with hang-ups: {s64['errors']} errors, leaked slots 0; 200 malformed: {storm['server_errors']} server errors")
print(f"gates: damaged candidate refused ({'; '.join(why)}); canary: slow candidate {d.action}, healthy {d2.action}")
bg.stop()
