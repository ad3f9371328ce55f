"""Report section, lesson 02: the cost of window + stride, tiles, measured kernels, and whether
sparse patterns keep long-range dependencies (recall task, verdicts over seeds with intervals)."""

from __future__ import annotations

import math
from typing import Any

TITLE = "Lesson 02: sparse attention"
ORDER = 2


def run(ctx: Any) -> str:
    """Cost formula vs N sqrt N, the tile view, and `bench attention` records."""
    import matplotlib.pyplot as plt

    from codex_lab.lessons.l02_sparse_attention.bench import DEFAULT_PATTERN, measure
    from codex_lab.nn.patterns import parse_pattern, seed_cost_ratio
    from codex_lab.nn.sparse import tiles_computed

    parts = []
    # 1. cost: exact pairs at small N, the article's formula at large N
    w, s = 128, 32
    p = parse_pattern(f"window:{w}+strided:{s}")
    ns = [1024, 2048] if ctx.fast else [1024, 2048, 4096, 8192]
    exact = [p.pairs(n) for n in ns]
    bound = [p.predicted_cost(n) for n in ns]
    big = [seed_cost_ratio(n, w, s)["sparse"] for n in (1 << 19, 1 << 20)]
    exp_big = math.log(big[1] / big[0]) / math.log(2)
    r = int(math.isqrt(1 << 20)), int(math.isqrt(1 << 19))
    sq = [(1 << 20) * (r[0] + (1 << 20) / r[0]), (1 << 19) * (r[1] + (1 << 19) / r[1])]
    exp_sqrt = math.log(sq[0] / sq[1]) / math.log(2)
    parts.append("| N | exact pairs (w=128, s=32) | article N(w+N/s) | causal pairs |\n|---|---|---|---|\n" + "\n".join(
        f"| {n} | {e:,} | {b:,} | {n * (n + 1) // 2:,} |" for n, e, b in zip(ns, exact, bound)))
    ctx.claim("Window + strided sparse attention takes cost from O(N^2) to O(N sqrt N)",
              f"fixed w=128, s=32: N(w+N/s), growth exponent {exp_big:.2f} at N=2^20 (dense/sparse -> s={s}, "
              f"{seed_cost_ratio(1 << 20, w, s)['speedup']:.1f}x at 2^20); w=s=sqrt(N): exponent {exp_sqrt:.2f}",
              "holds with a correction", lesson="02")
    # 2. tiles: token stride vs block stride
    n, bs = 2048, 128
    causal_tiles = (n // bs) * (n // bs + 1) // 2
    tok_frac = tiles_computed(f"window:{w}+strided:{s}", n, bs) / causal_tiles
    blk = parse_pattern("window:128+blockstride:128:8")
    blk_frac = tiles_computed(blk, n, bs) / causal_tiles
    ctx.claim("Global strided links every 16-32 tokens are a cheap addition to a local window",
              f"window:128+strided:32 keeps density {p.density(n):.2f} of pairs but touches {tok_frac:.0%} of "
              f"128-token tiles at N={n}; a block-granular stride (every 8th block) touches {blk_frac:.0%}",
              "holds with a correction", lesson="02")
    # 3. measured kernels
    sizes = [1024, 2048] if ctx.fast else [1024, 2048, 4096, 8192]
    impls = ["sdpa", "blocks"] if ctx.fast else ["sdpa", "blocks", "flex"]
    pat = parse_pattern(DEFAULT_PATTERN)
    recs = []
    for n in sizes:
        d = pat.density(n)
        for impl in impls:
            rec = measure(impl, pat.spec, n, repeats=3)
            rec["density"] = 1.0 if impl == "sdpa" else d
            recs.append(rec)
    base = {r_["N"]: r_["median_ms"] for r_ in recs if r_["impl"] == "sdpa"}
    lines = ["| impl | N | median ms | peak MiB | density | speed-up vs SDPA | limit 1/d |", "|---|---|---|---|---|---|---|"]
    for r_ in recs:
        r_["speedup"] = base[r_["N"]] / r_["median_ms"]
        lines.append(f"| {r_['impl']} | {r_['N']} | {r_['median_ms']:.1f} | {r_['peak_mib']:.1f} | {r_['density']:.3f} | "
                     f"{r_['speedup']:.2f}x | {1 / r_['density']:.1f}x |")
    fig, ax = plt.subplots(figsize=(5, 3))
    for impl in impls:
        rr = [r_ for r_ in recs if r_["impl"] == impl]
        ax.plot([r_["N"] for r_ in rr], [r_["median_ms"] for r_ in rr], "o-", label=impl)
    ax.set_xscale("log", base=2); ax.set_yscale("log"); ax.set_xlabel("N"); ax.set_ylabel("forward ms"); ax.legend()
    img = ctx.savefig(fig, "l02_attention_time")
    top = max(sizes)
    best = max((r_ for r_ in recs if r_["impl"] != "sdpa" and r_["N"] == top), key=lambda r_: r_["speedup"])
    goal = 0.6 / best["density"]
    ctx.claim("Sparse attention makes long code context cheap (measured forward time)",
              f"{best['impl']} at N={top}, {DEFAULT_PATTERN} (density {best['density']:.3f}): {best['speedup']:.2f}x "
              f"dense causal SDPA (goal 0.6/d = {goal:.1f}x, limit 1/d = {1 / best['density']:.1f}x)",
              "holds" if best["speedup"] >= goal else "holds with a correction", lesson="02")
    parts.append(f"Forward time, B=1, 4 heads, head dim 64, fp32, pattern `{DEFAULT_PATTERN}` "
                 "(full table: `codex-lab bench attention --json`):\n\n" + "\n".join(lines) + "\n\n" + img)
    parts.append(performance_goals(ctx))
    parts.append(long_range(ctx))
    return "\n\n".join(parts)


def long_range(ctx: Any) -> str:
    """Does sparse attention keep long-range code dependencies? The recall task of
    ``codex_lab.data.longrange``: dense, window-only and window + token stride at matched density,
    and the per-layer schedules, over seeds, each verdict from ``codex_lab.stats.compare``."""
    import matplotlib.pyplot as plt

    from codex_lab.data.longrange import window_reach
    from codex_lab.lessons.l02_sparse_attention import experiments as lr

    from dataclasses import replace

    # fast mode: the lesson's sizes with half its evaluation sequences, and no dense arm (the
    # claims compare sparse arms), so the section stays inside its 90 s budget on 2 cores
    cfg = replace(lr.fast_config(), eval_sequences=16) if ctx.fast else lr.full_config()
    L, n = cfg.n_layer, cfg.task.seq_len
    spec = {k: lr.ARMS[k] for k in ("window", "window+stride")}
    if not ctx.fast:
        spec = dict(lr.ARMS)
        if lr.moba_available():
            spec["moba"] = lr.moba_spec_for(lr.densities(spec, n)["window"], n)
    w = int(spec["window"].split(":")[1])
    arms = {k: [v] * L for k, v in spec.items()}
    arms["dense early, sparse deep"] = ["dense", spec["window"]]
    arms["sparse early, dense deep"] = [spec["window"], "dense"]
    res = lr.run_arms(arms, cfg)
    rf = window_reach(L, w)
    chance = 1 / len(lr.task_data(cfg.corpus_files)[0].pools[0])  # one of the key's pool
    far = {k: [lr.far_accuracy(r, rf) for r in runs] for k, runs in res.items()}
    dists = [str(d) for d in cfg.task.distances]
    lines = ["| arm | patterns | " + " | ".join(dists) + " | far (> %d) |" % rf, "|---|---|" + "---|" * (len(dists) + 1)]
    fig, ax = plt.subplots(figsize=(5, 3))
    for k, runs in res.items():
        m = lr.mean_by_distance(runs)
        lines.append(f"| {k} | {' / '.join(arms[k])} | " + " | ".join(f"{m[d]:.2f}" for d in dists)
                     + f" | {sum(far[k]) / len(far[k]):.2f} |")
        ax.plot([int(d) for d in dists], [m[d] for d in dists], "o-", label=k)
    ax.axhline(chance, color="grey", ls=":"); ax.axvline(rf, color="k", ls="--", lw=0.8)
    ax.set_xscale("log"); ax.set_xlabel("query distance"); ax.set_ylabel("accuracy"); ax.legend(fontsize=6)
    img = ctx.savefig(fig, "l02_long_range")
    main = lr.claim_verdict(far, "window", "window+stride")
    seeds = f"{len(cfg.seeds)} seeds, paired"
    ctx.claim("Strided links keep the far (cross-function) dependencies that the local window alone loses",
              f"recall of constants in real code at N={n}, {L} layers, matched density: far accuracy (distance > "
              f"L(w-1) = {rf}) window+stride minus window {main.diff:+.3f} (95% CI [{main.lo:+.3f}, {main.hi:+.3f}], "
              f"{seeds}); window+stride {sum(far['window+stride']) / len(far['window+stride']):.2f}, window "
              f"{sum(far['window']) / len(far['window']):.2f}, chance {chance:.3f}", main.verdict, lesson="02")
    rev = lr.claim_verdict(far, "sparse early, dense deep", "dense early, sparse deep")
    allsp = lr.claim_verdict(far, "window", "dense early, sparse deep")
    ctx.claim("Gradual sparsity: dense early layers, sparse deep layers is the better schedule",
              f"same task, window:{w} as the sparse layer: dense-early minus sparse-early far accuracy {rev.diff:+.3f} "
              f"(95% CI [{rev.lo:+.3f}, {rev.hi:+.3f}], {seeds}); dense-early minus all-sparse {allsp.diff:+.3f} "
              f"([{allsp.lo:+.3f}, {allsp.hi:+.3f}]: {allsp.verdict})", rev.verdict, lesson="02")
    cl_w = lr.cliff(lr.mean_by_distance(res["window"]), chance)
    return (f"Long-range recall (`codex_lab.data.longrange`, {n} tokens, {L} layers; warm start "
            f"{'shipped' if cfg.warm_from_asset else 'trained per seed'}, then {cfg.steps} steps per arm; "
            f"{cfg.eval_sequences} held-out sequences per seed). "
            f"Window-only reach L(w-1) = {rf}; its measured cliff: {cl_w}.\n\n" + "\n".join(lines) + "\n\n"
            + "\n".join(f"- {c.describe()}" for c in (main, rev, allsp)) + "\n\n" + img)


def performance_goals(ctx: Any) -> str:
    """Issue 16's goal 1 at its own size (N=8192) in every mode: the fast kernel forward at least
    0.6/d and forward+backward at least 0.5/d over dense causal SDPA, with 1/d and the tile share."""
    from codex_lab.course.benches import run_bench

    argv = ["--sizes", "8192", "--impls", "sdpa", "blocks", "fast", "--backward", "--repeats", "3"]
    recs = {r["impl"]: r for r in run_bench("attention", argv)}
    f = recs["fast"]
    computed = f" ({f['computed_fraction']:.1%} of causal pairs computed)" if "computed_fraction" in f else ""
    how = (f"N=8192, d={f['density']:.3f}, 1/d={f['limit_1_over_d']:.1f}x, {f['tile_fraction']:.1%} of tiles{computed}; "
           f"`codex-lab bench attention {' '.join(argv)}`")
    lines = [ctx.goal("sparse forward (fast kernel) vs dense causal SDPA", f["speedup_vs_sdpa"], f["goal_0_6_over_d"], how, lesson="02"),
             ctx.goal("sparse forward+backward (fast kernel) vs SDPA forward+backward", f["fwd_bwd_speedup_vs_sdpa"],
                      f["goal_fwd_bwd_0_5_over_d"], how, lesson="02")]
    b = recs["blocks"]
    return ("Performance goals at N=8192 (the readable blocks kernel: "
            f"{b['speedup_vs_sdpa']:.2f}x forward, {b['fwd_bwd_speedup_vs_sdpa']:.2f}x forward+backward):\n\n- " + "\n- ".join(lines))
