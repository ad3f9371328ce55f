"""The training-state rule (codex_lab.training_state) on synthetic curves and on a real short run."""

from __future__ import annotations

import math
import random

import pytest

from codex_lab.training_state import DEGRADING, TRAINED, UNDER_TRAINED_STATE, all_trained, states_text, training_state


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
    # seeds differ by an offset (spread 0.05) and each evaluation is noisy (sd 0.03): a flat
    # curve stays trained; a clear rise (0.5 over the run) is still caught
    flat = _curves(lambda s, k: 2.0 + 0.05 * k, seeds=5, noise=0.03, seed=1)
    st = training_state(flat, higher_is_better=False, min_change=0.01)
    assert st.state == TRAINED and st.spread > 0.04
    rise = _curves(lambda s, k: 2.5 + 0.05 * k - s / 2000, seeds=5, noise=0.03, seed=2)
    assert training_state(rise, higher_is_better=False, min_change=0.01).state == UNDER_TRAINED_STATE


def test_accuracy_direction_and_degrading():
    acc = _curves(lambda s, k: 0.2 + 0.7 * s / 1000)  # accuracy still climbing
    assert training_state(acc, higher_is_better=True, min_change=0.02).state == UNDER_TRAINED_STATE
    over = _curves(lambda s, k: 2.0 + s / 2000)  # held-out loss rising: over-fitting
    st = training_state(over, higher_is_better=False, min_change=0.01)
    assert st.state == DEGRADING and not st.trained


def test_too_few_evaluations_and_divergence():
    st = training_state([[(0, 3.0), (4, 2.9), (8, 2.85)]] * 3, higher_is_better=False, min_change=0.01)
    assert st.state == UNDER_TRAINED_STATE and "at least 4" in st.describe()
    st = training_state([[(0, 3.0), (4, float("nan")), (8, 2.8), (12, 2.7)]] * 3, higher_is_better=False,
                        min_change=0.01)
    assert st.state == DEGRADING and "diverged" in st.describe()


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="min_change"):
        training_state([[1.0, 0.9, 0.8, 0.7]], higher_is_better=False, min_change=0.0)
    with pytest.raises(ValueError, match="same steps"):
        training_state([[(0, 1.0), (1, 0.9), (2, 0.8), (3, 0.7)], [(0, 1.0), (2, 0.9), (4, 0.8), (6, 0.7)]],
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
        cfg = LoopConfig(steps=8, lr=3e-3, eval_every=2)
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
    assert st.state == UNDER_TRAINED_STATE and "flat at chance" in st.describe()
    learned = _curves(lambda s, k: 0.9 + 0.005 * k, noise=0.01, seed=4)
    assert training_state(learned, higher_is_better=True, min_change=0.02, chance=0.125).state == TRAINED
    # a loss: chance is ln(V); a model at 2.0 nats with V = 64 (ln 64 = 4.16) has learned
    loss = _curves(lambda s, k: 2.0)
    assert training_state(loss, higher_is_better=False, min_change=0.01, chance=math.log(64)).state == TRAINED


def test_noisy_seeds_do_not_excuse_a_falling_curve():
    # 5 seeds offset by 0.1 each (spread ~0.16) while the mean still falls 0.06 per quarter of the run:
    # the raw spread would call it trained; the standard error of the mean (0.07) is the tolerance, and a
    # fall of 0.1 per quarter exceeds it
    falling = _curves(lambda s, k: 3.0 + 0.1 * k - 0.4 * s / 1000, seeds=5)
    st = training_state(falling, higher_is_better=False, min_change=0.01)
    assert st.spread > 0.15 and st.tolerance == pytest.approx(st.spread / math.sqrt(5))
    assert st.change == pytest.approx(0.1, rel=1e-6) and st.state == UNDER_TRAINED_STATE
