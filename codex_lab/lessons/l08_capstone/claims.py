"""The seed claims one capstone run measures, each with a verdict computed from the numbers.

Each row names the capstone candidate: the lessons answer the same questions on their own
models (lesson 02's pattern, lesson 03's GQA, lesson 07's server); these rows measure the one
model that composes them, so a row here and a lesson's row may differ and say why. The
multi-task claim has no row here: lesson 05 answers it.

One vocabulary with every lesson (:data:`codex_lab.stats.VERDICTS`): holds, fails, fails as
stated (the article's figure or parameters are contradicted; the measured text says what
holds), not resolved, under-trained: no verdict. Every claim here can come out either way:
``tests/test_capstone.py`` builds inputs that produce each verdict.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from codex_lab.lessons.l08_capstone.results import StageLog
from codex_lab.nn.accounting import measured_cache_bytes
from codex_lab.nn.model import CodexModel
from codex_lab.nn.patterns import parse_pattern
from codex_lab.stats import FAILS, FAILS_AS_STATED, HOLDS, VERDICTS, check_stated


def capstone_claims(
    *,
    models: dict[str, CodexModel],
    log: StageLog,
    reports: dict[str, Any],
    passed: bool,
    reasons: Sequence[str],
    speed: Mapping[str, Mapping[str, Any]],
    rollout: dict[str, Any] | None = None,
    kv_tokens: int = 512,
) -> list[dict[str, str]]:
    """The seed claims one capstone run measures: ``{"claim", "measured", "verdict"}`` each,
    the verdict computed from the numbers (one of :data:`VERDICTS`).

    ``speed``: per design kind ("moe" and "all" at least), ``decode_vs_plain`` (median, lo, hi)
    of the per-round decode speed-ups over plain and ``decode_batch``
    (:func:`~codex_lab.lessons.l08_capstone.trade_speed.speed_records` on the trade's trained
    models); ``rollout`` from :func:`canary_release` (optional).
    """
    cand = models["candidate"]
    cfg = cand.cfg
    out: list[dict[str, str]] = []

    def add(claim: str, measured: str, verdict: str) -> None:
        assert verdict in VERDICTS, verdict
        out.append({"claim": claim, "measured": measured, "verdict": verdict})

    sparse = next(cfg.pattern_for(i) for i in range(cfg.n_layer) if cfg.pattern_for(i) != "dense")
    pat = parse_pattern(sparse)
    # growth exponent of the attended pairs between N and 4N: log(pairs ratio) / log(4)
    growth = math.log(pat.pairs(4096) / pat.pairs(1024)) / math.log(4)
    add("On the capstone candidate: sparse attention, O(N^2) -> O(N sqrt N)",
        f"{pat.spec}: attended pairs grow like N^{growth:.2f} from N=1024 to 4096 (N sqrt N: 1.50); density {pat.density(1024):.2f} at 1024",
        # the article's N sqrt N is exponent 1.5; +-0.05 for the finite-N curvature of N(w + N/s)
        check_stated(growth, 1.45, 1.55))
    kv = {n: measured_cache_bytes(m, 1, kv_tokens) for n, m in models.items()}
    save = 1 - kv["candidate"] / kv["baseline"]
    g = cfg.group_size
    add("On the capstone candidate: GQA cuts the KV cache by about 40%",
        f"group size {g}: {kv['baseline']:,} -> {kv['candidate']:,} bytes at {kv_tokens} tokens = {save:.0%} (1 - 1/g = {1 - 1 / g:.0%}"
        + (", what holds" if abs(save - (1 - 1 / g)) < 1e-9 else ", and the bytes do not follow 1 - 1/g either") + ")",
        # "about 40%": 35-45%; the mechanism's own figure 1 - 1/g must hold exactly on the cache tensors
        check_stated(save, 0.35, 0.45) if abs(save - (1 - 1 / g)) < 1e-9 else FAILS)
    missing = [k for k in ("moe", "all") if k not in speed]
    if missing:
        raise ValueError(f"the speed records lack {missing}: time the MoE design and the candidate against plain")
    b = speed["all"]["decode_batch"]

    def rel(kind: str) -> str:  # speed-up over plain, median and per-round range (interleaved rounds)
        med, lo, hi = speed[kind]["decode_vs_plain"]
        return f"{med:.2f}x (rounds {lo:.2f}-{hi:.2f}x)"

    total, active = log.rows["candidate"]["params"], log.rows["candidate"]["active_params"]
    # holds: more stored than used per token and MoE decode not slower than the plain model in every round;
    # fails as stated: the capacity is there but the compute is not a small model's here (slower in every round);
    # fails: no more parameters stored than used
    moe_slower = speed["moe"]["decode_vs_plain"][2] < 1.0
    add("On the capstone candidate: MoE, the capacity of a big model at the compute of a small one",
        f"{total:,} params, {active:,} active per token ({total / active:.1f}x); decode speed at batch {b}: MoE alone "
        f"{rel('moe')}, full candidate {rel('all')} the plain model on this machine",
        FAILS if total <= active else (FAILS_AS_STATED if moe_slower else HOLDS))
    # the multi-task claim is lesson 05's question, answered there (one pretrained model, each arm to its
    # plateau, seeds and intervals); a brief fine-tune of the capstone, one run per design, is not a second answer
    ms = {n: (r.ttft_p95_s * 1000, r.tbt_p95_s * 1000) for n, r in reports.items()}
    add("On the capstone candidate: TTFT < 100 ms and TBT < 20 ms",
        f"{len(reports['baseline'].samples)} gate prompts at once, p95: baseline {ms['baseline'][0]:.0f} / {ms['baseline'][1]:.1f} ms, "
        f"candidate {ms['candidate'][0]:.0f} / {ms['candidate'][1]:.1f} ms",
        # judged on the candidate's latencies: the design the claim is about
        HOLDS if ms["candidate"][0] < 100 and ms["candidate"][1] < 20 else FAILS)
    refused = "; ".join(r.split(":")[0] for r in reasons)
    if rollout is None:
        # the gates must be consistent: passed with no reason, or refused with the gates that refused it
        add("On the capstone candidate: a new version must be no worse than the baseline on every gate",
            f"gates {'passed' if passed else 'refused it on ' + refused}",
            HOLDS if passed == (not reasons) else FAILS)
    else:
        agree = passed == (rollout["action"] == "promote")
        add("On the capstone candidate: a new version must be no worse than the baseline on every gate before its traffic grows",
            f"gates {'passed' if passed else 'refused it on ' + refused}; live canary ({rollout['canary']['n']:.0f} requests): "
            f"{rollout['action']}, {rollout['load']['errors']} client errors",
            HOLDS if agree and rollout["load"]["errors"] == 0 else FAILS)
    return out
