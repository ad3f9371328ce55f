"""The training-state rule (codex_lab.training_state) on synthetic curves and on a real short run."""

from __future__ import annotations

import math
import random

import pytest

from codex_lab.stats import DID_NOT_LEARN, UNDER_TRAINED, Comparison, judge_trained, noninferiority
from codex_lab.training_state import (DEGRADING, MIN_POINTS, NOT_LEARNED, TRAINED, UNDER_TRAINED_STATE, all_trained,
                                      states_text, training_state)


def _curves(fn, seeds=3, steps=range(0, 1001, 50), noise=0.0, seed=0):
    rng = random.Random(seed)
    return [[(s, fn(s, k) + rng.gauss(0, noise)) for s in steps] for k in range(seeds)]


def test_rising_curve_is_under_trained():
    # loss still falling linearly at the end: 3.0 -> 2.0 over 1000 steps, 0.25/quarter
    st = training_state(_curves(lambda s, k: 3.0 - s / 1000), higher_is_better=False, min_change=0.01)
    assert st.state == UNDER_TRAINED_STATE and not st.trained
    assert st.change == pytest.approx(0.25, rel=1e-9)  # slope 1e-3 x 250 steps


def test_plateaued_curve_is_trained():
    # exponential approach to 2.0 with time constant 100 steps: at 1000 steps the remaining
    # slope is ~4.5e-5/step, 0.011 over a quarter, under a 0.02 tolerance
    st = training_state(_curves(lambda s, k: 2.0 + math.exp(-s / 100)), higher_is_better=False, min_change=0.02)
    assert st.state == TRAINED and st.trained and abs(st.change) < 0.02


def test_noisy_plateau_is_trained_and_noisy_rise_is_not():
    # seeds differ by an offset (levels 0.05 apart, which the rule ignores) and each evaluation is
    # noisy (sd 0.03): a flat curve stays trained at a threshold of 2 x the noise; a clear fall of the
    # loss (0.125 per quarter) is still caught
    flat = _curves(lambda s, k: 2.0 + 0.05 * k, seeds=5, noise=0.03, seed=1)
    st = training_state(flat, higher_is_better=False, min_change=0.06)
    assert st.state == TRAINED and st.bound <= 0.06
    rise = _curves(lambda s, k: 2.5 + 0.05 * k - s / 2000, seeds=5, noise=0.03, seed=2)
    assert training_state(rise, higher_is_better=False, min_change=0.06).state == UNDER_TRAINED_STATE


def test_accuracy_direction_and_degrading():
    acc = _curves(lambda s, k: 0.2 + 0.7 * s / 1000)  # accuracy still climbing
    assert training_state(acc, higher_is_better=True, min_change=0.02).state == UNDER_TRAINED_STATE
    over = _curves(lambda s, k: 2.0 + s / 2000)  # held-out loss rising: over-fitting
    st = training_state(over, higher_is_better=False, min_change=0.01)
    assert st.state == DEGRADING and not st.trained


def test_a_flat_tail_that_dips_by_noise_is_not_degrading():
    """The counterfactual of the case above: the flat curve of lesson 03's reference (g = 2, 4 seeds,
    held-out loss level at 2.90 with evaluation noise ~0.006) whose last evaluations happen to sit
    higher on some seeds has a point slope worse than -threshold, but its bound reaches above zero:
    not credibly worse, and with the bound under the threshold it is trained. The same tail rising for real
    (0.02 per quarter on every seed, same noise) stays degrading."""
    bump = [0.0] * 13 + [0.004, 0.008, 0.012]  # the last three evaluations of every seed sit higher
    jitter = [0.004, -0.006, 0.002, 0.005, -0.003, 0.0, -0.005, 0.006, -0.002, 0.003, -0.004, 0.001, 0.005, -0.006,
              0.002, -0.001]
    noise = [[jitter[(i + 5 * k) % 16] for i in range(16)] for k in range(4)]
    # the seeds disagree, as g = 2's did (projected changes -0.025 to 0.000): two dip hard, one a little, one rises
    dip = [2.2, 1.2, 0.5, -0.6]
    flat = [[(100.0 * i, 2.9 + dip[k] * b + n) for i, (b, n) in enumerate(zip(bump, noise[k]))] for k in range(4)]
    st = training_state(flat, higher_is_better=False, min_change=0.01)
    assert st.change < -0.01 and st.bound > 0 and st.state == TRAINED, st.describe()
    rising = [[(100.0 * i, 2.9 + 0.02 * i / 4 + n) for i, n in enumerate(noise[k])] for k in range(4)]
    st = training_state(rising, higher_is_better=False, min_change=0.01)
    assert st.state == DEGRADING and st.bound < 0, st.describe()


