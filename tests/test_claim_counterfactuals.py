"""Every verdict the report prints can come out the other way.

For each seed claim a report section records (``ctx.claim(...)`` in a lesson's ``report.py``,
and the capstone's claims in ``l08_capstone/claims.py``), :data:`COUNTERFACTUALS` names the
tests that feed the claim's own verdict code an input that flips it (a perturbed model, a
pattern without its links, a gate that lets a worse model through, a slower canary ...).
``test_every_claim_row_has_a_counterfactual_test`` reads the claims from the source, so a new
claim without a counterfactual fails here. The tests in this file cover the claims whose verdict
code had none elsewhere.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from codex_lab.stats import FAILS, FAILS_AS_STATED, HOLDS, NOT_RESOLVED, check_stated

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "codex_lab" / "lessons"

# claim (its text's start, as written in the source) -> "file::test" that flips its verdict
COUNTERFACTUALS: dict[str, list[str]] = {
    "Code has local scope": ["test_claim_counterfactuals.py::test_local_scope_flips_with_the_window"],
    "Window + strided sparse attention takes cost from O(N^2)": [
        "test_claim_counterfactuals.py::test_n_sqrt_n_holds_only_when_window_and_stride_grow"],
    "Global strided links every 16-32 tokens": ["test_claim_counterfactuals.py::test_strided_links_cost_in_tiles"],
    "Strided links keep the far": ["test_02_long_range.py::test_far_links_claim_flips_with_its_counterfactuals",
                                   "test_02_long_range.py::test_a_dense_arm_far_below_the_ceiling_did_not_learn"],
    "Gradual sparsity": ["test_claim_counterfactuals.py::test_schedule_claim_flips_with_the_far_accuracies"],
    "Sparse attention makes long code context cheap": ["test_claim_counterfactuals.py::test_long_context_verdict"],
    'GQA with group size 4-8 "reduces KV-cache': ["test_l03_protocol.py::test_the_articles_40_percent_fails_as_stated",
                                                  "test_claim_counterfactuals.py::test_kv_saving_claim_can_hold"],
    "recommended group size 4-8": ["test_l03_protocol.py::test_protocol_verdicts_are_non_inferiority_with_the_declared_margin",
                                   "test_l03_protocol.py::test_a_base_still_falling_gives_no_verdict"],
    "MoE: 8-16 experts": ["test_l04_protocol.py::test_cost_claim_follows_the_rounds"],
    "MoE gives a big model's quality": ["test_l04_protocol.py::test_moe_better_than_small_dense_and_as_good_as_big_dense_holds",
                                        "test_l04_protocol.py::test_moe_worse_than_both_fails"],
    "MoE has the total capacity": ["test_l04_protocol.py::test_moe_better_than_small_dense_and_as_good_as_big_dense_holds",
                                   "test_l04_protocol.py::test_moe_worse_than_both_fails"],
    "MoE layers as described": ["test_l04_protocol.py::test_balance_claim_follows_the_load"],
    "Weight the mix by effective": ["test_claim_counterfactuals.py::test_valid_token_weighting_claim"],
    "Balanced multi-task models score": ["test_05_multitask.py::test_verdicts_follow_scores_and_states"],
    "Equal-weight summed losses": ["test_05_multitask.py::test_verdicts_follow_scores_and_states"],
    "Improved batch scheduling": ["test_claim_counterfactuals.py::test_batching_verdict"],
    "TTFT < 100 ms": ["test_claim_counterfactuals.py::test_serving_verdicts"],
    "TBT < 20 ms": ["test_claim_counterfactuals.py::test_serving_verdicts"],
    "a request finishes within 30 s": ["test_claim_counterfactuals.py::test_serving_verdicts"],
    "gate new versions": ["test_claim_counterfactuals.py::test_serving_verdicts"],
    "roll back a worse version": ["test_claim_counterfactuals.py::test_serving_verdicts"],
    # the capstone's claims (l08_capstone/claims.py): one test builds inputs for each verdict
    "On the capstone candidate: sparse attention": ["test_capstone.py::test_finetune_stage_and_gate_decision_on_the_composed_model"],
    "On the capstone candidate: GQA cuts": ["test_capstone.py::test_finetune_stage_and_gate_decision_on_the_composed_model"],
    "On the capstone candidate: MoE": ["test_capstone.py::test_finetune_stage_and_gate_decision_on_the_composed_model"],
    "On the capstone candidate: TTFT": ["test_capstone.py::test_finetune_stage_and_gate_decision_on_the_composed_model"],
    "On the capstone candidate: a new version": ["test_capstone.py::test_finetune_stage_and_gate_decision_on_the_composed_model"],
}


def _text(node: ast.expr) -> str:
    """A claim's text as written: a string, or an f-string's literal parts (values as {})."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return ""


