"""Lesson 02's long-range experiment (codex_lab/lessons/l02_sparse_attention/experiments.py):
the query-only readout equals the model's own logits, the arms are matched in density and no
arm sees the bindings by construction, the helpers that word the verdicts follow the numbers,
verdicts go through the training-state rule, and a tiny run is deterministic per seed."""

from __future__ import annotations

import pytest
import torch

from codex_lab.data.longrange import RecallTask, candidates, make_recall_batch
from codex_lab.lessons.l02_sparse_attention import experiments as lr
from codex_lab.lessons.l02_sparse_attention.geometry import MOBA, RecallConfig, SCHEDULES, arms_for, config_for, densities, fast_config, full_config, moba_spec_for, standard_config
from codex_lab.stats import HOLDS, UNDER_TRAINED

TINY_TASK = RecallTask(seq_len=64, n_keys=3, distances=(10, 40), per_distance=1, layout="scattered")
TINY = RecallConfig(task=TINY_TASK, n_layer=2, d_model=32, ffn_hidden=32, batch=2, steps=4, eval_every=1, eval_sequences=4,
                       seeds=(0, 1), tuning_seeds=(), corpus_files=10)


@pytest.fixture(scope="module")
def data():
    return lr.task_data(TINY.corpus_files, TINY.max_line)


def test_query_logits_equal_the_models_logits(data):
    vocab, vocab_size, lines, _ = data
    torch.manual_seed(0)
    model = lr.build_model(["window:16+strided:8", "dense"], TINY, vocab_size).eval()
    batch = make_recall_batch(lines, vocab, TINY.task, 2, torch.Generator().manual_seed(0))
    cand = candidates(vocab, batch.key)  # (B, Q, P)
    with torch.no_grad():
        full = model(batch.tokens).logits  # (B, T, V)
        want = full.gather(1, batch.query_pos[..., None].expand(-1, -1, full.shape[-1]))  # (B, Q, V)
        want = want.gather(2, cand)  # (B, Q, P)
        got = lr.query_logits(model, batch, cand)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # fp32, O(1) logits, summation order differs


@pytest.mark.parametrize("mode", ["fast", "standard", "full"])
def test_arms_are_matched_in_density(mode):
    cfg = config_for(mode)
    n = cfg.task.seq_len
    arms = arms_for(mode)
    # every arm has one spec per layer of its mode's model (full mode: 4 layers, not the standard 3)
    assert all(len(p) == cfg.n_layer for p in arms.values()), {k: len(p) for k, p in arms.items()}
    specs = {k: p[0] for k, p in arms.items() if k not in SCHEDULES and k != "dense"}
    d = densities(specs, n)
    # every sparse arm within 10% of the window + stride arm's density at the training length
    assert all(abs(v / d["window+stride"] - 1) < 0.1 for v in d.values()), d
    if mode == "full":  # the article's window and stride, at its lengths
        assert specs["window+stride"] == "window:128+strided:32" and n == 1024
    else:  # MoBA (full mode): the MoBA spec closest to that density (8-token blocks, one selected: 0.295 at N = 128)
        assert moba_spec_for(d["window+stride"], n) == MOBA


@pytest.mark.parametrize("mode", ["standard", "full"])
def test_far_distances_lie_beyond_the_window_reach_and_near_ones_inside(mode):
    cfg = config_for(mode)
    assert cfg.reach == cfg.n_layer * (cfg.wide_window - 1)
    far = [d for d in cfg.task.distances if d > cfg.reach]
    near = [d for d in cfg.task.distances if d <= cfg.reach]
    assert len(far) >= 2 and len(near) >= 3 and max(far) >= 1.5 * cfg.reach  # well beyond the reach
    # no distance a strided link reads in one hop: the far queries need the relay
    assert all(d % cfg.stride for d in cfg.task.distances), (cfg.task.distances, cfg.stride)
    if mode == "full":  # the reach table at 1024 tokens is slow; the rule above is what it checks
        return
    assert cfg.reach == 3 * (16 - 1) and len(far) >= 3 and max(far) >= 2 * cfg.reach  # "a few times the reach"
    tab = lr.reach_table({k: [v] * cfg.n_layer for k, v in cfg.specs.items()}, cfg.task)
    assert all(tab["window"][str(d)] == 1.0 for d in near) and all(tab["window"][str(d)] == 0.0 for d in far)
    for arm in ("dense", "window+stride", "window+global"):  # the patterns reach every placement
        assert all(v == 1.0 for v in tab[arm].values()), (arm, tab[arm])
    # the nearest distance lies inside the window + stride arm's own window: one hop
    assert min(cfg.task.distances) < cfg.window