def test_too_few_evaluations_and_divergence():
    few = [[(4 * i, 3.0 - 0.01 * i) for i in range(MIN_POINTS - 1)]] * 3  # one evaluation short of a 5-point tail
    st = training_state(few, higher_is_better=False, min_change=0.01)
    assert st.state == UNDER_TRAINED_STATE and f"at least {MIN_POINTS}" in st.describe()
    st = training_state([[(0, 3.0), (4, float("nan")), (8, 2.8), (12, 2.7), (16, 2.6), (20, 2.5)]] * 3,
                        higher_is_better=False, min_change=0.01)
    assert st.state == DEGRADING and "diverged" in st.describe()


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="min_change"):
        training_state([[1.0, 0.9, 0.8, 0.7, 0.6, 0.5]], higher_is_better=False, min_change=0.0)
    with pytest.raises(ValueError, match="same steps"):
        training_state([[(i, 1.0) for i in range(6)], [(2 * i, 1.0) for i in range(6)]],
                       higher_is_better=False, min_change=0.01)
    with pytest.raises(ValueError, match="no curves"):
        training_state([], higher_is_better=False, min_change=0.01)


def test_states_text_and_all_trained():
    a = training_state(_curves(lambda s, k: 2.0), higher_is_better=False, min_change=0.01, arm="mha")
    b = training_state(_curves(lambda s, k: 3.0 - s / 1000), higher_is_better=False, min_change=0.01, arm="gqa")
    assert all_trained([a]) and not all_trained([a, b]) and not all_trained([])
    assert states_text([a, b]).startswith("mha: trained") and "gqa: under-trained" in states_text([a, b])


def test_an_eight_step_gqa_uptraining_is_under_trained():
    """Today's lesson 03 ran 8 uptraining steps of a 60-step base: the rule must call that under-trained."""
    import torch

    from codex_lab.nn.config import ModelConfig
    from codex_lab.nn.model import CodexModel
    from codex_lab.nn.surgery import mha_to_gqa
    from codex_lab.training.loop import LoopConfig, adamw, run_loop

    torch.manual_seed(0)
    vocab, seq = 64, 32
    # a learnable stream: tokens follow a fixed random permutation, so the loss can fall far
    perm = torch.randperm(vocab)
    start = torch.randint(0, vocab, (4096,))
    data = perm[start]  # next token = perm[current] is learnable from the previous one
    stream = torch.empty(2 * 4096, dtype=torch.long)
    stream[0::2], stream[1::2] = start, data

    def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.randint(0, stream.numel() - seq - 1, (8,), generator=g)
        x = torch.stack([stream[j:j + seq + 1] for j in i.tolist()])
        return x[:, :-1], x[:, 1:]

    val = [batch(torch.Generator().manual_seed(100 + k)) for k in range(2)]

    def held_out(m: CodexModel) -> float:
        with torch.no_grad():
            return sum(float(m(x, targets=y).loss) for x, y in val) / len(val)

    curves = []
    for seed in range(3):
        torch.manual_seed(seed)
        base = CodexModel(ModelConfig(vocab_size=vocab, d_model=32, n_layer=1, n_head=4, n_kv_head=4, max_seq_len=seq))
        g = torch.Generator().manual_seed(seed)
        model = mha_to_gqa(base, 1)
        cfg = LoopConfig(steps=8, lr=3e-3, eval_every=1)
        opt = adamw(model, cfg)
        curve: list[tuple[float, float]] = [(0, held_out(model))]

        def loss_fn(_: int) -> tuple[torch.Tensor, dict[str, float]]:
            x, y = batch(g)
            out = model(x, targets=y)
            return out.loss, {}

        run_loop(loss_fn, opt, cfg,
                 eval_fn=lambda t, row: curve.append((t, held_out(model))), progress=False)
        curves.append(curve)
    st = training_state(curves, higher_is_better=False, min_change=0.01, arm="g=4 after 8 steps")
    # 8 steps of a model that has barely begun: the loss is still falling fast at the end
    assert st.state == UNDER_TRAINED_STATE, st.describe()
    assert st.change > 0.05


