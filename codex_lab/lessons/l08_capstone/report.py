"""Report section, lesson 08: the capstone run, then every seed claim gathered in one table."""

from __future__ import annotations

import tempfile
from collections import Counter
from typing import Any

from codex_lab.reference import article_reference_block

TITLE = "Lesson 08: capstone (every optimisation in one model) and the seed claims"
ORDER = 8

def run(ctx: Any) -> str:
    """The trade experiment (every design trained to its plateau after conversion; what each
    costs and buys, measured on the same trained models, and what the gates promote), then the
    release of its trained candidate ("all") against its trained plain model: the gates with
    intervals and a live canary; record the capstone's claims on those models, and close with
    every claim recorded so far by any section."""
    import torch

    from codex_lab.lessons.l08_capstone import pipeline as cap
    from codex_lab.lessons.l08_capstone.architecture import describe
    from codex_lab.lessons.l08_capstone.claims import capstone_claims
    from codex_lab.lessons.l08_capstone.release import canary_release
    from codex_lab.lessons.l08_capstone.results import StageLog, summary_table
    from codex_lab.lessons.l08_capstone import trade as tr
    from codex_lab.lessons.l08_capstone import trade_speed as tsp
    from codex_lab.lessons.l08_capstone import trade_table as tt

    threads = torch.get_num_threads()
    # the math threads are the report's (course.report runs each section under
    # runtime.use_compute_threads: 1 on a 2-core machine), as in the lesson
    try:
        tsizes = tr.trade_sizes(ctx.mode)
        trade = tr.run_trade(ctx.corpus(), tsizes)
        speed = tsp.speed_records({k: trade.model(k) for k in tr.KINDS}, context=tsizes.context,
                                  decode_batch=tsizes.decode_batch, new_tokens=tsizes.new_tokens, rounds=tsizes.rounds)
        rows = tt.trade_rows(trade, speed)
        decision = tt.trade_decision(rows)
        # the release: the trade's trained candidate (every optimisation) against its trained plain model, first seed
        models = {"baseline": trade.model("plain"), "candidate": trade.model("all")}
        log, tok = StageLog(), trade.tokenizer
        for name, m in models.items():
            log.put(name, **{k: v for k, v in describe(m, seq_len=tsizes.context).items() if k != "layers"})
        sizes = cap.CapstoneSizes(gate_tokens=24 if ctx.fast else 48)
        reports, passed, reasons = cap.gate_stage(models, tok, sizes, log)
        rollout = canary_release(
            models["baseline"], models["candidate"], tok, tempfile.mkdtemp(prefix="codex-lab-report-capstone-"),
            gates={"passed": passed, "reasons": reasons, **reports["candidate"].scores()},
            requests=40 if ctx.fast else 200, promote_after=10 if ctx.fast else 60, min_requests=5 if ctx.fast else 20,
            serve_refused=not passed)  # a refused candidate is served only to compare the live verdict
        claims = capstone_claims(models=models, log=log, reports=reports, passed=passed, reasons=reasons,
                                     speed=speed, rollout=rollout)
    finally:
        torch.set_num_threads(threads)
    for c in claims:
        ctx.claim(c["claim"], c["measured"], c["verdict"], lesson="08")

    cand = models["candidate"].cfg
    gates = "; ".join(f"{g}: {c.diff:+.3f} [{c.lo:+.3f}, {c.hi:+.3f}] {c.verdict}" for g, c in log.gates.items())
    # a gate both models score 0 on cannot tell them apart: "no worse" there says nothing about damage
    floor = [g for g in log.gates if all(v == 0.0 for rep in reports.values() for v in rep.per_item(g))]
    if floor:
        gates += (f" (both models score 0 on {', '.join(floor)}: at this size those gates cannot tell a damaged "
                  "model from a sound one)")
    parts = [
        "### The measured trade: what each optimisation costs and buys, on one set of trained designs\n\n"
        f"{tsizes.describe()}; mode `{ctx.mode}`"
        + (" (fast mode: caps far too short to plateau; the states below say so)" if ctx.mode == "fast" else "")
        + ". Per seed a plain model is pre-trained for a fixed budget and converted into each design; every design "
        "and the plain model (its pre-training continued) then train on, each to its own plateau (the steps are in "
        "the table). Cost: held-out "
        "loss minus the plain model's at their stopping points, paired by seed, with its 90% interval (the one-sided "
        f"95% bounds) and the non-inferiority verdict at the declared margin {tr.MARGIN_NATS:g} nats/token. Buys, on "
        f"the first seed's trained models: prefill of {tsizes.context} tokens and decode of a batch of "
        f"{tsizes.decode_batch} over a {tsizes.context}-token cache, each the median and range of the per-round "
        f"speed-ups over plain ({tsizes.rounds} interleaved rounds), KV-cache bytes per token read from the filled "
        "cache, parameters stored / active per token.",
        tt.trade_table(rows, context=tsizes.context, decode_batch=tsizes.decode_batch, markdown=True),
        "Each arm's run: " + "; ".join(tt.trade_lines(trade)) + ".",
        *(["\n".join(agreement)] if (agreement := tt.reference_agreement(trade)) else []),
        f"Release gate per design (quality: non-inferior at the same {tr.MARGIN_NATS:g} margin; speed: not slower "
        "than plain in every round of prefill or of decode; worth shipping: a smaller KV cache, or prefill or decode "
        "faster in every round):\n\n"
        + "\n".join(f"- {r.label}: " + ("passes" if r.passed else "; ".join(r.reasons)) for r in rows if r.kind != "plain")
        + f"\n\n**Decision:** {decision['text']}. Trade experiment: {trade.seconds:.0f} s of training units "
        f"({len(tsizes.seeds)} seeds).",
        "### The release: the trained candidate against the trained plain model\n\n"
        f"The trade's first seed: the candidate with every optimisation (`{cand.attn_patterns}`, {cand.n_kv_head} "
        f"K/V heads, MoE layers {cand.moe_layers}, {cand.n_experts} experts top-{cand.moe_top_k}) and the plain "
        "model, each trained as far as its row above says. Release gates, each quality gate paired over the same problems at its "
        f"declared margin (candidate minus baseline, 90% interval): {gates}. Candidate "
        f"{'passes' if passed else 'refused: ' + '; '.join(reasons)}. Live canary "
        f"({rollout['canary']['n']:.0f} canary requests of {rollout['load']['requests_ok']}, quality signal: the "
        f"share of answers that parse): **{rollout['action']}** ({'; '.join(rollout['reasons'])}); "
        f"{rollout['load']['errors']} client errors."
        + ("" if passed else " The refused candidate was served on purpose, to compare the live verdict with the gates."),
        summary_table(log, markdown=True),
    ]

    # every claim recorded so far (earlier sections and this one), by the article's section
    counts = Counter(c["verdict"] for c in ctx.claims)
    lessons = sorted({c["lesson"] for c in ctx.claims})
    parts.append(f"### Every seed claim so far\n\n{len(ctx.claims)} claims from lessons {', '.join(lessons)}: "
                 + ", ".join(f"{v} {n}" for v, n in counts.most_common()) + ". The report closes with all of them, "
                 "one short row each by the article's section, each row's whole figure and states below it.")
    parts.append("\n".join(article_reference_block(ctx, "08")))
    return "\n\n".join(parts)
