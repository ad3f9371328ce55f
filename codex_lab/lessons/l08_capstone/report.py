"""Report section, lesson 08: the capstone run, then every seed claim gathered in one table."""

from __future__ import annotations

import tempfile
from collections import Counter
from typing import Any

from codex_lab.reference import article_reference_block

TITLE = "Lesson 08: capstone (every optimisation in one model) and the seed claims"
ORDER = 8

# Where each lesson's claims sit in the article (SEED.md sections).
SEED_SECTION = {
    "00": "set-up", "01": "1. sparse attention", "02": "1. sparse attention", "03": "3. inference acceleration",
    "04": "3. inference acceleration", "05": "2. multi-task fine-tuning", "06": "3. inference acceleration",
    "07": "4. monitoring and rollback", "08": "all (capstone)",
}


def training_state(curve: list[tuple[float, float]], arm: str) -> str:
    """One arm's training state from one held-out curve (nats/token), in words."""
    from codex_lab.lessons.l08_capstone.scorecard import MIN_CHANGE_NATS
    from codex_lab.training_state import training_state as state

    return state([curve], higher_is_better=False, min_change=MIN_CHANGE_NATS, arm=arm).describe()


def run(ctx: Any) -> str:
    """Run the capstone (convert, pre-train, fine-tune, gate, canary) on the shipped model at
    the mode's brief budget, then the trade experiment (every design trained to a plateau at a
    smaller geometry: what each optimisation buys and costs, and what the gates promote),
    record its claims, and close with every claim recorded so far by any section."""
    import torch

    from codex_lab.lessons.l08_capstone import pipeline as cap
    from codex_lab.lessons.l08_capstone import trade as tr
    from codex_lab.lessons.l08_capstone import trade_speed as tsp
    from codex_lab.lessons.l08_capstone import trade_table as tt

    threads = torch.get_num_threads()
    # the math threads are the report's (course.report runs each section under
    # runtime.use_compute_threads: 1 on a 2-core machine), as in the lesson
    try:
        ck = ctx.checkpoint()
        base, tok = ck.model.eval(), ck.tokenizer
        sizes = cap.default_sizes()
        res = cap.run_capstone(base, tok, ctx.corpus(), sizes=sizes)
        abl = cap.speed_ablation(base, res.candidate.cfg, batches=(8,), prompt_len=64,
                                 new_tokens=8 if ctx.fast else 32, repeats=3 if ctx.fast else 5)
        rollout = cap.canary_release(
            res.baseline.cpu(), res.candidate.cpu(), tok, tempfile.mkdtemp(prefix="codex-lab-report-capstone-"),
            gates={"passed": res.passed, "reasons": res.reasons, **res.gates["candidate"].scores()},
            requests=40 if ctx.fast else 200, promote_after=10 if ctx.fast else 60, min_requests=5 if ctx.fast else 20,
            serve_refused=not res.passed)  # a refused candidate is served only to compare the live verdict
        tsizes = tr.trade_sizes(ctx.mode)
        trade = tr.run_trade(ctx.corpus(), tsizes)
        speed = tsp.speed_records({k: trade.model(k) for k in tr.KINDS}, context=tsizes.context,
                                  decode_batch=tsizes.decode_batch, new_tokens=tsizes.new_tokens, rounds=tsizes.rounds)
        rows = tt.trade_rows(trade, speed)
        decision = tt.trade_decision(rows)
        claims = cap.capstone_claims(models={"baseline": res.baseline, "candidate": res.candidate}, log=res.log,
                                     reports=res.gates, passed=res.passed, reasons=res.reasons,
                                     ablation=abl, rollout=rollout)
    finally:
        torch.set_num_threads(threads)
    for c in claims:
        ctx.claim(c["claim"], c["measured"], c["verdict"], lesson="08")

    parts = [
        "**The pipeline at the mode's brief budget.** The shipped model converted into one candidate with dense early / sparse deep attention, grouped-query "
        f"attention and upcycled MoE layers (`{res.candidate.cfg.attn_patterns}`, {res.candidate.cfg.n_kv_head} K/V heads, "
        f"MoE layers {res.candidate.cfg.moe_layers}, {res.candidate.cfg.n_experts} experts top-{res.candidate.cfg.moe_top_k}), "
        "and the plain model, given the same pre-training and multi-task fine-tuning budget "
        f"({sizes.pretrain_steps} + {sizes.finetune.steps} steps, balancer `{res.finetune['candidate'].config.balance}`):",
        cap.summary_table(res.log, markdown=True),
        f"Gates: candidate {'passes' if res.passed else 'refused: ' + '; '.join(res.reasons)}. "
        f"Live canary ({rollout['canary']['n']:.0f} canary requests of {rollout['load']['requests_ok']}): "
        f"**{rollout['action']}** ({'; '.join(rollout['reasons'])}); {rollout['load']['errors']} client errors."
        + ("" if res.passed else " The refused candidate was served on purpose, to compare the live verdict with the gates."),
        "Decode speed (tokens/s, batch 8, cached greedy) with one optimisation at a time:\n\n"
        "| variant | tokens/s | vs plain (median, per-round range; interleaved rounds) | KV bytes/token | active params |\n"
        "|---|---|---|---|---|\n"
        + "\n".join(f"| {r['variant']} | {r['tokens_per_s']:.0f} | {r['vs_plain_median']:.2f}x "
                    f"({r['vs_plain_lo']:.2f}-{r['vs_plain_hi']:.2f}x) | "
                    f"{r['kv_bytes_per_token']:,} | {r['active_params']:,} |" for r in abl),
        "Stage times: " + ", ".join(f"{k} {v:.1f} s" for k, v in res.log.times.items()) + ".",
        f"Held-out curves of this brief pre-training (training-state rule, 1 seed): "
        + "; ".join(training_state(res.log.curves[n], n) for n in ("baseline", "candidate"))
        + ". The gates above judge this budget, not the designs; the trade below trains every design to its plateau.",
        "### The measured trade: what each optimisation costs and buys, on one set of trained designs\n\n"
        f"{tsizes.describe()}; mode `{ctx.mode}`"
        + (" (fast mode: caps far too short to plateau; the states below say so)" if ctx.mode == "fast" else "")
        + ". Per seed a plain model is pre-trained to its plateau and converted into each design; every design "
        "and the plain model then train on, each to its own plateau (the steps are in the table). Cost: held-out "
        "loss minus the plain model's at their stopping points, paired by seed, with its 90% interval (the one-sided "
        f"95% bounds) and the non-inferiority verdict at the declared margin {tr.MARGIN_NATS:g} nats/token. Buys, on "
        f"the first seed's trained models: prefill of {tsizes.context} tokens and decode of a batch of "
        f"{tsizes.decode_batch} over a {tsizes.context}-token cache, each the median and range of the per-round "
        f"speed-ups over plain ({tsizes.rounds} interleaved rounds), KV-cache bytes per token read from the filled "
        "cache, parameters stored / active per token.",
        tt.trade_table(rows, context=tsizes.context, decode_batch=tsizes.decode_batch, markdown=True),
        "Each arm's run: " + "; ".join(tt.trade_lines(trade)) + ".",
        f"Release gate per design (quality: non-inferior at the same {tr.MARGIN_NATS:g} margin; speed: not slower "
        "than plain in every round of prefill or of decode; worth shipping: a smaller KV cache, or prefill or decode "
        "faster in every round):\n\n"
        + "\n".join(f"- {r.label}: " + ("passes" if r.passed else "; ".join(r.reasons)) for r in rows if r.kind != "plain")
        + f"\n\n**Decision:** {decision['text']}. Trade experiment: {trade.seconds:.0f} s of training units "
        f"({len(tsizes.seeds)} seeds).",
    ]

    # every claim recorded so far (earlier sections and this one), by the article's section
    rows = sorted(ctx.claims, key=lambda c: (SEED_SECTION.get(c["lesson"], "~"), c["lesson"]))
    table = ["| article section | lesson | seed claim | measured by the course | verdict |", "|---|---|---|---|---|"]
    table += [f"| {SEED_SECTION.get(c['lesson'], '?')} | {c['lesson']} | {c['claim']} | {c['measured']} | {c['verdict']} |"
              for c in rows]
    counts = Counter(c["verdict"] for c in ctx.claims)
    lessons = sorted({c["lesson"] for c in ctx.claims})
    parts.append(f"### Every seed claim beside what the course measured\n\n{len(ctx.claims)} claims from lessons "
                 f"{', '.join(lessons)}: " + ", ".join(f"{v} {n}" for v, n in counts.most_common()) + ".\n\n" + "\n".join(table))
    parts.append("\n".join(article_reference_block(ctx, "08")))
    return "\n\n".join(parts)