def test_flat_at_chance_is_not_a_plateau():
    # recall accuracy flat at chance (1/8) for the whole run: no trend, but nothing learned
    flat = _curves(lambda s, k: 0.125 + 0.005 * k, noise=0.01, seed=3)
    st = training_state(flat, higher_is_better=True, min_change=0.02, chance=0.125, arm="window")
    assert st.state == NOT_LEARNED and "chance" in st.describe() and not st.trained
    learned = _curves(lambda s, k: 0.9 + 0.005 * k, noise=0.01, seed=4)
    assert training_state(learned, higher_is_better=True, min_change=0.02, chance=0.125).state == TRAINED
    # a loss: chance is ln(V); a model at 2.0 nats with V = 64 (ln 64 = 4.16) has learned
    loss = _curves(lambda s, k: 2.0)
    assert training_state(loss, higher_is_better=False, min_change=0.01, chance=math.log(64)).state == TRAINED


def test_falling_seeds_with_levels_apart_are_not_trained():
    """Three seeds each falling 0.08 nats per quarter of the run, their levels 0.15 apart: the old
    rule's tolerance (the level spread / sqrt(seeds), 0.087) called them trained. Every seed still
    moves by more than the claim's smallest change (0.06 here), so the arm is under-trained, in
    every one of 200 noisy draws."""
    for draw in range(200):
        falling = _curves(lambda s, k: 2.0 + 0.15 * k - 0.08 * s / 250, steps=range(0, 1001, 100), noise=0.02,
                          seed=draw)
        st = training_state(falling, higher_is_better=False, min_change=0.06)
        assert st.state == UNDER_TRAINED_STATE, st.describe()
    assert st.change == pytest.approx(0.08, abs=0.04) and len(st.per_seed) == 3


def test_flat_noisy_curves_are_trained_in_95_percent_of_simulations():
    """Truly flat curves, evaluation noise sd 0.02, 11 evaluations, 3 seeds, threshold 0.06 (three
    times the noise): the old 3-point tail fit called such curves under-trained 15-47% of the time.
    The bound is a 95% one-sided bound, so about 5% of flat draws may exceed a threshold near it;
    at 3 x the noise, at least 95% of 1,000 seeded simulations must pass."""
    rng = random.Random(12345)
    trained = 0
    for _ in range(1000):
        flat = [[(s, 1.0 + rng.gauss(0, 0.02)) for s in range(11)] for _ in range(3)]
        trained += training_state(flat, higher_is_better=False, min_change=0.06).trained
    assert trained >= 950, trained


def test_one_seed_at_chance_blocks_the_verdict():
    """The mean of (0.9, 0.9, 0.125) is 0.64, far from chance 0.125; the seed at chance still
    blocks: that arm did not learn the task, and its verdict is "did not learn the task"."""
    seeds = [[(s, v) for s in range(0, 1001, 100)] for v in (0.9, 0.9, 0.125)]
    st = training_state(seeds, higher_is_better=True, min_change=0.02, chance=0.125, arm="window")
    assert st.state == NOT_LEARNED and "seed(s) 2 of 3" in st.describe()
    ok = training_state(seeds[:2] * 2, higher_is_better=True, min_change=0.02, chance=0.125, arm="dense")
    c = Comparison("accuracy", 0.1, 0.05, 0.15, "holds", 3, 3, True)
    assert judge_trained(c, [ok, st]).verdict == DID_NOT_LEARN
    # the counterfactual: the third seed learned too, and the verdict stands
    learned = training_state(seeds[:2] + [seeds[0]], higher_is_better=True, min_change=0.02, chance=0.125)
    assert judge_trained(c, [ok, learned]).verdict == "holds"


def test_a_seed_stuck_far_below_its_siblings_did_not_learn():
    """Lesson 02's window + stride reference: two seeds flat near 0.97 and 0.95, one flat at 0.26
    (above chance 0.125, so the chance rule alone passes it). The same design learned the task on
    the other seeds, so that seed's plateau is a failed optimisation and blocks the verdict. The
    counterfactual: the third seed at 0.90, and the arm is trained."""
    steps = range(0, 3001, 150)
    stuck = [[(s, v) for s in steps] for v in (0.97, 0.26, 0.95)]
    st = training_state(stuck, higher_is_better=True, min_change=0.02, chance=0.125, arm="window+stride")
    assert st.state == NOT_LEARNED and "seed(s) 1 of 3 end at 0.26" in st.describe(), st.describe()
    learned = training_state([stuck[0], [(s, 0.90) for s in steps], stuck[2]], higher_is_better=True,
                             min_change=0.02, chance=0.125, arm="window+stride")
    assert learned.state == TRAINED, learned.describe()
    # the same lagging seed still climbing 0.1 per quarter of the run: late, not failed, so under-trained
    late = [stuck[0], [(s, 0.2 + 0.4 * s / 3000) for s in steps], stuck[2]]
    st = training_state(late, higher_is_better=True, min_change=0.02, chance=0.125, arm="window+stride")
    assert st.state == UNDER_TRAINED_STATE, st.describe()
    # a loss, lower is better, chance ln 512 = 6.24: a seed at 5.9 nats beside two at 3.0 learned ~10% of it
    loss = [[(s, v) for s in steps] for v in (3.0, 5.9, 3.05)]
    assert training_state(loss, higher_is_better=False, min_change=0.01, chance=math.log(512)).state == NOT_LEARNED
    assert training_state([loss[0], loss[2], loss[0]], higher_is_better=False, min_change=0.01,
                          chance=math.log(512)).state == TRAINED