def test_global_tokens_do_not_sit_where_the_bindings_are(data):
    """The window+global arm's global tokens (every ``stride``-th position) are fixed; the bindings
    are scattered: their value tokens fall on every residue mod the stride, about equally often."""
    vocab, _, lines, _ = data
    cfg = standard_config()
    s = cfg.stride
    b = make_recall_batch(lines, vocab, cfg.task, 400, torch.Generator().manual_seed(0))
    counts = torch.bincount(b.source_pos.flatten() % s, minlength=s).float()
    share = counts / counts.sum()
    # 1/16 = 0.0625 each if uniform. Line lengths make some residues commoner (0.048-0.089 seen at
    # seed 0: the header's fixed lines), so the bound is a factor of 2 either way, not sampling
    # noise; what the test guards is that bindings do not pile up on the global positions
    assert share.min() > 0.5 / s and share.max() < 2 / s, share
    assert (b.source_pos % s == s - 1).float().mean() < 1.5 / s  # on a global token: about 1 in 16, not all


def test_cliff_near_and_far_accuracy_follow_the_numbers():
    acc = {"24": 0.9, "48": 0.8, "96": 0.3, "160": 0.1}
    assert lr.cliff(acc, 0.125) == 96  # halfway between 0.125 and 0.9 is 0.51
    assert lr.cliff({"24": 0.9, "48": 0.85}, 0.125) is None
    assert lr.cliff({"24": 0.1, "48": 0.1}, 0.125) is None
    assert lr.far_accuracy(acc, 50) == pytest.approx(0.2)
    assert lr.near_accuracy(acc, 50) == pytest.approx(0.85)
    with pytest.raises(ValueError, match="no query distance"):
        lr.far_accuracy(acc, 500)


def test_verdicts_follow_the_seeds():
    far = {"window": [0.12, 0.13, 0.11], "up": [0.5, 0.55, 0.52], "same": [0.13, 0.10, 0.12], "down": [0.01, 0.03, 0.0]}
    assert lr.claim_verdict(far, "window", "up").verdict == "holds"
    assert lr.claim_verdict(far, "window", "down").verdict == "fails"
    assert lr.claim_verdict(far, "window", "same").verdict == "not resolved"


def _fake(acc_near: float, acc_far: float, rising: bool, seed: int, salt: int = 0) -> lr.RecallRun:
    """A run whose held-out curve is flat at the end (plateau) or still climbing; seeds (and
    arms, through ``salt``) differ by up to +-0.01 so that paired differences have a variance."""
    steps = list(range(40, 520, 40))
    end = (acc_near + acc_far) / 2
    jitter = 0.005 * ((seed * 31 + salt * 17) % 5 - 2)  # -0.01 .. +0.01, a different pattern per arm
    curve = [(s, (end * s / steps[-1] if rising else end) + jitter) for s in steps]
    acc = {"10": acc_near + jitter, "20": acc_near, "40": acc_near, "64": acc_far + jitter, "88": acc_far, "112": acc_far}
    return lr.RecallRun(acc, curve, [(s, acc_far) for s in steps], 1.0)


def test_judge_gives_verdicts_only_on_trained_arms():
    cfg = standard_config()
    plateau = {"dense": (0.97, 0.91), "window": (0.95, 0.13), "window+stride": (0.97, 0.9), "window+global": (0.96, 0.85),
               "dense early, sparse deep": (0.95, 0.14), "sparse early, dense deep": (0.96, 0.92)}
    res = {k: [_fake(a, b, False, s, i) for s in range(5)] for i, (k, (a, b)) in enumerate(plateau.items())}
    v = lr.judge(res, cfg)
    assert all(st.trained for st in v.states.values())
    # non-inferior to dense (cost 0.01 against a 0.05 margin), and the window alone loses far links
    assert v.stride.verdict == HOLDS and v.stride.kind == "non-inferiority" and v.stride.role == "primary"
    assert v.needs_far.verdict == HOLDS and v.needs_far.lo > 0.5
    assert v.schedule.verdict == "fails"  # the sparse-early schedule wins here: the claim's direction fails
    assert all(c.role.startswith("secondary (Holm") for c in v.links + v.schedule_more)
    res["window+stride"] = [_fake(0.97, 0.9, True, s, 1) for s in range(5)]  # still climbing
    v = lr.judge(res, cfg)
    assert v.states["window+stride"].state == "under-trained"
    assert v.stride.verdict == UNDER_TRAINED and "window+stride under-trained" in v.stride.describe()
    assert v.schedule.verdict == "fails"  # the schedule arms are trained: that claim keeps its verdict


