"""Lessons 03 and 04 at each arm's plateau (codex_lab.lessons.l03_gqa.plateau,
codex_lab.lessons.l04_moe.plateau, codex_lab.training.lm_plateau): their verdicts come out
either way on the losses given, an arm off its plateau withholds them, and the reference's
fixed-budget phase is drawn, not judged."""

from __future__ import annotations

import math

import pytest
import torch

from codex_lab.lessons.l03_gqa.plateau import GroupArm, PlateauPlan, plateau_verdicts
from codex_lab.lessons.l04_moe import plateau as p4p
from codex_lab.lessons.l04_moe.protocol import QUALITY_ARMS, protocol_plan
from codex_lab.reference import rejudge
from codex_lab.training_state import TrainingState

BASE = [3.10, 3.20, 3.15, 3.05]  # four seeds' held-out losses (nats/token)
# seed-to-seed jitter of a paired cost: +-0.004 nats, far inside the 0.05 margin and far from it
JITTER = [0.004, -0.003, 0.002, -0.004]


def state(arm: str, trained: bool = True) -> TrainingState:
    return TrainingState(arm, "trained" if trained else "under-trained", 0.001, 0.01, 0.0, 3.0, 4, 20, 1000.0)


def group(g: int, cost: float, trained: bool = True) -> GroupArm:
    final = [b + cost + (j if g != 1 else 0.0) for b, j in zip(BASE, JITTER)]
    return GroupArm(g, [], state(f"uptrained g={g}", trained), 1000, True, final, final)


@pytest.mark.parametrize("cost, verdict", [(0.0, "holds"), (0.20, "fails")])
def test_the_gqa_plateau_verdict_comes_out_either_way(cost, verdict):
    """g = 4 costing nothing against the MHA control holds non-inferiority at 0.05; costing 0.2
    nats/token fails it: the same code, the input flipped."""
    arms = {1: group(1, 0.0), 2: group(2, 0.0), 4: group(4, cost), 8: group(8, 0.3)}
    v = plateau_verdicts(arms)
    assert v.primary.verdict == verdict, v.primary.describe()
    assert set(v.secondary) == {"uptrained g=2", "uptrained g=8"}


def test_an_arm_off_its_plateau_withholds_the_gqa_verdict():
    arms = {1: group(1, 0.0), 4: group(4, 0.0, trained=False)}
    assert "no verdict" in plateau_verdicts(arms).primary.verdict


def test_the_gqa_plan_names_what_it_needs():
    with pytest.raises(ValueError, match="MHA control"):
        PlateauPlan(chunk=100, min_steps=300, max_steps=8000, groups=(2, 4, 8))
    with pytest.raises(ValueError, match="chunk"):
        PlateauPlan(chunk=100, min_steps=9000, max_steps=8000)


def moe_arm(arm: str, shift: float, trained: bool = True) -> p4p.ArmPlateau:
    final = [b + shift + (j if arm != "dense_active" else 0.0) for b, j in zip(BASE, JITTER)]
    return p4p.ArmPlateau(arm, [], state(arm, trained), 4000, True, final, 1000)


@pytest.mark.parametrize("moe_shift, verdict", [(-0.10, "holds"), (+0.10, "fails")])
def test_the_moe_plateau_primary_comes_out_either_way(moe_shift, verdict):
    """MoE 0.1 nats/token below the equal-active dense model: "holds"; 0.1 above: the claim fails."""
    plan = protocol_plan("fast")
    arms = {"dense_active": moe_arm("dense_active", 0.0), "moe": moe_arm("moe", moe_shift),
            "dense_total": moe_arm("dense_total", -0.12)}
    v = p4p.plateau_verdicts(arms, plan)
    assert v.primary.verdict == verdict, v.primary.describe()
    rows = p4p.arm_rows(arms, plan.seeds)
    assert len(rows) == 2 + len(QUALITY_ARMS) + 2 and "| moe | 1,000 | 4000 |" in rows[3]