def test_a_plateau_far_below_the_tasks_ceiling_did_not_learn():
    """Accuracy flat at 0.44 where the same task reaches 0.95 elsewhere: a failed optimisation
    shown as a plateau. At 0.80 (over half-way from chance to the ceiling) it is a plateau."""
    low = _curves(lambda s, k: 0.44)
    st = training_state(low, higher_is_better=True, min_change=0.02, chance=0.125, ceiling=0.95)
    assert st.state == NOT_LEARNED and "failed" in st.describe()
    high = _curves(lambda s, k: 0.80)
    assert training_state(high, higher_is_better=True, min_change=0.02, chance=0.125, ceiling=0.95).trained
    with pytest.raises(ValueError, match="chance"):
        training_state(low, higher_is_better=True, min_change=0.02, ceiling=0.95)


def test_the_threshold_is_half_the_claims_margin_when_smaller():
    """A trend of 0.02 per quarter is under min_change 0.05 but over half of a 0.03 margin: trained
    for a claim that cares about 0.05, not for one whose margin is 0.03."""
    slow = _curves(lambda s, k: 3.0 - 0.02 * s / 250)
    assert training_state(slow, higher_is_better=False, min_change=0.05).trained
    st = training_state(slow, higher_is_better=False, min_change=0.05, margin=0.03)
    assert st.state == UNDER_TRAINED_STATE and st.tolerance == pytest.approx(0.015)


def test_judge_trained_holds_each_arm_to_the_comparisons_resolution():
    """An arm trained against min_change may still move by more than half the comparison's margin:
    the verdict is then withheld; with a wider margin the same arms give the verdict."""
    slow = training_state(_curves(lambda s, k: 3.0 - 0.02 * s / 250), higher_is_better=False, min_change=0.05)
    flat = training_state(_curves(lambda s, k: 3.0), higher_is_better=False, min_change=0.05)
    assert slow.trained and flat.trained
    tight = noninferiority([3.0, 3.01, 3.02], [3.0, 3.01, 3.03], margin=0.03, higher_is_better=False)
    assert judge_trained(tight, [flat, slow]).verdict == UNDER_TRAINED
    wide = noninferiority([3.0, 3.01, 3.02], [3.0, 3.01, 3.03], margin=0.2, higher_is_better=False)
    assert judge_trained(wide, [flat, slow]).verdict == "holds"


def test_a_deterministic_plateau_and_a_deterministic_fall():
    """No noise at all: the bound is the trend itself."""
    assert training_state(_curves(lambda s, k: 2.0), higher_is_better=False, min_change=0.01).bound == pytest.approx(0.0)
    st = training_state(_curves(lambda s, k: 3.0 - s / 1000), higher_is_better=False, min_change=0.01)
    assert st.bound == pytest.approx(0.25) and st.per_seed == pytest.approx((0.25,) * 3)


