"""Lesson 05's pretrained-base protocol: every arm to its plateau, the claimed size tested."""

from __future__ import annotations

import math

import pytest

from codex_lab.lessons.l05_multitask import pretrained as pt
from codex_lab.lessons.l05_multitask import finetune_setup as fs
from codex_lab.stats import FAILS, FAILS_AS_STATED, HOLDS, NOT_RESOLVED, UNDER_TRAINED, compare

TINY = fs.PlateauSetup(large_n=12, small_n=3, d_model=16, n_layer=1, n_head=2, vocab=384, max_len=160, base_steps=4,
                       base_batch=2, base_seq=32, base_files=3, batch_size=2, eval_every=2, chunk=4, min_steps=4,
                       max_steps=8, per_family=1, val_per_task=2, max_new_tokens=8, extend=0.5)


def test_families_render_disjoint_programs_of_the_declared_sizes():
    ts = pt.sized_taskset(fs.setup_for("fast"))
    s = fs.setup_for("fast")
    uids = {f: {e.func for e in d["train"]} for f, d in ts.examples.items()}  # func: the program's uid
    assert {f: len(u) for f, u in uids.items()} == s.sizes() and s.sizes()["completion"] > s.sizes()["bugfix"]
    fams = list(uids)
    assert all(not uids[a] & uids[b] for i, a in enumerate(fams) for b in fams[i + 1:]), "a program is shared"
    with pytest.raises(ValueError, match="training programs"):
        pt.sized_taskset(fs.PlateauSetup(large_n=10_000))


def test_verdict_seeds_are_not_the_tuning_seeds():
    for mode in ("fast", "standard", "reference", "full"):
        s = fs.setup_for(mode)
        assert not set(s.seeds) & set(s.tuning_seeds) and len(s.seeds) >= 3
    with pytest.raises(ValueError, match="tune and judge"):
        fs.PlateauSetup(seeds=(0, 5, 6))


def test_the_size_verdict_flips_with_the_gain():
    """The same rule gives every verdict: a relative gain inside 8-15% holds; +40% (the sign
    holds, the size does not) fails as stated, and so does +2%; a loss fails; noise is not
    resolved; an arm off its plateau gives no verdict."""
    a = [0.30, 0.32, 0.31, 0.29, 0.30]

    def verdict(rel, jitter=0.002):
        b = [x * (1 + rel) + jitter * (-1) ** i for i, x in enumerate(a)]
        return pt.relative_gain_verdict(a, b, compare(a, b, paired=True))

    gain, v = verdict(0.11)
    assert v == HOLDS and 0.08 < gain["mean"] < 0.15 and pt.size_position(gain) == "inside the stated 8-15%"
    assert verdict(0.40)[1] == FAILS_AS_STATED and pt.size_position(verdict(0.40)[0]) == "above the stated 8-15%"
    assert verdict(0.02, 0.0005)[1] == FAILS_AS_STATED
    assert verdict(-0.2)[1] == FAILS
    noisy = [0.30, 0.36, 0.25, 0.33, 0.27]
    assert pt.relative_gain_verdict(a, noisy, compare(a, noisy, paired=True))[1] == NOT_RESOLVED
    c = compare(a, [x * 1.11 for x in a], paired=True)
    from dataclasses import replace
    assert pt.relative_gain_verdict(a, a, replace(c, verdict=UNDER_TRAINED))[1] == UNDER_TRAINED


def test_the_smallest_detectable_effect_shrinks_with_problems_and_seeds():
    small = pt.detectable_effect(fs.setup_for("fast"))
    big = pt.detectable_effect(fs.setup_for("reference"))
    # the reference scores every test problem of the split: 200 per family, 5 families, 3 seeds
    assert big["absolute"] < small["absolute"] and big["problems"] == 200 * 5 and math.isclose(big["p"], 0.3)
    # two-sided 5%, 80% power, paired over 3 seeds: (t_.975,2 + t_.80,2) x sqrt(2 x 0.3 x 0.7 / 1000) / sqrt(3)
    assert math.isclose(big["absolute"], (4.3027 + 1.0607) * math.sqrt(2 * 0.21 / 1000) / math.sqrt(3), rel_tol=1e-3)
    # the corpus base's first reference scored 48 problems per family: a wider detectable effect
    assert pt.detectable_effect(fs.setup_for("reference-corpus"))["absolute"] > big["absolute"]


def test_a_tiny_protocol_runs_every_arm_and_withholds_the_verdicts(tmp_path, monkeypatch):
    """Every arm of a tiny run, in this process: the rule withholds both verdicts (8 steps cannot
    plateau), each arm records its compute; the base is cached and reused."""
    monkeypatch.setenv("CODEX_LAB_CACHE", str(tmp_path))
    res = pt.run_protocol(TINY, jobs=1)
    assert set(res.arms) == {*(f"single-task:{f}" for f in TINY.families), "naive", "coba", "task_token"}
    assert all(r["steps"] == 8 and not r["reached"] and len(r["scores"]) == 3 for r in res.arms.values())
    c, gain, v = res.size_claim()
    assert v == UNDER_TRAINED and res.small_claim().verdict == UNDER_TRAINED
    assert all("steps per seed (the cap)" in line for line in res.compute_lines())
    assert len(list((tmp_path / "l05_base").glob("*.safetensors"))) == 1
    again = pt.PlateauResults.from_json(res.to_json())
    assert again.setup == TINY and again.size_claim()[2] == v


