"""``codex-lab bench attention``: sparse kernels against dense causal SDPA.

One flat record per (impl, pattern, N): median forward time, peak memory, the pattern's
density (fraction of causal pairs), the speed-up over dense causal SDPA measured in the
same run, the goal 0.6/density and the physical limit 1/density beside it, the
fraction of causal 128-token tiles the block kernels touch (``tile_fraction``) and the
fraction of causal (query, key) pairs each sparse kernel actually computes
(``computed_fraction``: whole tiles for blocks and flex; for fast, full tiles plus its
half-size masked units), whose inverse bounds its speed-up at equal per-pair cost; for
fast, ``kernel`` names the path that ran (its fused native kernel, or its flash calls and
why), and ``fast-flash`` times the flash-call path beside it. ``moba`` is the learned pattern
``"moba:B:K"`` (:mod:`codex_lab.nn.moba`) on its fast path, the gate's selection included,
with K chosen per N so that its density matches ``--pattern``'s (``--moba-block`` sets B);
its record gives ``vs_fixed_fast``, its time over the fixed pattern's ``fast`` time in the same
run (goal ``goal_vs_fixed`` = 1.3 or less), forward and forward+backward, and the forward ratio
rescaled to the fixed density (K counts whole blocks, so the two densities differ a little). With ``--backward`` (default
in full mode) also forward + backward (a training step of the attention) against SDPA's forward
+ backward, with its goal 0.5/density; impls without a CPU backward (flex) skip it.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` above the inputs; on CPU, the
process's resident-set high-water mark above its level just before the call, sampled
every millisecond by a thread, after returning freed heap pages to the OS
(``malloc_trim``), so it is approximate (within a few MiB) but comparable between impls.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import statistics
import threading
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

from codex_lab.nn.moba import moba_attention, moba_top_k_for_density
from codex_lab.nn.patterns import MoBA, causal_pairs, parse_pattern
from codex_lab.nn.sparse import sparse_attention, tiles_computed
from codex_lab.runtime import get_device, interleaved_times, median_ms

NAME = "attention"
HELP = ("time and peak memory of dense SDPA vs sparse attention (reference, blocks, flex, fast, fast-flash) "
        "and the learned moba pattern at equal density, against N, forward and forward+backward")
DEFAULT_PATTERN = "window:128+blockstride:128:12"  # ~10% of causal pairs at N=8192
# "fast-flash": the fast kernel's flash-call path (what "fast" runs where its native kernel
# cannot be built), to show what the native kernel gains in the same run
# "moba": the learned pattern at the fixed pattern's density (its own spec per N, see run)
IMPLS = ("sdpa", "reference", "blocks", "flex", "fast", "fast-flash", "moba")
GOAL_VS_FIXED = 1.3  # moba's time at most 1.3x the fixed pattern's fast kernel at equal density


def add_arguments(p: argparse.ArgumentParser) -> None:
    """CLI options (sizes default to fast/full mode choices)."""
    p.add_argument("--sizes", type=int, nargs="+", default=None,
                   help="sequence lengths N (default: fast 1024 2048 4096, full 1024 .. 8192)")
    p.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS, help="implementations to time")
    p.add_argument("--pattern", default=DEFAULT_PATTERN, help="sparse pattern spec (see codex_lab.nn.patterns)")
    p.add_argument("--moba-block", type=int, default=128, help="block size B of the 'moba' rows")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=None, help="timed runs per case (median reported)")
    p.add_argument("--max-reference-n", type=int, default=4096,
                   help="skip 'reference' above this N (it materialises N x N scores)")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: best available)")
    p.add_argument("--backward", action=argparse.BooleanOptionalAction, default=None,
                   help="also time forward+backward (default: on in full mode, off in fast mode)")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096  # resident pages * page size


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the baseline is just less tight
        pass


def peak_mib(fn: Callable[[], Any], device: torch.device) -> float:
    """Peak extra memory of one call of ``fn`` in MiB (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    try:
        _rss_bytes()
    except OSError:
        return float("nan")  # no /proc (macOS, Windows): not measured
    _trim()
    base = peak = _rss_bytes()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_bytes())
            time.sleep(0.001)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out = fn()
    peak = max(peak, _rss_bytes())
    done.set()
    t.join()
    del out
    return (peak - base) / 2**20


