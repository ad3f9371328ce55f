"""Report section for lesson 04: mixture of experts.

The quality claims come from the protocol of :mod:`codex_lab.lessons.l04_moe.protocol`:
MoE against a dense model of equal ACTIVE compute (primary, superiority) and against a
dense model of equal TOTAL parameters (secondary, non-inferiority with a declared margin,
Holm-corrected with the check that total capacity matters here), every arm trained to a
plateau and judged by the training-state rule. The cost claims (stored vs used weights and
the measured step time; the busiest expert's load without balancing) are measured and
judged against the article's figures with ``check_stated``.
"""

from __future__ import annotations

from typing import Any

from codex_lab.reference import article_reference_block

import torch

TITLE = "Lesson 04: mixture of experts"
ORDER = 4


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def run(ctx: Any) -> str:
    """Train the quality arms to a plateau over seeds, the balance arms, time the steps; judge."""
    import matplotlib.pyplot as plt

    from codex_lab.lessons.l04_moe.bench import bench_case
    from codex_lab.lessons.l04_moe.experiments import (expert_by_category, mutual_information,
                                                       shuffled_mutual_information, token_categories)
    from codex_lab.lessons.l04_moe.protocol import (
        BALANCE_ARMS, LOAD_LIMIT, MIN_CHANGE, QUALITY_ARMS, STEP_LIMIT, arm_configs, balance_claim, cost_claim,
        eval_sample, held_out_curve, held_out_load, judge_quality, plan_rates, protocol_data, protocol_plan, step_times,
        train_arms)
    from codex_lab.nn.model import CodexModel
    from codex_lab.nn.moe import ffn_param_counts, moe_layers_of
    from codex_lab.stats import NONINFERIORITY_RULE, VERDICT_RULE
    from codex_lab.training_state import states_text, training_state

    threads = torch.get_num_threads()
    # the math threads are the report's (course.report runs each section under
    # runtime.use_compute_threads: 1 on a 2-core machine), as in the lesson
    try:
        plan = protocol_plan(ctx.mode)
        tok, train_tokens, val_tokens = protocol_data(ctx.corpus().files, plan)
        configs = arm_configs(tok.vocab_size, d_model=plan.d_model, n_layer=plan.n_layer, n_head=plan.n_head,
                              n_experts=plan.n_experts, top_k=plan.top_k, expert_hidden=plan.expert_hidden,
                              max_seq_len=plan.seq_len)
        common = dict(batch_size=plan.batch_size, seq_len=plan.seq_len, lr=plan.lr, min_lr=plan.min_lr,
                      eval_batches=plan.eval_batches, eval_batch_size=plan.eval_batch_size,
                      bias_update_rate=plan.bias_update_rate, warmup=plan.warmup, flat_share=plan.flat_share)
        runs = train_arms(configs, QUALITY_ARMS, plan.seeds, train_tokens, val_tokens, steps=plan.steps,
                          eval_every=plan.eval_every, **common)
        # the balance arms: the same seeds, steps and plateau rule as the aux-loss MoE they are compared with
        bal_runs = train_arms(configs, BALANCE_ARMS, plan.seeds, train_tokens, val_tokens, steps=plan.steps,
                              eval_every=plan.eval_every, **common)
        final = {a: [r.val_loss for r in runs[a]] for a in QUALITY_ARMS}
        curves = {a: [held_out_curve(r) for r in runs[a]] for a in QUALITY_ARMS}
        # the schedule's rate at each evaluation: a flat tail at a decayed rate is not a plateau
        rates = plan_rates(plan, [s for s, _ in curves[QUALITY_ARMS[0]][0]])
        verdicts = judge_quality(final, curves, rates=rates)
        quality = verdicts.primary  # the primary comparison: MoE vs dense of equal active compute

        # the busiest expert's load on each seed's evaluation sample
        def loads(rs: list[Any], seeds: tuple[int, ...]) -> list[float]:
            return [held_out_load(r.model, eval_sample(val_tokens, s, batch_size=plan.eval_batch_size,
                                                       seq_len=plan.seq_len, n_batches=plan.eval_batches))
                    for r, s in zip(rs, seeds)]

        load = {"moe_none": loads(bal_runs["moe_none"], plan.seeds),
                "moe_bias": loads(bal_runs["moe_bias"], plan.seeds),
                "moe": loads(runs["moe"], plan.seeds)}
        bal_states = {a: training_state([held_out_curve(r) for r in rs], higher_is_better=False, min_change=MIN_CHANGE,
                                        arm=a, rates=rates) for a, rs in (("moe_none", bal_runs["moe_none"]),
                                                             ("moe_bias", bal_runs["moe_bias"]), ("moe", runs["moe"]))}
        balance_verdict, balance_text = balance_claim(load, states=bal_states)

        # step cost, interleaved rounds: the trained models (this size) and fresh one-layer
        # models at the shipped model's width (d = 256, dense hidden 704 = 2 experts of 352)
        repeats = plan.bench_repeats  # a cost, not a quality: few rounds outside full mode
        x, y = eval_sample(train_tokens, 0, batch_size=plan.batch_size, seq_len=plan.seq_len, n_batches=1)[0]
        wall_here = step_times({a: runs[a][0].model for a in QUALITY_ARMS}, (x, y), repeats)
        wide = arm_configs(tok.vocab_size, d_model=256, n_layer=1, n_head=4, n_experts=plan.n_experts,
                           top_k=plan.top_k, expert_hidden=352, max_seq_len=128)
        torch.manual_seed(0)
        wide_models = {a: CodexModel(wide[a]) for a in QUALITY_ARMS}
        xw, yw = eval_sample(train_tokens, 0, batch_size=8, seq_len=128, n_batches=1)[0]
        wall_wide = step_times(wide_models, (xw, yw), repeats)
        c_wide = ffn_param_counts(wide["moe"])
        cost_verdict, cost_text, _, _ = cost_claim(c_wide["total"] / c_wide["active"], wall_wide,
                                                   where=" (one layer, d = 256, 8 x 128 tokens)")
        _, here_text, _, _ = cost_claim(c_wide["total"] / c_wide["active"], wall_here)

        # capacity 1.0 on the trained routers (seed 0): what a capacity limit drops
        drops: dict[str, float] = {}
        cap_loss: dict[str, float] = {}
        models = {"moe_none": bal_runs["moe_none"][0].model, "moe": runs["moe"][0].model,
                  "moe_bias": bal_runs["moe_bias"][0].model}
        batches0 = eval_sample(val_tokens, plan.seeds[0], batch_size=plan.eval_batch_size, seq_len=plan.seq_len,
                               n_batches=plan.eval_batches)
        for name, model in models.items():
            layers = moe_layers_of(model)
            for m in layers:
                m.capacity_factor = 1.0
            rates, loss = [], 0.0
            with torch.no_grad():
                for xb, yb in batches0:
                    loss += float(model(xb, yb).loss) / len(batches0)
                    rates += [m.last_stats.drop_rate for m in layers if m.last_stats is not None]
            for m in layers:
                m.capacity_factor = None
            drops[name], cap_loss[name] = _mean(rates), loss

        val_text = "".join(f.text for f in ctx.corpus().files if f.split == "val")[: 20_000 if ctx.fast else 100_000]
        ids, cats = token_categories(tok, val_text)
        counts = expert_by_category(runs["moe"][0].model, 0, ids, cats, window=plan.seq_len)
        mi, mi0 = mutual_information(counts), shuffled_mutual_information(counts)

        recs = bench_case(256 if ctx.fast else 4096, 8, 2, d_model=256, hidden=512, repeats=3 if ctx.fast else 7,
                          device=torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for a in QUALITY_ARMS:
        steps = [s for s, _ in curves[a][0]]
        mean_curve = [_mean([c[i][1] for c in curves[a]]) for i in range(len(steps))]
        axes[0].plot(steps, mean_curve, marker=".", label=a)
    axes[0].set_xlabel("step"); axes[0].set_ylabel(f"held-out loss (mean of {len(plan.seeds)} seeds)")
    axes[0].set_yscale("log"); axes[0].legend(); axes[0].set_title("quality arms")
    for name, rs in (("moe_none", bal_runs["moe_none"]), ("moe (aux)", runs["moe"]), ("moe_bias", bal_runs["moe_bias"])):
        hist = rs[0].history
        axes[1].plot([r["step"] for r in hist], [r["max_load"] for r in hist], label=name, lw=0.8)
    axes[1].axhline(LOAD_LIMIT, ls=":", c="gray")
    axes[1].set_xlabel("step"); axes[1].set_ylabel("busiest expert / mean load"); axes[1].legend()
    axes[1].set_title("MoE balance (training batches, seed 0)")
    img = ctx.savefig(fig, "l04_moe_balance")

    speed = {r["impl"]: r for r in recs if not r.get("error")}
    st = verdicts.states
    lines = [
        f"Geometry ({ctx.mode} mode), shrunk from the article's sizes to aim for every arm's plateau on one CPU "
        f"core: {plan.describe()}. Seeds vary the initial weights, the order of the training windows and the "
        f"held-out sample (every arm of one seed sees the same ones: paired; {plan.preregistration}). The balance arms train as long, "
        f"over the same seeds, as the MoE arm they are compared with.",
        "",
        "| arm | FFN hidden | FFN params stored / active | held-out loss (per seed) | training state | train time (s, seed 0) |",
        "|---|---|---|---|---|---|",
    ]
    for a in QUALITY_ARMS:
        r0 = runs[a][0]
        hidden = configs[a].ffn_hidden if a != "moe" else f"{plan.n_experts} x {plan.expert_hidden}"
        lines.append(f"| {a} | {hidden} | {r0.total_ffn_params:,} / {r0.active_ffn_params:,} | "
                     + ", ".join(f"{v:.3f}" for v in final[a]) + f" | {st[a].short()} | {r0.train_time_s:.1f} |")
    lines += [
        "",
        img,
        "",
        "Training states (held-out curves, last quarter's trend projected over another quarter of the run, "
        f"a one-sided 95% bound on the seeds' projected change over another quarter, held to {MIN_CHANGE} nats/token): " + "; ".join(s.describe() for s in st.values()) + ".",
        "",
        f"Primary ({VERDICT_RULE}): {quality.describe()}.",
        "",
        f"Secondary, Holm-corrected together ({NONINFERIORITY_RULE}): {verdicts.keeps_big.describe()}; "
        f"{verdicts.capacity.describe()}.",
        "",
        f"Step cost at this size (trained models, {plan.batch_size} x {plan.seq_len} tokens): {here_text}. "
        f"At the shipped width: {cost_text}.",
        "",
        "| MoE | busiest expert on held-out tokens (per seed) | drop rate at capacity 1.0 | held-out loss at capacity 1.0 (seed 0) |",
        "|---|---|---|---|",
    ]
    for name in ("moe_none", "moe", "moe_bias"):
        lines.append(f"| {name} | " + ", ".join(f"{v:.2f}x" for v in load[name])
                     + f" | {drops[name]:.1%} | {cap_loss[name]:.3f} |")
    lines += [
        "",
        f"Routing by token kind (aux-loss MoE, layer 0, {len(ids):,} held-out tokens): I(kind; expert) = {mi:.3f} nats "
        f"vs {mi0:.4f} with shuffled pairs.",
        "",
        "Dispatch (one layer, d=256, h=512, 8 experts top-2, "
        f"{speed['grouped']['tokens']} tokens, CPU): "
        + ", ".join(f"{k} {v['median_ms']:.1f} ms ({v['speedup_vs_reference']:.1f}x loop, max diff {v['max_abs_diff']:.1e})"
                    for k, v in speed.items()) + ".",
    ]

    ctx.claim("MoE: 8-16 experts, top-k 2-4 store a big model's parameters at a small model's compute "
              f"(small = a step within {STEP_LIMIT:g}x the equal-active dense model's)",
              cost_text, cost_verdict, lesson="04")
    ctx.claim("MoE gives a big model's quality at equal active compute (primary: MoE vs dense of equal active compute)",
              quality.describe(), quality.verdict,
              lesson="04", states=states_text([st["dense_active"], st["moe"]]))
    ctx.claim("MoE has the total capacity of a big dense model (secondary: non-inferior to dense of equal total "
              f"parameters, margin {verdicts.margin:g} nats/token, Holm)",
              verdicts.keeps_big.describe(), verdicts.keeps_big.verdict,
              lesson="04", states=states_text([st["dense_total"], st["moe"]]))
    ctx.claim(f"MoE layers as described (the article mentions no load balancing; unbalanced = busiest expert > "
              f"{LOAD_LIMIT:g}x the mean load)", balance_text, balance_verdict, lesson="04",
              states=states_text(list(bal_states.values())))
    lines += ["", performance_goal(ctx)]
    lines += ["", *article_reference_block(ctx, "04")]
    return "\n".join(lines)


def performance_goal(ctx: Any) -> str:
    """The course's performance goal for MoE: grouped dispatch at least as fast as the fastest Hugging Face Mixtral
    block path at every bench size (the bench's default sizes of this mode)."""
    from codex_lab.course.benches import run_bench

    recs = run_bench("moe", [], ctx.run_mode)
    sizes = sorted({(r["tokens"], r["experts"], r["top_k"]) for r in recs})
    ratios = {}
    for size in sizes:
        rs = [r for r in recs if (r["tokens"], r["experts"], r["top_k"]) == size]
        grouped = next(r["median_ms"] for r in rs if r["impl"] == "grouped")
        hf = [r["median_ms"] for r in rs if r["impl"].startswith("hf")]
        if hf:  # speed-up = fastest HF ms / grouped ms
            ratios[size] = min(hf) / grouped
    if not ratios:
        return "MoE dispatch goal: not measured (transformers' Mixtral block unavailable)."
    worst = min(ratios, key=ratios.get)
    how = ("worst of " + ", ".join(f"{t} tok/{e}e/top{k}: {v:.2f}x" for (t, e, k), v in ratios.items())
           + "; `codex-lab bench moe`")
    return "Performance goal: " + ctx.goal("MoE grouped dispatch vs the fastest HF Mixtral block path", ratios[worst], 1.0, how, lesson="04")