def test_an_moe_arm_off_its_plateau_withholds_its_verdicts():
    plan = protocol_plan("fast")
    arms = {"dense_active": moe_arm("dense_active", 0.0), "moe": moe_arm("moe", -0.1, trained=False),
            "dense_total": moe_arm("dense_total", -0.12)}
    v = p4p.plateau_verdicts(arms, plan)
    assert "no verdict" in v.primary.verdict and "no verdict" in v.keeps_big.verdict
    with pytest.raises(ValueError, match="missing"):
        p4p.plateau_verdicts({"moe": arms["moe"]}, plan)


def test_a_tiny_moe_arm_trains_to_its_cap_and_reports_its_steps():
    """End to end on a tiny geometry: the arm trains its seeds in lockstep to the cap, its curves
    hold every evaluation, and the MoE layers carry the plan's bias-update rate."""
    from dataclasses import replace

    from codex_lab.lessons.l04_moe.protocol import arm_configs

    plan = replace(protocol_plan("fast"), d_model=16, n_head=2, n_experts=4, top_k=2, expert_hidden=8, seq_len=16,
                   batch_size=4, eval_batches=1, eval_batch_size=4, warmup=2)
    stop = p4p.StopPlan(eval_every=2, chunk=4, min_steps=4, max_steps=8, extend=0.0)
    g = torch.Generator().manual_seed(0)
    train, val = torch.randint(0, 64, (4000,), generator=g), torch.randint(0, 64, (1000,), generator=g)
    configs = arm_configs(64, d_model=16, n_layer=1, n_head=2, n_experts=4, top_k=2, expert_hidden=8, max_seq_len=16)
    r = p4p.arm_unit("moe", configs=configs, plan=plan, stop=stop, train=train, val=val)
    assert r.steps <= 8 and len(r.curves) == len(plan.seeds) and [s for s, _ in r.curves[0]][:3] == [0.0, 2.0, 4.0]
    assert all(math.isfinite(v) and v > 0 for v in r.final) and r.active_params > 0
    # the router's load at the stopping point, per seed: between even (1.0) and every token on top_k experts (E / k)
    assert len(r.load) == len(plan.seeds) and all(1.0 <= x <= 4 / 2 + 1e-6 for x in r.load)
    dense = p4p.arm_unit("dense_active", configs=configs, plan=plan, stop=stop, train=train, val=val)
    assert dense.load == []  # no router, no load
    with pytest.raises(ValueError, match="multiple of eval_every"):
        p4p.StopPlan(eval_every=3, chunk=4, min_steps=4, max_steps=8)


def test_a_fixed_budget_phase_is_drawn_not_judged():
    """The reference names its pre-training "unjudged": the rule judges every other curve, and
    naming a curve the data does not hold is an error, not a silent skip."""
    falling = [[[float(s), 5.0 - s / 100] for s in range(0, 1000, 50)] for _ in range(3)]
    flat = [[[float(s), 3.0 + 0.001 * k] for s in range(0, 1000, 50)] for k in range(3)]
    data = {"metric": {"higher_is_better": False, "min_change": 0.01},
            "curves": {"pre-training": falling, "arm": flat}}
    assert [s.arm for s in rejudge(data)] == ["pre-training", "arm"]
    assert [s.arm for s in rejudge({**data, "unjudged": ["pre-training"]})] == ["arm"]
    from codex_lab.errors import InputError

    with pytest.raises(InputError, match="unjudged"):
        rejudge({**data, "unjudged": ["warm-up"]})


