"""Training an arm to its plateau (codex_lab.training.plateau) on synthetic seeds."""

from __future__ import annotations

import math

import pytest

from codex_lab.training.plateau import train_to_plateau


def seed_of(fn, every: int = 10):
    """An advance(n) over a synthetic curve: value fn(step), evaluated every ``every`` steps."""
    state = {"step": 0, "curve": [(0.0, fn(0))]}

    def advance(n: int):
        for s in range(state["step"] + every, state["step"] + n + 1, every):
            state["curve"].append((float(s), fn(s)))
        state["step"] += n
        return list(state["curve"])

    return advance


def test_an_arm_stops_at_its_plateau_and_the_extension_confirms_it():
    """Loss 2 + e^(-s/200): the rule calls it trained once the projected change over another
    quarter falls under 0.01; training half as long again moves it by less than 0.01."""
    seeds = [seed_of(lambda s, k=k: 2.0 + 0.01 * k + math.exp(-s / 200)) for k in range(3)]
    run = train_to_plateau(seeds, arm="a", chunk=100, max_steps=20_000, higher_is_better=False, min_change=0.01)
    assert run.reached and run.state.trained and 500 <= run.steps <= 3000, run.describe()
    assert run.extension_steps >= run.steps // 2 and run.confirmed and "within" in run.describe()


def test_a_still_falling_arm_stops_at_the_cap_unconfirmed():
    seeds = [seed_of(lambda s, k=k: 5.0 - s / 1000 + 0.01 * k) for k in range(3)]
    run = train_to_plateau(seeds, arm="b", chunk=100, max_steps=1000, higher_is_better=False, min_change=0.01)
    assert not run.reached and run.steps == 1000 and run.state.state == "under-trained"
    assert run.extension_steps == 0 and not run.confirmed and "(the cap)" in run.describe()


def test_the_extension_catches_a_false_plateau():
    """The counterfactual: a curve flat long enough for the rule, then falling again (a second
    phase of learning), moves by more than min_change in the extension: not confirmed."""
    def fn(s: int) -> float:
        return 3.0 if s <= 1000 else 3.0 - (s - 1000) / 500

    run = train_to_plateau([seed_of(fn) for _ in range(3)], arm="c", chunk=100, max_steps=5000, min_steps=1000,
                           higher_is_better=False, min_change=0.01)
    assert run.state.trained and run.steps == 1000
    assert run.extension_change > 0.5 and not run.confirmed and "beyond" in run.describe()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="one advance"):
        train_to_plateau([], arm="x", chunk=10, max_steps=100, higher_is_better=False, min_change=0.01)
    with pytest.raises(ValueError, match="chunk"):
        train_to_plateau([seed_of(lambda s: 1.0)], arm="x", chunk=100, max_steps=10, higher_is_better=False,
                         min_change=0.01)


def test_an_arm_that_overfits_is_compared_at_its_best_checkpoint():
    """Loss falls to a minimum at step 400 then rises (a small task over-fitting): the rule says
    "degrading"; with snapshot/restore the arm goes back to its best chunk end and is trained
    there (early stopping on validation). Without them it stays degrading (the counterfactual)."""
    def fn(s: int) -> float:
        return 2.0 + ((s - 400) / 400) ** 2

    snaps, restored = [], []
    seeds = [seed_of(fn) for _ in range(3)]
    run = train_to_plateau(seeds, arm="small", chunk=100, max_steps=3000, min_steps=300, higher_is_better=False,
                           min_change=0.01, snapshot=lambda: len(snaps) or snaps.append(1) or len(snaps),
                           restore=restored.append)
    assert run.state.trained and run.best_step == 400 and restored and "past its best" in run.state.describe()
    assert run.extension_steps == 0 and "best checkpoint, step 400" in run.describe()
    plain = train_to_plateau([seed_of(fn) for _ in range(3)], arm="small", chunk=100, max_steps=3000, min_steps=300,
                             higher_is_better=False, min_change=0.01)
    assert plain.state.state == "degrading" and plain.best_step is None
