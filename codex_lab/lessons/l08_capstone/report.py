"""Report section, lesson 08: the capstone run, then every seed claim gathered in one table."""

from __future__ import annotations

import tempfile
from collections import Counter
from typing import Any

TITLE = "Lesson 08: capstone (every optimisation in one model) and the seed claims"
ORDER = 8

# Where each lesson's claims sit in the article (SEED.md sections).
SEED_SECTION = {
    "00": "set-up", "01": "1. sparse attention", "02": "1. sparse attention", "03": "3. inference acceleration",
    "04": "3. inference acceleration", "05": "2. multi-task fine-tuning", "06": "3. inference acceleration",
    "07": "4. monitoring and rollback", "08": "all (capstone)",
}


def run(ctx: Any) -> str:
    """Run the capstone (convert, pre-train, fine-tune, gate, canary) on the shipped model,
    record its claims, and close with every claim recorded so far by any section."""
    import torch

    from codex_lab.lessons.l08_capstone import pipeline as cap

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
        claims = cap.capstone_claims(models={"baseline": res.baseline, "candidate": res.candidate}, log=res.log,
                                     finetunes=res.finetune, reports=res.gates, passed=res.passed, reasons=res.reasons,
                                     ablation=abl, rollout=rollout)
    finally:
        torch.set_num_threads(threads)
    for c in claims:
        ctx.claim(c["claim"], c["measured"], c["verdict"], lesson="08")

    parts = [
        "The shipped model converted into one candidate with dense early / sparse deep attention, grouped-query "
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
    return "\n\n".join(parts)