def test_a_recall_session_in_chunks_resumes_to_the_unbroken_run(tmp_path):
    """Lesson 02's session: two chunks train what one run of their sum does, and a session built
    on a checkpoint written between them replays the first and trains the second to the same
    numbers (a reference run stopped by a session's end resumes without changing its result)."""
    from dataclasses import replace as dc_replace

    from codex_lab.lessons.l02_sparse_attention.geometry import arms_for, fast_config
    from codex_lab.lessons.l02_sparse_attention.plateau import RecallSession

    cfg = dc_replace(fast_config(), warmup=4, eval_every=4, eval_sequences=8, batch=4)
    patterns = arms_for("fast", cfg.n_layer, cfg)["window+stride"]
    whole = RecallSession(patterns, cfg, 10).advance(8)
    first = RecallSession(patterns, cfg, 10, checkpoint=tmp_path / "s.pt")
    first.advance(4)
    resumed = RecallSession(patterns, cfg, 10, checkpoint=tmp_path / "s.pt")
    assert resumed.advance(4) == first.held_out()  # replayed, not trained
    assert [s for s, _ in whole] == [0.0, 4.0, 8.0]
    assert resumed.advance(4) == whole  # trained on from the checkpoint: the unbroken run's numbers
    other = RecallSession(patterns, cfg, 10, checkpoint=tmp_path / "s.pt")  # the checkpoint holds step 8
    other.advance(5)  # replayed
    with pytest.raises(ValueError, match="do not land"):
        other.advance(5)  # 5 + 5 crosses step 8 off a chunk boundary: other chunks than the run's


def test_the_capstone_report_sets_this_run_beside_the_reference_and_says_whether_it_stands(monkeypatch):
    """Lesson 08's report: per design, the shipped reference's verdict beside this run's, "agrees"
    or "differs"; a design's reference verdict is the claim's only while both arms it compares (the
    design and the plain model) are at their plateau and confirmed by the extension check: an
    unconfirmed design blocks its own line, an unconfirmed plain model blocks every line."""
    from codex_lab.lessons.l08_capstone import trade_table as tt
    from codex_lab.stats import noninferiority

    plain = BASE
    live = {"gqa4": noninferiority(plain, [x + 0.01 + j for x, j in zip(plain, JITTER)], margin=0.05, paired=True,
                                   higher_is_better=False),
            "gqa8": noninferiority(plain, [x + 0.3 + j for x, j in zip(plain, JITTER)], margin=0.05, paired=True,
                                   higher_is_better=False)}
    monkeypatch.setattr(tt, "trade_costs", lambda res: live)
    flat = [[[float(s), 3.0 + 0.001 * k] for s in range(0, 1000, 50)] for k in range(3)]
    arms = ("plain (baseline)", "GQA g=4", "GQA g=8")
    data = {"metric": {"higher_is_better": False, "min_change": 0.01}, "curves": {a: flat for a in arms},
            "primary": {k: {"verdict": "holds", "diff": 0.01, "lo": 0.0, "hi": 0.02} for k in live},
            "extension": {a: {"confirmed": True} for a in arms}, "seeds": [10, 11, 12], "tuning_seeds": [0, 1, 2]}
    prov = {"commit": "abc", "command": "c", "machine": "m", "date": "d", "duration_s": 60.0, "mode": "article"}
    lines = tt.reference_agreement(None, ref={"provenance": prov, "data": data})
    assert lines[0].startswith("The claims' verdicts are the shipped reference run's")
    assert "(stands); this run agrees" in lines[2] and "(stands); this run differs (fails)" in lines[3], lines
    data["extension"]["GQA g=8"]["confirmed"] = False  # the reference's own check found an arm still learning
    lines = tt.reference_agreement(None, ref={"provenance": prov, "data": data})
    assert lines[0].startswith("Per design") and "(stands)" in lines[2], lines
    assert "does not stand: GQA g=8 still learning in its extension check" in lines[3], lines[3]
    data["extension"]["plain (baseline)"]["confirmed"] = False  # the baseline every verdict compares with
    lines = tt.reference_agreement(None, ref={"provenance": prov, "data": data})
    assert "do not stand either" in lines[0] and all("does not stand" in x for x in lines[2:]), lines
    # a run judged on the seeds that tuned its sizes (or that records no seeds) gives no claim its verdict
    data["extension"] = {a: {"confirmed": True} for a in arms}
    for seeds in ([0, 1, 2], None):
        lines = tt.reference_agreement(None, ref={"provenance": prov, "data": {**data, "seeds": seeds}})
        assert "do not stand either" in lines[0] and all("does not stand" in x for x in lines[2:]), lines
        assert ("both tuned and judged" if seeds else "not pre-registered") in lines[2], lines[2]


