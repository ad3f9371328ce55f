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
    assert run.extension_steps >= run.steps // 2 and run.confirmed and "less than min_change" in run.describe()


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
    assert run.extension_change > 0.5 and not run.confirmed and "still learning, not confirmed" in run.describe()


def test_an_arm_that_gets_worse_in_the_extension_is_confirmed_past_its_plateau():
    """The other direction: flat, then rising (overfitting) in the extension. More training does not
    help, so the plateau call stands (the rule's job is never to call an improving arm trained)."""
    def fn(s: int) -> float:
        return 3.0 if s <= 1000 else 3.0 + (s - 1000) / 500

    run = train_to_plateau([seed_of(fn) for _ in range(3)], arm="w", chunk=100, max_steps=5000, min_steps=1000,
                           higher_is_better=False, min_change=0.01)
    assert run.state.trained and run.extension_change < -0.5 and run.confirmed
    assert "past its plateau" in run.describe()


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


def test_lm_session_in_chunks_trains_what_one_run_does():
    """LMSession.advance(a); advance(b) == advance(a + b): the same weights and the same curve, so a run
    driven chunk by chunk to its plateau is one run. Warm-up then a constant rate: the rate at step k is
    lr x min(1, (k + 1) / warmup), never decayed (a run can be extended)."""
    import torch

    from codex_lab.nn.config import ModelConfig
    from codex_lab.nn.model import CodexModel
    from codex_lab.training.curves import LMSession, heldout_windows

    tokens = torch.randint(0, 64, (4000,), generator=torch.Generator().manual_seed(1))
    evals = heldout_windows(tokens, 8, 16, seed=0)

    def session() -> LMSession:
        torch.manual_seed(0)
        m = CodexModel(ModelConfig(vocab_size=64, d_model=32, n_layer=1, n_head=2, max_seq_len=64))
        return LMSession(m, tokens, evals, lr=3e-3, warmup=4, batch_size=4, seq_len=16, seed=3, eval_every=5)

    a, b = session(), session()
    curve_a = a.advance(20)
    b.advance(7)
    curve_b = b.advance(13)
    assert [s for s, _ in curve_a] == [0, 5, 10, 15, 20] and curve_a == curve_b
    for (n1, p1), (n2, p2) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    assert a.opt.param_groups[0]["lr"] == 3e-3  # past the warm-up: the full rate, held
    assert curve_a[-1][1] < curve_a[0][1]  # it learned something
    with pytest.raises(ValueError, match="eval_every"):
        LMSession(a.model, tokens, evals, lr=1e-3, warmup=1, batch_size=4, seq_len=16, seed=0, eval_every=0)


