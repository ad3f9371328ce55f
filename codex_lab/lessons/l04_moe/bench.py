"""``codex-lab bench moe``: MoE dispatch speed, reference loop vs grouped vs HF Mixtral.

For each (tokens, experts, top_k) size, one random dropless MoE layer is timed (forward,
no gradient) as: ``reference`` (codex_lab's per-token loop), ``grouped`` (codex_lab's
sorted, one-matmul-per-expert dispatch; on a CPU its fused native kernel, ``kernel`` says
which ran), ``grouped_torch`` (the same dispatch's torch path, on a CPU), and the same
weights in transformers' ``MixtralSparseMoeBlock`` with its ``eager`` expert loop and its ``grouped_mm`` kernel.
Every record carries the max |difference| against the reference output, the layer's
total and active parameters, forward FLOPs per token (2 * active), the threads used and
the machine's 1-minute load average when the size was timed (above the core count, the
timings are "under load": other processes shared the cores, so compare ratios within one
run, never milliseconds across runs). The grouped row carries ``speedup_vs_fastest_hf``
(medians, the goal's figure) and ``speedup_vs_fastest_hf_best`` (each path's fastest round,
the steadier figure when other processes come and go).
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

import torch

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.moe import MoEFeedForward, ffn_param_counts
from codex_lab.nn.moe_native import moe_native_status
from codex_lab.runtime import get_device, interleaved_times, seed_everything

NAME = "moe"
HELP = "MoE dispatch: reference loop vs grouped vs HF Mixtral block (ms, speed-up, active/total params)"


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    """"T:E:k,T:E:k" -> [(tokens, experts, top_k), ...]; a clear error on bad input."""
    sizes = []
    for part in text.split(","):
        bits = part.strip().split(":")
        if len(bits) != 3 or not all(b.isdigit() for b in bits):
            raise ValueError(f"size {part!r} must look like TOKENS:EXPERTS:TOP_K, e.g. 1024:8:2")
        t, e, k = map(int, bits)
        if not 1 <= k <= e:
            raise ValueError(f"size {part!r}: top_k={k} must be in 1..experts={e}")
        sizes.append((t, e, k))
    return sizes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default=None, help="TOKENS:EXPERTS:TOP_K list (default depends on fast mode)")
    p.add_argument("--d-model", type=int, default=256, help="model width d (default 256, the shipped model's)")
    p.add_argument("--hidden", type=int, default=512, help="hidden width h of each expert (default 512)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per case (median reported)")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers Mixtral block")
    p.add_argument("--device", default=None, help="cpu / cuda (default: best available)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 gives stable numbers on a busy machine)")


def bench_case(tokens: int, experts: int, top_k: int, *, d_model: int, hidden: int, repeats: int,
               device: torch.device, with_hf: bool = True) -> list[dict[str, Any]]:
    """Time every implementation on one size; records in milliseconds (median)."""
    cfg = ModelConfig(vocab_size=16, d_model=d_model, n_layer=1, n_head=1, moe_layers=[0], n_experts=experts,
                      moe_top_k=top_k, moe_ffn_hidden=hidden, moe_capacity_factor=None)
    moe = MoEFeedForward(cfg).to(device).eval()
    with torch.no_grad():
        for p in moe.parameters():  # std 1/sqrt(fan-in)-like: O(1) activations, decisive routing
            p.normal_(0.0, 0.05)
    x = torch.randn(1, tokens, d_model, device=device)  # (1, N, d)
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    impls: dict[str, Any] = {}
    ref_moe = MoEFeedForward(cfg, impl="reference").to(device).eval()
    ref_moe.load_state_dict(moe.state_dict())
    impls["reference"] = ref_moe
    impls["grouped"] = moe
    if device.type == "cpu":  # the grouped dispatch's torch path, beside its fused native kernel
        torch_moe = MoEFeedForward(cfg).to(device).eval()
        torch_moe.load_state_dict(moe.state_dict())
        torch_moe.native = False
        impls["grouped_torch"] = torch_moe
    if with_hf:
        from codex_lab.hf.mixtral import moe_to_hf_block

        for kind in ("eager", "grouped_mm"):
            impls[f"hf_{kind}"] = moe_to_hf_block(moe, cfg, experts_implementation=kind)
    counts = ffn_param_counts(cfg)
    skipped: list[dict[str, Any]] = []
    outs: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name in list(impls):
            try:
                outs[name] = impls[name](x)  # (1, N, d); also the warm-up
            except (RuntimeError, NotImplementedError) as exc:  # e.g. a kernel this device/dtype lacks
                if name in ("reference", "grouped", "grouped_torch"):
                    raise
                del impls[name]
                skipped.append({"impl": name, "tokens": tokens, "experts": experts, "top_k": top_k,
                                "median_ms": None, "max_abs_diff": None, "error": f"{type(exc).__name__}: {exc}"[:200]})
        ref_out = outs["reference"]
        wall, cpu = interleaved_times({name: (lambda m=mod: m(x)) for name, mod in impls.items()}, repeats, sync)
    load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else -1.0
    rows: list[dict[str, Any]] = []
    for name in impls:
        ms = statistics.median(wall[name])
        rows.append({
            "impl": name, "tokens": tokens, "experts": experts, "top_k": top_k, "d_model": d_model,
            "hidden": hidden, "median_ms": round(ms, 3), "min_ms": round(min(wall[name]), 3),
            "median_cpu_ms": round(statistics.median(cpu[name]), 3),
            "max_abs_diff": float((outs[name] - ref_out).abs().max()),
            "total_params": counts["total"], "active_params": counts["active"],
            # forward FLOPs per token ~ 2 * active weights (one multiply-add each)
            "flops_per_token": 2 * counts["active"], "device": str(device),
            "threads": torch.get_num_threads(), "load_avg_1m": load,
        })
        if name == "grouped" and device.type == "cpu":  # which path the grouped dispatch ran, and why
            why = moe_native_status()
            rows[-1]["kernel"] = f"torch ({why})" if why else "native"
    ref_ms = rows[0]["median_ms"]
    for r in rows:
        r["speedup_vs_reference"] = round(ref_ms / r["median_ms"], 2)
    grouped_ms = next(r["median_ms"] for r in rows if r["impl"] == "grouped")
    for r in rows:
        r["ms_vs_grouped"] = round(r["median_ms"] / grouped_ms, 2)
    hf = [r for r in rows if r["impl"].startswith("hf_")]
    if hf:  # the goal: grouped at least as fast as the fastest HF Mixtral block path
        fastest = min(hf, key=lambda r: r["median_ms"])
        for r in rows:
            if r["impl"] == "grouped":
                r["fastest_hf"] = fastest["impl"]
                r["speedup_vs_fastest_hf"] = round(fastest["median_ms"] / grouped_ms, 3)
                r["speedup_vs_fastest_hf_best"] = round(min(h["min_ms"] for h in hf) / r["min_ms"], 3)
    return rows + skipped


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """All sizes, all implementations, one run (ratios comparable)."""
    seed_everything(0)
    threads = getattr(args, "threads", None)
    if threads:
        torch.set_num_threads(threads)
    device = get_device(getattr(args, "device", None))
    sizes = parse_sizes(args.sizes) if getattr(args, "sizes", None) else args.mode.pick(
        fast=[(256, 8, 2), (512, 8, 2), (512, 16, 4)],
        full=[(512, 8, 2), (2048, 8, 2), (2048, 16, 2), (2048, 16, 4), (8192, 8, 2)],
    )
    # fast mode: 5 rounds, not 3, so one disturbed round cannot move a median
    repeats = getattr(args, "repeats", None) or args.mode.pick(fast=5, full=7)
    rows: list[dict[str, Any]] = []
    for t, e, k in sizes:
        rows += bench_case(t, e, k, d_model=getattr(args, "d_model", 256), hidden=getattr(args, "hidden", 512),
                           repeats=repeats, device=device, with_hf=not getattr(args, "no_hf", False))
    return rows