def test_lesson_02s_plateau_verdict_flips_with_far_accuracy_and_waits_for_every_arm():
    """Lesson 02's arms at their plateau: window+stride as good as dense on the far distances
    holds non-inferiority (the window alone at chance shows the task needs far links); at chance
    itself it fails; an arm its run left under-trained withholds the verdict."""

    from codex_lab.lessons.l02_sparse_attention.experiments import RecallRun
    from codex_lab.lessons.l02_sparse_attention.geometry import fast_config
    from codex_lab.lessons.l02_sparse_attention.plateau import PatternArm, plateau_judge

    cfg = fast_config()
    near, far = [d for d in cfg.task.distances if d <= cfg.reach], [d for d in cfg.task.distances if d > cfg.reach]

    def arm(name: str, far_acc: float, trained: bool = True) -> PatternArm:
        runs = []
        for k, j in enumerate((0.01, -0.012, 0.006)):  # per seed: levels and a little seed noise
            j += 0.004 * ((k + len(name)) % 3 - 1)  # each arm's own noise: the paired differences vary
            acc = {**{str(d): 0.95 + j for d in near}, **{str(d): far_acc + j for d in far}}
            level = sum(acc.values()) / len(acc)
            curve = [(float(s), level + 0.0005 * ((s // 60 + k) % 3 - 1)) for s in range(0, 1260, 60)]
            runs.append(RecallRun(acc, curve, [], 0.0))
        return PatternArm(name, runs, state(name, trained), 1200, True)

    def arms(stride_far: float, stride_trained: bool = True) -> dict:
        return {"dense": arm("dense", 0.9), "window": arm("window", 0.13),
                "window+stride": arm("window+stride", stride_far, stride_trained),
                "dense early, sparse deep": arm("dense early, sparse deep", 0.9),
                "sparse early, dense deep": arm("sparse early, dense deep", 0.5)}

    assert plateau_judge(arms(0.9), cfg).stride.verdict == "holds"
    assert plateau_judge(arms(0.13), cfg).stride.verdict == "fails"
    assert "no verdict" in plateau_judge(arms(0.9, stride_trained=False), cfg).stride.verdict


def balance_arm(arm: str, load: float, trained: bool = True) -> p4p.ArmPlateau:
    return p4p.ArmPlateau(arm, [], state(arm, trained), 4000, True, [3.0] * 4, 1000,
                          load=[load + j for j in JITTER])


@pytest.mark.parametrize("none_load, verdict", [(3.2, "fails as stated"), (1.2, "holds")])
def test_the_load_claim_at_the_plateau_comes_out_either_way(none_load, verdict):
    """"MoE layers as described (no balancing)": the unbalanced router at 3.2x the mean load fails
    as stated (limit 1.5x) and the text names the balancing that held; at 1.2x the claim holds."""
    arms = {"moe_none": balance_arm("moe_none", none_load), "moe_bias": balance_arm("moe_bias", 1.1),
            "moe": balance_arm("moe", 1.3)}
    v, text = p4p.plateau_balance(arms)
    assert v == verdict, text
    if verdict == "fails as stated":
        assert "what holds is an MoE layer with Switch aux loss or bias balancing" in text


def test_the_load_claim_waits_for_every_balance_arm_to_train():
    arms = {"moe_none": balance_arm("moe_none", 3.2), "moe_bias": balance_arm("moe_bias", 1.1, trained=False),
            "moe": balance_arm("moe", 1.3)}
    v, text = p4p.plateau_balance(arms)
    assert "no verdict" in v and "moe_bias" in text
    with pytest.raises(ValueError, match="moe_bias"):
        p4p.plateau_balance({"moe_none": arms["moe_none"], "moe": arms["moe"]})