def claims_in_source() -> list[tuple[str, str]]:
    """(file, claim text) for every ``ctx.claim(...)`` in a report section and every ``add(...)``
    claim of the capstone."""
    out = []
    for path in sorted(LESSONS.glob("*/report.py")) + [LESSONS / "l08_capstone" / "claims.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            f = node.func
            is_claim = isinstance(f, ast.Attribute) and f.attr == "claim"
            is_add = path.name == "claims.py" and isinstance(f, ast.Name) and f.id == "add"
            if is_claim or is_add:
                text = _text(node.args[0])
                if text:  # the capstone section forwards claims.py's rows by variable
                    out.append((path.relative_to(ROOT).as_posix(), text))
    return out


def test_every_claim_row_has_a_counterfactual_test() -> None:
    claims = claims_in_source()
    assert len(claims) >= 25, claims  # the report's claims: if this drops, the reader above broke
    missing = [(f, c) for f, c in claims if not any(c.startswith(k) for k in COUNTERFACTUALS)]
    assert not missing, f"claims without a counterfactual test (add one and name it in COUNTERFACTUALS): {missing}"
    for key, tests in COUNTERFACTUALS.items():
        assert any(c.startswith(key) for _, c in claims), f"{key!r} names no claim in the source: remove or fix it"
        for t in tests:
            file, name = t.split("::")
            src = (ROOT / "tests" / file).read_text()
            assert f"def {name}(" in src, f"{t} does not exist"


def test_n_sqrt_n_holds_only_when_window_and_stride_grow() -> None:
    """The report's rule on the growth exponent between N = 2^19 and 2^20: fixed w and s give ~2
    (fails as stated); w and s growing like sqrt(N) give 1.5 (holds)."""
    from codex_lab.nn.patterns import seed_cost_ratio

    def exponent(cost) -> float:
        return math.log(cost(1 << 20) / cost(1 << 19)) / math.log(2)

    fixed = exponent(lambda n: seed_cost_ratio(n, 128, 32)["sparse"])
    grown = exponent(lambda n: n * (math.isqrt(n) + n / math.isqrt(n)))
    assert check_stated(fixed, 1.45, 1.55) == FAILS_AS_STATED and fixed > 1.9
    assert check_stated(grown, 1.45, 1.55) == HOLDS


def test_strided_links_cost_in_tiles() -> None:
    """Token stride 32 touches more tiles than its pair count says (fails as stated); a
    block-granular stride adds no more tiles than pairs (holds): the same rule, another input."""
    from codex_lab.nn.patterns import parse_pattern
    from codex_lab.nn.sparse import tiles_computed

    n, bs = 2048, 128
    win = parse_pattern("window:128")

    def verdict(spec: str) -> str:
        p = parse_pattern(spec)
        pair_ratio = p.density(n) / win.density(n)
        tile_ratio = tiles_computed(spec, n, bs) / tiles_computed(win, n, bs)
        return check_stated(tile_ratio, 0.0, pair_ratio)

    assert verdict("window:128+strided:32") == FAILS_AS_STATED
    assert verdict("window:128+blockstride:128:8") == HOLDS


def test_schedule_claim_flips_with_the_far_accuracies() -> None:
    """Dense-early ahead of sparse-early holds; behind it fails; level is not resolved."""
    from codex_lab.lessons.l02_sparse_attention import experiments as lr

    sparse_early = [0.50, 0.52, 0.49, 0.51, 0.50]
    far = {"sparse early, dense deep": sparse_early,
           "up": [x + 0.3 + 0.01 * (i % 2) for i, x in enumerate(sparse_early)],
           "down": [x - 0.3 + 0.01 * (i % 2) for i, x in enumerate(sparse_early)],
           "level": [x + 0.01 * (-1) ** i for i, x in enumerate(sparse_early)]}
    got = {k: lr.claim_verdict(far, "sparse early, dense deep", k).verdict for k in ("up", "down", "level")}
    assert got == {"up": HOLDS, "down": FAILS, "level": NOT_RESOLVED}


def test_long_context_verdict() -> None:
    from codex_lab.lessons.l02_sparse_attention.report import long_context_verdict

    assert long_context_verdict(8.45, 6.8) == HOLDS  # the goal met: the same bar as the goal row
    assert long_context_verdict(3.0, 6.8) == FAILS_AS_STATED  # cheaper, by less than the density promises
    assert long_context_verdict(0.9, 6.8) == FAILS  # not cheaper at all
    with pytest.raises(ValueError):
        long_context_verdict(float("nan"), 6.8)


def test_kv_saving_claim_can_hold() -> None:
    """The article's "about 40%" is checked against the measured saving: a saving of 40% would
    hold (no integer group size gives it: 1 - 1/g is 0, 50%, 67%, 75% ...)."""
    assert check_stated(0.40, 0.35, 0.45) == HOLDS
    assert all(check_stated(1 - 1 / g, 0.35, 0.45) == FAILS_AS_STATED for g in range(1, 17))


def test_valid_token_weighting_claim() -> None:
    """Holds when some task's share of samples and of valid tokens differ by > 5 points; fails when
    every task's answers are the same length (the two weightings agree)."""
    from codex_lab.lessons.l05_multitask.report import weighting_verdict

    assert weighting_verdict({"a": 100, "b": 10}, {"a": 1000, "b": 500}) == HOLDS
    assert weighting_verdict({"a": 100, "b": 10}, {"a": 1000, "b": 100}) == FAILS


def test_batching_verdict() -> None:
    from codex_lab.lessons.l06_inference.report import batching_verdict

    assert batching_verdict(2.8, 1.1, True) == HOLDS
    assert batching_verdict(2.8, 0.9, True) == FAILS_AS_STATED  # behind static batching on throughput
    assert batching_verdict(2.8, 1.1, False) == FAILS_AS_STATED  # no better median TTFT
    assert batching_verdict(1.1, 1.1, True) == FAILS  # batching buys nothing


def test_serving_verdicts() -> None:
    from codex_lab.lessons.l07_serving.report import deadline_verdict, gate_verdict, latency_verdict, rollback_verdict

    assert (latency_verdict(67.6, 100), latency_verdict(104.0, 100)) == (HOLDS, FAILS)
    assert (latency_verdict(17.0, 20), latency_verdict(20.0, 20)) == (HOLDS, FAILS)
    assert deadline_verdict("deadline", 0.35, 0.3) == HOLDS
    assert deadline_verdict("length", 5.1, 0.3) == FAILS  # ran on to max_tokens
    assert deadline_verdict("deadline", 4.9, 0.3) == FAILS  # ended, but long after its deadline
    assert gate_verdict(False, 0.1, 0.4) == HOLDS
    assert gate_verdict(False, 0.4, 0.4) == FAILS_AS_STATED  # refused, but not by the functional gate
    assert gate_verdict(True, 0.1, 0.4) == FAILS  # a worse model let through
    assert rollback_verdict("rollback", 0) == HOLDS
    assert rollback_verdict("promote", 0) == FAILS and rollback_verdict("rollback", 2) == FAILS


def test_local_scope_flips_with_the_window() -> None:
    """Lesson 01's rule (non-inferiority of a windowed model's held-out loss against dense, margin
    0.05 nats) on the shipped model: a 4-token window loses far more than the margin (fails)."""
    from codex_lab.data.corpus import load_corpus
    from codex_lab.lessons.l01_attention_patterns.analysis import WINDOW_MARGIN_NATS, window_losses
    from codex_lab.stats import noninferiority
    from codex_lab.training.checkpoint import load_pretrained

    ck = load_pretrained()
    texts = load_corpus().texts("val")
    losses = window_losses(ck.model, ck.tokenizer, texts, windows=(4,), n_snippets=2, length=96, seeds=[0, 1, 2],
                           min_query=8)
    per = {arm: [float(x.mean()) for x in v] for arm, v in losses.items()}
    c = noninferiority(per["dense"], per["window:4"], margin=WINDOW_MARGIN_NATS, paired=True, higher_is_better=False)
    assert c.verdict == FAILS, c.describe()
    # and a cost well inside the margin holds, through the same rule
    near = [x + 0.01 + 0.002 * i for i, x in enumerate(per["dense"])]
    assert noninferiority(per["dense"], near, margin=WINDOW_MARGIN_NATS, paired=True,
                          higher_is_better=False).verdict == HOLDS