def test_a_checkpointed_session_killed_between_chunks_resumes_to_the_unbroken_run(tmp_path):
    """LMSession(checkpoint=...): a run to a plateau stopped mid-way (here: its third chunk raises, as a
    session's end would kill it) and started again on the same file replays the finished chunks without
    training and trains on from the checkpoint: the same steps, curves, decisions, frozen weights and
    extension as one unbroken run. A checkpoint the driver's chunks do not land on is refused by name."""
    import torch

    import codex_lab.training.curves as cv
    from codex_lab.nn.config import ModelConfig
    from codex_lab.nn.model import CodexModel
    from codex_lab.training.curves import LMSession, heldout_windows

    tokens = torch.randint(0, 64, (4000,), generator=torch.Generator().manual_seed(1))
    evals = heldout_windows(tokens, 8, 16, seed=0)

    def sessions(ckpt):
        out = []
        for seed in (0, 1, 2):
            torch.manual_seed(seed)
            m = CodexModel(ModelConfig(vocab_size=64, d_model=16, n_layer=1, n_head=2, max_seq_len=64))
            out.append(LMSession(m, tokens, evals, lr=3e-3, warmup=4, batch_size=4, seq_len=16, seed=seed,
                                 eval_every=5, checkpoint=None if ckpt is None else tmp_path / f"s{seed}.pt"))
        return out

    def drive(ss):
        frozen = {}

        def freeze():
            frozen["at"] = [s.freeze() for s in ss]

        run = train_to_plateau([s.advance for s in ss], arm="a", chunk=10, max_steps=60, higher_is_better=False,
                               min_change=10.0, extend=0.5, before_extension=freeze)
        return run, frozen["at"]

    whole, whole_frozen = drive(sessions(None))
    assert whole.state.state == "trained" and whole.extension_steps > 0  # the path with a freeze and an extension
    real, calls = cv.random_batch, {"n": 0}

    def dying(*a, **k):  # the 65th batch of the checkpointed run kills it (mid-chunk 3 of seed 0)
        calls["n"] += 1
        if calls["n"] == 65:
            raise KeyboardInterrupt("the session ended")
        return real(*a, **k)

    cv.random_batch = dying
    try:
        with pytest.raises(KeyboardInterrupt):
            drive(sessions("ckpt"))
    finally:
        cv.random_batch = real
    assert torch.load(tmp_path / "s0.pt", weights_only=False)["step"] == 20  # two whole chunks kept
    trained = {"n": 0}

    def counting(*a, **k):
        trained["n"] += 1
        return real(*a, **k)

    cv.random_batch = counting
    try:
        resumed, resumed_frozen = drive(sessions("ckpt"))
    finally:
        cv.random_batch = real
    assert trained["n"] < 3 * (whole.steps + whole.extension_steps)  # the kept chunks were replayed, not retrained
    assert (resumed.steps, resumed.state.state, resumed.curves) == (whole.steps, whole.state.state, whole.curves)
    assert resumed.extension_steps == whole.extension_steps and resumed.extended_curves == whole.extended_curves
    for (f1, w1), (f2, w2) in zip(whole_frozen, resumed_frozen):
        assert f1 == f2 and all(torch.equal(w1[k], w2[k]) for k in w1)
    again, again_frozen = drive(sessions("ckpt"))  # everything replayed, the frozen weights from the checkpoint
    assert again.curves == whole.curves and all(torch.equal(a[1][k], b[1][k]) for a, b in zip(again_frozen, whole_frozen)
                                                for k in a[1])
    with pytest.raises(ValueError, match="do not land on"):
        s = sessions("ckpt")[0]
        s.advance(7)
        s.advance(1000)


def test_the_extension_overrules_the_rule_only_when_it_improved_the_arm():
    from codex_lab.stats import TRAINED, UNDER_TRAINED_STATE
    from codex_lab.training.plateau import overruled_by_extension
    from codex_lab.training_state import training_state

    flat = [[(float(s), 2.0) for s in range(0, 220, 20)] for _ in range(3)]
    st = training_state(flat, higher_is_better=False, min_change=0.01, arm="a")
    assert st.state == TRAINED
    kw = dict(steps=200, extension_steps=100, min_change=0.01)
    gained = overruled_by_extension(st, change=0.02, **kw)  # 0.02 better after 100 more steps: still learning
    assert gained.state == UNDER_TRAINED_STATE and "still learning" in gained.reason
    assert overruled_by_extension(st, change=0.005, **kw) is st  # moved less than min_change: confirmed
    assert overruled_by_extension(st, change=-0.05, **kw) is st  # got worse: past its plateau, still trained
    assert overruled_by_extension(st, change=float("nan"), **kw) is st  # no extension ran


def test_the_verdicts_read_a_false_plateau_as_under_trained():
    """PlateauRun.judged, what lessons 02-04 give their verdicts: the rule's "trained" at the
    stopping point stands when the extension confirms it, and turns "under-trained" when the
    extension improved the arm by min_change or more (the false plateau above)."""
    def false_plateau(s: int) -> float:
        return 3.0 if s <= 1000 else 3.0 - (s - 1000) / 500

    kw = dict(arm="j", chunk=100, max_steps=5000, min_steps=1000, higher_is_better=False, min_change=0.01)
    run = train_to_plateau([seed_of(false_plateau) for _ in range(3)], **kw)
    assert run.state.trained and not run.judged.trained and "still learning" in run.judged.reason
    flat = train_to_plateau([seed_of(lambda s: 3.0) for _ in range(3)], **kw)
    assert flat.state.trained and flat.judged is flat.state