def test_arms_at_the_benchmarks_floor_did_not_learn_the_task():
    """Both arms under 10% pass@1: no verdict ("did not learn the task"), whatever the interval;
    the counterfactual: one arm in the benchmark's band and the comparison keeps its verdict."""
    low_a, low_b = [0.02, 0.03, 0.02], [0.06, 0.07, 0.08]
    c = compare(low_a, low_b, paired=True)
    assert c.verdict == HOLDS and pt.floor_verdict(c, low_a, low_b).verdict == "did not learn the task: no verdict"
    hi_b = [0.30, 0.32, 0.31]
    c2 = compare(low_a, hi_b, paired=True)
    assert pt.floor_verdict(c2, low_a, hi_b).verdict == HOLDS


def test_the_budget_extension_check_overrules_a_plateau_that_still_improves():
    """On the shipped reference's own arms: the small-tasks verdict is given on trained arms whose
    extension did not improve them by min_change. The input that flips it: the balanced arm's
    extension improving its validation loss by 0.05 nats (>= min_change 0.03) makes it under-trained,
    and the verdict is withheld; an extension that made it worse (past its plateau) leaves it standing."""
    import copy

    from codex_lab.lessons.l05_multitask.report import reference_results
    from codex_lab.reference import load_reference

    ref = load_reference("l05_plateau_iid")
    if ref is None:
        pytest.skip("no shipped lesson 05 plateau reference")
    d = copy.deepcopy(ref["data"])
    res = reference_results(d)
    prim = res.primary
    shipped = res.small_claim()
    assert res.states()[prim].trained and shipped.verdict not in (UNDER_TRAINED,)
    res.arms[prim]["extension_change"] = -0.2  # worse after more training: confirmed past its plateau
    assert res.states()[prim].trained and res.small_claim().verdict == shipped.verdict
    res.arms[prim]["extension_change"] = 0.05  # better by more than min_change: it was still learning
    st = res.states()[prim]
    assert not st.trained and "still learning" in st.describe()
    assert res.small_claim().verdict == UNDER_TRAINED


def test_the_other_splits_shipped_references_are_tabled_beside_the_live_split(monkeypatch):
    """A shipped plateau reference of another split gets its row (both claims' verdicts and
    intervals, the arms the rule calls trained); the live split's own and an unshipped split's do not."""
    import codex_lab.reference as reference
    from codex_lab.lessons.l05_multitask.report import plateau_split_lines

    iid = reference.load_reference("l05_plateau_iid")
    assert iid is not None
    shipped = {"l05_plateau_iid": iid, "l05_plateau_compose": iid}
    monkeypatch.setattr(reference, "load_reference", lambda name: shipped.get(name))
    lines = plateau_split_lines("iid")
    rows = [line for line in lines if line.startswith("| compose |")]
    assert len(rows) == 1 and not any(line.startswith(("| iid |", "| length |")) for line in lines)
    assert iid["data"]["small"]["verdict"] in rows[0] and f"{iid['data']['small']['diff']:+.3f}" in rows[0]
    assert plateau_split_lines("compose")[2].startswith("| split |")  # iid is then the other split
    monkeypatch.setattr(reference, "load_reference", lambda name: None)
    assert plateau_split_lines("iid") == []


def test_the_family_table_gives_each_arms_pass_at_1_per_family():
    """One row per arm (the specialists together, each on its own family), one column per family,
    each cell the arm's mean pass@1 over seeds on that family (PlateauResults.values)."""
    import json
    import statistics

    from codex_lab.lessons.l05_multitask.report import reference_results
    from codex_lab.reference import REFERENCE_DIR

    d = json.loads((REFERENCE_DIR / "l05_plateau_iid.json").read_text())["data"]
    res = reference_results(d)
    rows = res.family_table()
    body = [r for r in rows if r.startswith("| ") and not r.startswith(("| arm", "|---"))]
    assert [r.split(" | ")[0][2:] for r in body] == ["single-task (each its own family)", "naive", "coba", "task_token"]
    naive = body[1].strip("| ").split(" | ")[1:]
    for f, cell in zip(res.setup.families, naive):
        assert float(cell) == round(statistics.fmean(res.values("naive", [f])), 3)
    # without every specialist there is no single-task row
    partial = pt.PlateauResults(res.setup, {a: r for a, r in res.arms.items() if a != "single-task:fim"})
    assert not any("single-task" in r for r in partial.family_table())
