"""What each design buys, measured on the trained models of the trade
(:mod:`~codex_lab.lessons.l08_capstone.trade`) at a context where it is meant to pay.

- **Prefill** of ``context`` tokens, batch 1 (ms): where sparse attention's fewer attended
  pairs should show (the attention term grows like N^2, the rest like N).
- **Decode** of a batch of ``decode_batch`` sequences over a cache already holding ``context``
  tokens (ms per step, the one generation loop's cached steps): where GQA's smaller cache
  should show (each step reads the whole cache).
- **KV bytes per token**, read from the cache the model fills during that prefill
  (:func:`codex_lab.nn.accounting.measured_cache_bytes`), and parameters stored / active.

Every design is timed in the same interleaved rounds (:func:`codex_lab.runtime.interleaved_times`),
so a ratio against the plain model is taken round by round; the table gives the median and the
range over rounds (1.0 inside the range: no difference was measured).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Mapping

import torch

from codex_lab.nn.accounting import active_params, measured_cache_bytes
from codex_lab.nn.model import CodexModel


@torch.no_grad()
def prefill_ms(model: CodexModel, tokens: torch.Tensor) -> float:
    """One forward over ``tokens`` (B, N), no cache (the prefill's work), in ms."""
    t0 = time.perf_counter()
    model(tokens)
    return (time.perf_counter() - t0) * 1000.0


@torch.no_grad()
def decode_ms(model: CodexModel, prompt: torch.Tensor, steps: int) -> float:
    """Prefill ``prompt`` (B, N) into a fresh cache (untimed), then time ``steps`` greedy decode
    steps of the one generation loop; ms per step (:func:`codex_lab.lessons.l03_gqa.bench._decode_ms`)."""
    from codex_lab.lessons.l03_gqa.bench import _decode_ms

    return _decode_ms(model, prompt, steps, next(model.parameters()).device)


def speed_records(models: Mapping[str, CodexModel], *, context: int, decode_batch: int, new_tokens: int,
                  rounds: int) -> dict[str, dict[str, Any]]:
    """Per design (``models`` must hold ``"plain"``): prefill and decode times of every round,
    their ratios to plain (``prefill_vs_plain``/``decode_vs_plain``: (median, lo, hi) of the
    per-round speed-ups, plain's time / the design's), ``kv_bytes_per_token`` measured on the
    filled cache, ``params`` and ``active_params``. The inputs are random tokens (speed does not
    depend on them); one untimed warm-up per design."""
    from codex_lab.runtime import interleaved_times
    from codex_lab.stats import timing_ratio

    if "plain" not in models:
        raise ValueError(f"models {sorted(models)} lack 'plain': the ratios are against the plain model")
    vocab = models["plain"].cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    long = torch.randint(0, vocab, (1, context), generator=g)  # (1, N)
    batch = torch.randint(0, vocab, (decode_batch, context), generator=g)  # (B, N)
    times: dict[str, dict[str, list[float]]] = {k: {"prefill": [], "decode": []} for k in models}

    def one(kind: str) -> None:
        m = models[kind]
        times[kind]["prefill"].append(prefill_ms(m, long))
        times[kind]["decode"].append(decode_ms(m, batch, new_tokens))

    for m in models.values():  # warm-up, not recorded
        m.eval()
        prefill_ms(m, long[:, : min(context, 64)])
        decode_ms(m, batch[:, : min(context, 64)], 2)
    interleaved_times({k: (lambda k=k: one(k)) for k in models}, max(2, rounds))
    out = {}
    for kind, m in models.items():
        rec: dict[str, Any] = {"kind": kind, "context": context, "decode_batch": decode_batch,
                               "prefill_ms": times[kind]["prefill"], "decode_ms": times[kind]["decode"],
                               # bytes per token = bytes the cache holds after a (1, N) prefill / N
                               "kv_bytes_per_token": measured_cache_bytes(m, 1, min(context, 256)) // min(context, 256),
                               "params": m.num_params(), "active_params": active_params(m)}
        for phase in ("prefill", "decode"):
            r = timing_ratio(times["plain"][phase], times[kind][phase], a="plain", b=kind)
            rec[f"{phase}_vs_plain"] = (r.speedup, r.lo, r.hi)
            rec[f"{phase}_ms_median"] = statistics.median(times[kind][phase])
        out[kind] = rec
    return out


__all__ = ["decode_ms", "prefill_ms", "speed_records"]