def test_confirm_trains_on_past_a_false_plateau_to_the_plateau_the_extension_confirms():
    """confirm=True (lesson 05's protocol): the false plateau of the test above (flat to step 1000,
    then a second phase falling 0.2 per 100 steps to a floor at 2.0) does not stop the arm. The
    extension from step 1000 finds it still learning, so it trains on and is judged again, and it
    stops where the extension confirms, on the lower floor, with the overruled stop recorded. The
    counterfactual is the same curve without confirm: stopped at step 1000, not confirmed."""
    def fn(s: int) -> float:
        return 3.0 if s <= 1000 else max(2.0, 3.0 - (s - 1000) / 500)

    kw = dict(arm="k", chunk=100, max_steps=10_000, min_steps=1000, higher_is_better=False, min_change=0.01)
    scored: list[int] = []
    steps = {"n": 0}

    def counted(fn_):
        adv = seed_of(fn_)

        def advance(n: int):
            steps["n"] += n
            return adv(n)
        return advance

    run = train_to_plateau([counted(fn), seed_of(fn), seed_of(fn)], confirm=True,
                           before_extension=lambda: scored.append(steps["n"]), **kw)
    assert run.false_stops == [1000] and run.steps > 1500 and run.confirmed and run.judged.trained
    assert run.curves[0][-1][1] == 2.0  # compared on the floor, not at the false plateau's 3.0
    assert scored == [1000, run.steps]  # scored again at the new stopping point
    assert "still learning at step 1000" in run.describe()
    plain = train_to_plateau([seed_of(fn) for _ in range(3)], **kw)
    assert plain.steps == 1000 and not plain.confirmed and plain.false_stops == []


def test_confirm_stops_at_the_cap_when_the_extension_keeps_finding_it_learning():
    """An arm that keeps learning in steps: confirm never stops it early and never calls it trained
    past the cap; the last state is the rule's at the cap (under-trained: still falling)."""
    def stairs(s: int) -> float:
        return 5.0 - 0.5 * (s // 400)  # flat stretches long enough for the rule, each followed by a drop

    run = train_to_plateau([seed_of(stairs) for _ in range(3)], arm="s", chunk=100, max_steps=3000, min_steps=300,
                           higher_is_better=False, min_change=0.01, confirm=True)
    assert len(run.false_stops) >= 2 and run.steps <= 3000, run.describe()
    assert not run.judged.trained, run.describe()  # every stop it reached, more training improved it


def test_an_arm_the_rule_stops_as_degrading_is_not_labelled_the_cap():
    """A held-out loss rising from the first judged chunk (no snapshot, so no early stopping): the
    rule stops the arm at 500 steps of a 5,000 cap, and its line says where it stopped, not "(the cap)"."""
    seeds = [seed_of(lambda s, k=k: 2.0 + s / 1000 + 0.01 * k) for k in range(3)]
    run = train_to_plateau(seeds, arm="d", chunk=100, max_steps=5000, min_steps=500, higher_is_better=False,
                           min_change=0.01)
    assert run.state.state == "degrading" and run.steps == 500 and run.reached
    assert "(the cap)" not in run.describe() and run.extension_steps == 0


def test_the_plateau_line_names_the_stops_the_extension_overruled():
    """An arm run with confirm=True lists where the check sent it back to training; without such
    stops the line says nothing of them; at the cap it still says so."""
    from codex_lab.training.plateau import plateau_line
    from codex_lab.training_state import training_state

    st = training_state([[(float(i), 0.5) for i in range(0, 1200, 100)]], higher_is_better=True, min_change=0.02, arm="a")
    common = dict(extension_steps=600, extension_change=0.001, min_change=0.02, higher_is_better=True)
    back = plateau_line("a", st, 1200, reached=True, false_stops=[400, 700], **common)
    assert "still learning at step 400, 700, so it trained on" in back and "(the cap)" not in back
    assert "trained on" not in plateau_line("a", st, 1200, reached=True, **common)
    assert "(the cap)" in plateau_line("a", st, 1200, reached=False, false_stops=[400], **common)