def test_verdict_seeds_are_not_the_tuning_seeds():
    """Pre-registration: the sizes were tuned on seeds 0-2, the verdicts are judged on others, the
    report says which; a config judging on a tuning seed is refused."""
    for cfg in (standard_config(), fast_config(), full_config()):
        assert not set(cfg.seeds) & set(cfg.tuning_seeds)
    assert "tuned on seeds 0, 1, 2" in standard_config().preregistration
    with pytest.raises(ValueError, match="tuning seeds"):
        RecallConfig(seeds=(1, 5, 6))


def test_far_links_claim_flips_with_its_counterfactuals():
    """The same code gives each verdict: window+stride level with dense holds; 0.2 below dense
    fails (the whole interval of the cost lies above the margin); a task the window alone also
    solves (no far links needed) is not resolved, whatever window+stride does."""
    dense = [0.90, 0.92, 0.91, 0.93, 0.90]
    far = {"dense": dense, "window+stride": [d - 0.005 + 0.002 * i for i, d in enumerate(dense)],
           "window": [0.13, 0.12, 0.14, 0.12, 0.13]}
    assert lr.far_links_verdict(far)[0].verdict == HOLDS
    worse = dict(far, **{"window+stride": [d - 0.2 + 0.003 * (i % 2) for i, d in enumerate(dense)]})
    assert lr.far_links_verdict(worse)[0].verdict == "fails"
    easy = dict(far, window=[d - 0.003 * (i % 3) for i, d in enumerate(dense)])
    c, contrast = lr.far_links_verdict(easy)
    assert contrast.verdict != HOLDS and c.verdict == "not resolved" and "did not test" in c.note


def test_a_dense_arm_far_below_the_ceiling_did_not_learn():
    """The dense arm ending at 0.44 where window+stride reaches 0.93 on the same task is a failed
    optimisation, not a plateau: no verdict on the far-links claim."""
    cfg = standard_config()
    res = {"dense": [_fake(0.5, 0.38, False, s, 0) for s in range(3)],
           "window": [_fake(0.95, 0.13, False, s, 1) for s in range(3)],
           "window+stride": [_fake(0.97, 0.9, False, s, 2) for s in range(3)],
           "dense early, sparse deep": [_fake(0.95, 0.9, False, s, 3) for s in range(3)],
           "sparse early, dense deep": [_fake(0.95, 0.9, False, s, 4) for s in range(3)]}
    v = lr.judge(res, cfg)
    assert v.states["dense"].state == "did not learn" and v.states["window"].trained
    assert v.stride.verdict == "did not learn the task: no verdict"


def test_tiny_run_is_deterministic_per_seed_and_records_curves():
    arms = {"dense": ["dense", "dense"], "window": ["window:16", "window:16"]}
    a = lr.run_arms(arms, TINY)
    b = lr.run_arms(arms, TINY)
    assert {k: [r.accuracy for r in v] for k, v in a.items()} == {k: [r.accuracy for r in v] for k, v in b.items()}
    assert {k: [r.curve for r in v] for k, v in a.items()} == {k: [r.curve for r in v] for k, v in b.items()}
    for runs in a.values():
        assert len(runs) == len(TINY.seeds)
        for r in runs:
            assert set(r.accuracy) == {"10", "40"} and all(0.0 <= x <= 1.0 for x in r.accuracy.values())
            assert [s for s, _ in r.curve] == [1, 2, 3, 4]  # an evaluation every step, from run_loop's eval_fn
            assert r.curve[-1][1] == pytest.approx(sum(r.accuracy.values()) / 2)
    with pytest.raises(ValueError, match="one spec per layer"):
        lr.train_recall(["dense"], TINY, 0)


def test_seeds_vary_the_evaluation_sample_and_the_data():
    e0, e1 = lr.eval_batches(TINY, 0), lr.eval_batches(TINY, 1)
    assert not torch.equal(e0[0].tokens, e1[0].tokens)
    assert torch.equal(e0[0].tokens, lr.eval_batches(TINY, 0)[0].tokens)
    t0 = lr.train_batches(TINY, 0)[0].tokens.clone()
    assert not torch.equal(t0, lr.train_batches(TINY, 1)[0].tokens)