def test_a_flat_tail_at_a_decayed_rate_is_not_a_plateau():
    """Rule 6, both ways: the same flat curves are trained when their tail ran at the peak rate,
    and not when the rate had decayed to a thirtieth of it over the tail (a held lr/30 tail, as
    lesson 04's reference ran: its budget-extension check found such arms still learning)."""
    from codex_lab.training.loop import LoopConfig, rates_at

    steps = list(range(0, 4001, 250))
    flat = [[(s, 3.0 + 0.5 * math.exp(-s / 300)) for s in steps] for _ in range(3)]
    held = rates_at(steps, LoopConfig(steps=4000, lr=1e-2, min_lr=3.3e-4, warmup=100), flat_share=0.25)
    constant = rates_at(steps, LoopConfig(steps=4000, lr=1e-2, warmup=100))
    assert held[-1] == pytest.approx(3.3e-4) and max(held) == pytest.approx(1e-2, rel=1e-2)  # the first evaluation, just past the warm-up
    assert constant[-1] == 1e-2 and len(held) == len(steps)
    st = training_state(flat, higher_is_better=False, min_change=0.01)
    assert st.trained and math.isnan(st.rate_share)  # without rates: the curve alone, rule 6 off
    at_peak = training_state(flat, higher_is_better=False, min_change=0.01, rates=constant)
    assert at_peak.trained and at_peak.rate_share == pytest.approx(1.0)
    decayed = training_state(flat, higher_is_better=False, min_change=0.01, rates=held)
    assert decayed.state == UNDER_TRAINED_STATE and decayed.rate_share < 0.1
    assert "peak learning rate" in decayed.describe() and "budget-extension" in decayed.describe()
    # a falling curve stays under-trained with the plain reason; a degrading one stays degrading
    falling = [[(s, 3.0 - s / 4000) for s in steps] for _ in range(3)]
    assert training_state(falling, higher_is_better=False, min_change=0.01, rates=held).reason == ""
    with pytest.raises(ValueError, match="learning rates for"):
        training_state(flat, higher_is_better=False, min_change=0.01, rates=held[:-1])


@pytest.mark.parametrize("lr", [1e-2, 3e-3, 1e-3, 3e-4, 7e-4])
def test_a_tail_held_at_the_floor_passes_rule_6_and_one_just_below_does_not(lr):
    """The lessons' fixed-budget schedules decay to ``held_floor(lr)`` (half the peak) and hold it:
    a flat curve there is trained, whatever rounding the tail's mean rate picks up; the same curve
    on a schedule whose floor sits 10% lower is not (the rule reads the rate, not the schedule's name)."""
    from codex_lab.training.loop import LoopConfig, rates_at
    from codex_lab.training_state import ANNEALED_SHARE, held_floor

    assert held_floor(lr) == pytest.approx(ANNEALED_SHARE * lr)
    steps = list(range(0, 3001, 150))
    flat = [[(s, 3.0 + 0.5 * math.exp(-s / 300)) for s in steps] for _ in range(3)]
    at_floor = rates_at(steps, LoopConfig(steps=3000, lr=lr, min_lr=held_floor(lr), warmup=100), flat_share=0.25)
    st = training_state(flat, higher_is_better=False, min_change=0.01, rates=at_floor)
    assert st.trained and st.rate_share >= ANNEALED_SHARE
    # the boundary itself: an evaluation at the peak, then every evaluation of the fitted tail (the last 6) on
    # the floor: the tail's mean rate over the peak is 0.5 up to the float sum's rounding, and it passes
    exact = [lr] * (len(steps) - 6) + [held_floor(lr)] * 6
    st = training_state(flat, higher_is_better=False, min_change=0.01, rates=exact)
    assert st.trained and st.rate_share == pytest.approx(0.5, rel=1e-12)
    below = rates_at(steps, LoopConfig(steps=3000, lr=lr, min_lr=0.9 * held_floor(lr), warmup=100), flat_share=0.5)
    assert training_state(flat, higher_is_better=False, min_change=0.01, rates=below).state == UNDER_TRAINED_STATE
    with pytest.raises(ValueError, match="peak_lr"):
        held_floor(0.0)


def test_the_fixed_budget_lessons_hold_half_the_peak_and_judge_on_untuned_seeds():
    """Lessons 02, 03 and 04 decay to half their peak rate in every mode, and their verdict seeds
    never include the seeds their sizes were tuned on (a sizes object that mixes them is refused)."""
    import dataclasses

    from codex_lab.lessons.l02_sparse_attention.experiments import recall_loop
    from codex_lab.lessons.l02_sparse_attention.geometry import config_for
    from codex_lab.lessons.l03_gqa.sizes import protocol_sizes, schedule
    from codex_lab.lessons.l04_moe.protocol import protocol_plan

    for mode in ("fast", "standard", "full"):
        loop = recall_loop(config_for(mode))
        assert loop.min_lr == pytest.approx(loop.lr / 2)
        s = protocol_sizes(mode)
        for phase in ("pretrain", "uptrain"):
            sch = schedule(s, phase)
            assert sch["min_lr"] == pytest.approx(sch["lr"] / 2)
        p = protocol_plan(mode)
        assert p.min_lr == pytest.approx(p.lr / 2)
        for sizes in (config_for(mode), s, p):
            assert not set(sizes.seeds) & set(sizes.tuning_seeds)
            with pytest.raises(ValueError, match="tuned the sizes"):
                dataclasses.replace(sizes, seeds=sizes.tuning_seeds[:1] + tuple(sizes.seeds))
