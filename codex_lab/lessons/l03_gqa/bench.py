"""``codex-lab bench gqa``: KV-cache bytes and cached decode speed per group size g.

For each g, a randomly initialised model with ``n_head`` query heads and ``n_head / g``
K/V heads prefills ``--context`` tokens for ``--batch`` sequences, then decodes
``--steps`` tokens one at a time. Records: the cache bytes measured on the cache tensors
(and the formula's, which must be equal), decode milliseconds per step (median over
rounds; the group sizes are timed round-robin so load from other processes spreads
evenly), tokens per second and the speed-up over MHA (g = 1) from the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from codex_lab.infer.generate import stream_tokens
from codex_lab.infer.sampling import SamplingParams
from codex_lab.nn.accounting import kv_cache_bytes, measured_cache_bytes
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.runtime import get_device, seed_everything

NAME = "gqa"
HELP = "GQA: KV-cache bytes (measured = formula) and cached decode ms/step per group size g"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--groups", default="1,2,4,8", help="group sizes g, comma-separated (each must divide --heads)")
    p.add_argument("--heads", type=int, default=8, help="query heads (default 8)")
    p.add_argument("--d-model", type=int, default=256, help="model width (default 256)")
    p.add_argument("--layers", type=int, default=4, help="layers (default 4)")
    p.add_argument("--batch", type=int, default=None, help="sequences decoded together")
    p.add_argument("--context", type=int, default=None, help="prefilled tokens per sequence")
    p.add_argument("--steps", type=int, default=None, help="decode steps timed per round")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (median reported)")
    p.add_argument("--device", default=None, help="cpu / cuda (default: best available)")


def parse_groups(text: str, n_head: int) -> list[int]:
    """"1,2,4" -> [1, 2, 4]; a clear error when a value is not a divisor of ``n_head``."""
    try:
        groups = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ValueError(f"--groups {text!r} must be comma-separated integers, e.g. 1,2,4,8") from exc
    bad = [g for g in groups if g < 1 or n_head % g]
    if bad or not groups:
        raise ValueError(f"group sizes {bad or text!r} must divide --heads={n_head}")
    return groups


@torch.no_grad()
def _decode_ms(model: CodexModel, prompt: torch.Tensor, steps: int, device: torch.device) -> float:
    """Prefill ``prompt`` (B, S) into a fresh dynamic cache (untimed), then time ``steps``
    greedy decode steps of the one generation loop; ms/step."""
    tokens = stream_tokens(model, prompt, SamplingParams(max_tokens=steps + 1), cache="dynamic")
    next(tokens)  # prefill + the first token
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        next(tokens)  # one decode step: a forward of length 1
    sync()
    return (time.perf_counter() - t0) * 1000.0 / steps


@torch.no_grad()
def decode_tokens_per_s(model: CodexModel, *, batch: int = 8, prompt_len: int = 128, new_tokens: int = 32, repeats: int = 3) -> float:
    """Greedy cached decoding speed in generated tokens per second (all sequences counted).

    Prefills ``prompt_len`` random tokens into a fresh dynamic cache, then decodes
    ``new_tokens`` steps one token at a time; the median of ``repeats`` timed runs (after
    one warm-up) is reported. Prefill time is excluded.
    """
    device = next(model.parameters()).device
    model.eval()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.cfg.vocab_size, (batch, prompt_len), generator=gen).to(device)  # (B, T)
    _decode_ms(model, prompt, new_tokens, device)  # warm-up
    ms = statistics.median(_decode_ms(model, prompt, new_tokens, device) for _ in range(repeats))
    # tokens/s = batch * 1000 ms / ms per decode step
    return batch * 1000.0 / ms


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One record per group size (see the module docstring)."""
    device = get_device(args.device)
    groups = parse_groups(args.groups, args.heads)
    batch = args.batch or args.mode.pick(fast=4, full=32)
    context = args.context or args.mode.pick(fast=128, full=2048)
    steps = args.steps or args.mode.pick(fast=8, full=64)
    repeats = args.repeats or args.mode.pick(fast=3, full=7)
    seed_everything(0)
    models = {}
    for g in groups:
        cfg = ModelConfig(vocab_size=4096, d_model=args.d_model, n_layer=args.layers, n_head=args.heads,
                          n_kv_head=args.heads // g, max_seq_len=context + steps + 1)
        models[g] = CodexModel(cfg).to(device).eval()
    prompt = torch.randint(0, 4096, (batch, context), generator=torch.Generator().manual_seed(0)).to(device)  # (B, S)
    times: dict[int, list[float]] = {g: [] for g in groups}
    for g in groups:  # warm-up
        _decode_ms(models[g], prompt, 1, device)
    for _ in range(repeats):
        for g in groups:  # round-robin: load from other processes hits every g alike
            times[g].append(_decode_ms(models[g], prompt, steps, device))
    base_ms = statistics.median(times[groups[0]])
    rows = []
    for g in groups:
        m = models[g]
        ms = statistics.median(times[g])
        formula = kv_cache_bytes(m.cfg, batch, context)
        measured = measured_cache_bytes(m, batch, context)
        if measured != formula:
            raise AssertionError(f"g={g}: measured cache bytes {measured} != formula {formula}")
        rows.append({
            "g": g, "kv_heads": m.cfg.n_kv_head, "batch": batch, "context": context, "device": str(device),
            "kv_bytes": measured, "kv_bytes_formula": formula, "kv_MiB": measured / 2**20,
            "decode_ms_per_step": ms,
            # tokens/s = batch sequences * 1000 ms / ms per step
            "tokens_per_s": batch * 1000.0 / ms,
            f"speedup_vs_g{groups[0]}": base_ms / ms,
        })
    return rows