@pytest.mark.slow  # ~25 s of one core: the report section's fast mode, as CI runs it
def test_fast_mode_is_too_short_and_says_so(monkeypatch):
    """The report section in fast mode (CI's sizes): the rule fires, the claims are recorded as
    "under-trained: no verdict" with the arms' states, and the measured text keeps the interval."""
    from codex_lab.lessons.l02_sparse_attention import report

    monkeypatch.setenv("CODEX_LAB_MODE", "fast")

    class Ctx:
        fast, mode = True, "fast"

        def __init__(self):
            self.claims = []

        def claim(self, claim, measured, verdict, lesson="", states=""):
            self.claims.append({"claim": claim, "measured": measured, "verdict": verdict, "states": states})

        def savefig(self, fig, name):
            return f"![{name}]({name}.png)"

    ctx = Ctx()
    text = report.long_range(ctx)
    stride = ctx.claims[0]
    assert stride["verdict"] == UNDER_TRAINED, stride
    assert "under-trained" in stride["states"] and "95% CI [" in stride["measured"]
    assert "| window+stride |" in text and "cliff" in text and "fast mode" in text


def test_lesson_02_words_its_conclusions_from_computed_values():
    """Issues 29 and 37: no sentence in lesson 02 states an outcome the run did not print; the
    verdicts are computed (the training-state rule, check_stated, interleaved timings), and the
    retired verdict words are gone."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    src = (root / "notebooks" / "02_sparse_attention.py").read_text()
    md = "\n".join(c for c in src.split("# %%") if c.startswith(" [markdown]"))
    code = "\n".join(c for c in src.split("# %%") if not c.startswith(" [markdown]"))
    report = (root / "codex_lab" / "lessons" / "l02_sparse_attention" / "report.py").read_text()
    for fixed in ("not reproduced at this scale", "holds with a correction", "does not hold", "faster than all-dense",
                  "is the physical limit"):
        assert fixed not in src and fixed not in report, f"retired or fixed outcome text left in lesson 02: {fixed!r}"
    for computed in ("main.verdict", "v_rev.verdict", "v_all.verdict", "noninferiority(", "lr.arm_states(",
                     "lr.judge(", "check_stated(", "cl.interleaved_times(", "cl.timing_ratio(", "speed.describe()",
                     "cliff_w"):
        assert computed in code, f"lesson 02 should compute {computed!r}"
    for word in ("not resolved", "the claim holds", "the claim fails", "strided links keep", "dense early wins",
                 ):
        assert word not in md.lower(), f"a verdict in lesson 02's fixed markdown: {word!r}"


def test_a_curve_flat_at_chance_is_not_a_trained_arm():
    """A run too short to start learning has a flat curve at chance: the slope rule alone would
    call it a plateau; with the task's chance (1 / pool size) the rule says it did not learn."""
    cfg = standard_config()
    assert lr.chance_of(cfg) == pytest.approx(1 / 8)
    flat = {"window": [_fake(0.13, 0.12, False, s, 0) for s in range(3)],
            "window+stride": [_fake(0.97, 0.9, False, s, 1) for s in range(3)]}
    plain = lr.arm_states(flat)
    assert plain["window"].trained  # the slope rule: flat is a plateau
    st = lr.arm_states(flat, cfg)
    assert st["window"].state == "did not learn" and "chance" in st["window"].reason
    assert st["window+stride"].trained


def test_modes_run_the_primary_arms_and_the_ceiling():
    """Fast and standard: the five arms of the two primary comparisons (dense is the arm window +
    stride is held against); full adds the secondaries (window + global, MoBA where the package
    has it). 3 layers each."""
    fast, std, full = arms_for("fast"), arms_for("standard"), arms_for("full")
    assert set(fast) == {"dense", "window", "window+stride", *SCHEDULES}
    assert set(std) == set(fast) and set(full) >= set(std) | {"window+global"}
    assert all(len(p) == standard_config().n_layer for p in std.values())
    # the schedules hold one dense layer each, first or last
    assert std["dense early, sparse deep"][0] == "dense" and std["sparse early, dense deep"][-1] == "dense"
    assert std["dense early, sparse deep"].count("dense") == std["sparse early, dense deep"].count("dense") == 1