def _attend(impl: str, pattern: str, dev: torch.device) -> Callable[[Any, Any, Any], Any]:
    """impl as a function of (q, k, v)."""
    if impl == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if impl == "fast-flash" and dev.type == "cpu":
        from codex_lab.nn.sparse_fast import sparse_fast

        pat = parse_pattern(pattern)
        return lambda q, k, v: sparse_fast(q, k, v, pat, 128, native=False)
    if impl == "moba":  # the gate's selection runs inside every call
        return lambda q, k, v: moba_attention(q, k, v, pattern, "fast")
    return lambda q, k, v: sparse_attention(q, k, v, pattern, impl="fast" if impl == "fast-flash" else impl)


def prepare(impl: str, pattern: str, n: int, *, batch: int = 1, heads: int = 4, head_dim: int = 64,
            device: torch.device | None = None, backward: bool = False,
            ) -> tuple[dict[str, Any], Callable[[], Any], Callable[[], None] | None]:
    """One implementation ready to time on random q, k, v (B, H, N, D): its record so far
    (peak memory, first-call seconds, tiles), its forward, and with ``backward`` its training
    step (forward + ``out.sum().backward()``; None where there is none: flex on a CPU).

    ``impl="sdpa"`` is dense causal ``scaled_dot_product_attention`` (pattern ignored).
    """
    dev = device or get_device()
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(batch, heads, n, head_dim, generator=g).to(dev) for _ in range(3))  # (B, H, N, D)
    attend = _attend(impl, pattern, dev)
    fwd_fn = lambda: attend(q, k, v)  # noqa: E731

    def fn() -> Any:
        with torch.no_grad():
            return fwd_fn()

    t0 = time.perf_counter()
    fn()  # warm-up: builds the tile plan / compiles flex
    setup_s = time.perf_counter() - t0
    mem = peak_mib(fn, dev)
    pat = parse_pattern("dense" if impl == "sdpa" else pattern)
    nb = -(-n // 128)
    rec: dict[str, Any] = {"impl": impl, "pattern": pat.spec, "N": n, "peak_mib": mem, "first_call_s": setup_s}
    if isinstance(pat, MoBA):
        from codex_lab.nn.moba_fast import moba_fast_ok, moba_native_status

        bs, r = pat.block, [min(pat.block, n - i * pat.block) for i in range(-(-n // pat.block))]
        # computed: the chosen whole blocks, plus each own block's full (masked) square
        rec["computed_fraction"] = sum(ri * (bs * min(pat.top_k, i) + ri) for i, ri in enumerate(r)) / causal_pairs(n)
        ok = moba_fast_ok(q, k, None, None)
        rec["kernel"] = "native" if ok else f"reference ({moba_native_status() or 'not fp32 on a CPU'})"
    else:
        rec.update({"tiles": tiles_computed(pat, n),
                    # fraction of the causal tiles nb (nb + 1) / 2 that a block kernel computes
                    "tile_fraction": tiles_computed(pat, n) / (nb * (nb + 1) / 2)})
    if impl in ("blocks", "flex"):
        rec["computed_fraction"] = tiles_computed(pat, n) * 128 * 128 / causal_pairs(n)
    elif impl in ("fast", "fast-flash"):
        from codex_lab.nn.sparse_fast import fast_pairs
        from codex_lab.nn.sparse_native import native_status

        rec["computed_fraction"] = fast_pairs(pat, n, 128) / causal_pairs(n)
        # which path ran: the fused native kernel, or the flash calls (and why)
        if dev.type != "cpu":
            rec["kernel"] = "blocks (no fast path on this device)"
        elif impl == "fast-flash":
            rec["kernel"] = "flash calls"
        else:
            why = native_status()
            rec["kernel"] = f"flash calls ({why})" if why else "native"
    step = None
    if backward and not (impl == "flex" and dev.type == "cpu"):  # flex has no CPU backward
        qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
        fwd = lambda: attend(qg, kg, vg)  # noqa: E731

        def step() -> None:
            fwd().sum().backward()
            qg.grad = kg.grad = vg.grad = None

        step()  # warm-up
    return rec, fn, step


def measure(impl: str, pattern: str, n: int, *, batch: int = 1, heads: int = 4, head_dim: int = 64,
            repeats: int = 3, device: torch.device | None = None, backward: bool = False) -> dict[str, Any]:
    """One record: forward time and peak memory of ``impl`` on random q, k, v (B, H, N, D);
    with ``backward`` also ``fwd_bwd_ms``, the median of forward + ``out.sum().backward()``.
    (The bench times several impls round-robin instead: :func:`run`.)

    ``impl="sdpa"`` is dense causal ``scaled_dot_product_attention`` (pattern ignored).
    """
    dev = device or get_device()
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None
    rec, fn, step = prepare(impl, pattern, n, batch=batch, heads=heads, head_dim=head_dim, device=dev, backward=backward)
    rec["median_ms"] = median_ms(fn, repeats=repeats, warmup=0, sync=sync)
    if step is not None:
        rec["fwd_bwd_ms"] = median_ms(step, repeats=repeats, warmup=0, sync=sync)
    return rec


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """All records of one run; speed-ups are against dense SDPA at the same N, this run."""
    dev = get_device(args.device)
    sizes = args.sizes or args.mode.pick(fast=[1024, 2048, 4096], full=[1024, 2048, 4096, 8192])
    repeats = args.repeats or args.mode.pick(fast=3, full=5)
    impls = list(dict.fromkeys(["sdpa", *args.impls]))  # the baseline is always measured
    backward = args.mode.pick(fast=False, full=True) if args.backward is None else args.backward
    pattern = parse_pattern(args.pattern)
    rows: list[dict[str, Any]] = []
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None
    for n in sizes:
        density = pattern.density(n)
        # the learned pattern at the fixed one's density: K from the exact counts
        moba = MoBA(args.moba_block, moba_top_k_for_density(n, args.moba_block, density))
        ready = {impl: prepare(impl, moba.spec if impl == "moba" else pattern.spec, n, batch=args.batch, heads=args.heads,
                               head_dim=args.head_dim, device=dev, backward=backward)
                 for impl in impls if not (impl == "reference" and n > args.max_reference_n)}
        # round-robin: one call of each impl per round, so the machine's slow and fast spells
        # fall on every impl alike and the ratios to SDPA stay fair on a shared machine
        fwd, _ = interleaved_times({impl: fn for impl, (_, fn, _) in ready.items()}, repeats, sync)
        steps = {impl: st for impl, (_, _, st) in ready.items() if st is not None}
        fb, _ = interleaved_times(steps, repeats, sync)
        for impl, (r, _, _) in ready.items():
            r["median_ms"] = statistics.median(fwd[impl])
            if impl in fb:
                r["fwd_bwd_ms"] = statistics.median(fb[impl])
        base_ms, base_fb = ready["sdpa"][0]["median_ms"], ready["sdpa"][0].get("fwd_bwd_ms")
        for impl, (r, _, _) in ready.items():
            d = 1.0 if impl == "sdpa" else moba.density(n) if impl == "moba" else density
            if impl == "moba" and "fast" in ready:
                fixed = ready["fast"][0]
                r.update({"fixed_pattern": pattern.spec, "fixed_density": density, "goal_vs_fixed": GOAL_VS_FIXED,
                          "vs_fixed_fast": r["median_ms"] / fixed["median_ms"],
                          # K is whole blocks, so the densities differ a little: the ratio with moba's
                          # time scaled to the fixed density (time taken as proportional to pairs)
                          "vs_fixed_fast_density_scaled": r["median_ms"] / fixed["median_ms"] * density / moba.density(n)})
                if "fwd_bwd_ms" in r and "fwd_bwd_ms" in fixed:
                    r["fwd_bwd_vs_fixed_fast"] = r["fwd_bwd_ms"] / fixed["fwd_bwd_ms"]
            r.update({"density": d, "speedup_vs_sdpa": base_ms / r["median_ms"],
                      "limit_1_over_d": 1.0 / d, "goal_0_6_over_d": 0.6 / d, "device": str(dev)})
            if "fwd_bwd_ms" in r and base_fb is not None:
                r.update({"fwd_bwd_speedup_vs_sdpa": base_fb / r["fwd_bwd_ms"], "goal_fwd_bwd_0_5_over_d": 0.5 / d})
            rows.append(r)
    return rows
