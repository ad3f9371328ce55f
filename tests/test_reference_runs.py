"""Reference runs: resumable units, provenance, shipped data (codex_lab.reference)."""

from __future__ import annotations

import json

import pytest

from codex_lab.errors import InputError
from codex_lab.reference import (REQUIRED_PROVENANCE, ResumableRun, describe_provenance, load_reference, provenance, shown_path,
                                 save_reference)


def test_a_stopped_run_resumes_without_redoing_finished_units(tmp_path):
    calls = []

    def unit(k):
        def fn():
            calls.append(k)
            if k == "b/1" and len(calls) == 2:
                raise KeyboardInterrupt  # the session ends in the middle of the second unit
            return {"final": k}
        return fn

    run = ResumableRun(tmp_path / "state.json", {"steps": 100, "arms": ("a", "b")})
    assert run.run("a/0", unit("a/0")) == {"final": "a/0"}
    with pytest.raises(KeyboardInterrupt):
        run.run("b/1", unit("b/1"))
    # a new process: the finished unit is read back, the interrupted one runs again
    again = ResumableRun(tmp_path / "state.json", {"steps": 100, "arms": ["a", "b"]})
    assert again.run("a/0", unit("a/0")) == {"final": "a/0"} and calls == ["a/0", "b/1"]
    assert again.run("b/1", unit("b/1")) == {"final": "b/1"} and calls == ["a/0", "b/1", "b/1"]
    assert set(json.loads((tmp_path / "state.json").read_text())["units"]) == {"a/0", "b/1"}
    assert not list(tmp_path.glob("*.tmp"))
    # the commit that started the run survives the resume (the provenance names the code that ran the first unit)
    started = run.commit
    assert started != "" and again.commit == started == json.loads((tmp_path / "state.json").read_text())["commit"]
    # another configuration cannot be mixed into the same file
    with pytest.raises(InputError, match="another configuration"):
        ResumableRun(tmp_path / "state.json", {"steps": 200, "arms": ["a", "b"]})


def test_a_state_path_is_shipped_relative_to_the_repository_or_without_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    repo = tmp_path / "repo"
    assert shown_path(repo / "scripts" / "reference_runs" / "l04.json", repo) == "scripts/reference_runs/l04.json"
    # outside the repository: the home folder is not shipped
    assert shown_path(tmp_path / "home" / ".cache" / "s.json", repo) == "~/.cache/s.json"
    assert shown_path("/elsewhere/s.json", repo) == "/elsewhere/s.json"


def test_reference_data_carries_its_provenance(tmp_path):
    prov = provenance("codex-lab report --mode full --sections 03", 7260.0, "full")
    assert set(REQUIRED_PROVENANCE) <= set(prov) and prov["duration_s"] == 7260.0
    path = save_reference("l03", {"curves": {"g=1": [[[0, 3.0], [10, 2.0]]]}}, prov, directory=tmp_path)
    ref = load_reference("l03", directory=tmp_path)
    assert ref is not None and ref["data"]["curves"]["g=1"][0][1] == [10, 2.0]
    assert "2.0 h of compute" in describe_provenance(ref) and "--sections 03" in describe_provenance(ref)
    assert load_reference("l99", directory=tmp_path) is None
    with pytest.raises(InputError, match="provenance lacks"):
        save_reference("bad", {}, {"command": "x"}, directory=tmp_path)
    path.write_text(json.dumps({"provenance": {"command": "x"}, "data": {}}))
    with pytest.raises(InputError, match="without provenance"):
        load_reference("l03", directory=tmp_path)


def test_lesson_05_shows_a_shipped_reference_labelled_as_such(monkeypatch):
    """The report's lesson 05 prints every shipped reference split beside its own figures: a
    per-split summary of the primary verdicts, then each split's provenance, states and verdicts;
    nothing without one, nor in full mode."""
    import codex_lab.reference as ref_mod
    from codex_lab.lessons.l05_multitask.report import reference_lines

    monkeypatch.setattr(ref_mod, "load_reference", lambda name, **kw: None)
    assert reference_lines("standard") == []
    prov = ref_mod.provenance("python scripts/reference_l05.py", 1234.0, "converge")

    def fake(split, verdict):
        return {"provenance": prov, "data": {
            "setup": "2 layers", "table": f"TABLE {split}", "audit": "AUDIT", "states": {"coba": "coba: trained (...)"},
            "trained": {"coba": True, "single-task": False}, "primary_arm": "coba",
            "primary": {"describe": f"coba - single-task ... -> {verdict}", "verdict": verdict, "diff": 0.2, "lo": 0.1,
                        "hi": 0.3},
            "naive_vs_primary": "coba - naive ... -> not resolved (x)"}}

    shipped = {"l05_converge_iid": fake("iid", "holds"), "l05_converge_compose": fake("compose", "fails")}
    seen = []
    monkeypatch.setattr(ref_mod, "load_reference", lambda name, **kw: seen.append(name) or shipped.get(name))
    text = "\n".join(reference_lines("standard"))
    assert seen == ["l05_converge_iid", "l05_converge_length", "l05_converge_compose"]
    assert "shipped, not this run" in text and "python scripts/reference_l05.py --split compose" in text and "21 min" in text
    assert "TABLE iid" in text and "TABLE compose" in text and "length" not in text.split("| split |")[1].split("####")[0]
    assert "| iid | coba minus single-task +0.200 [+0.100, +0.300]: holds | not resolved | 1 of 2 |" in text
    assert "| compose | coba minus single-task +0.200 [+0.100, +0.300]: fails |" in text
    assert reference_lines("full") == []


def test_article_reference_block_renders_a_shipped_run_or_says_how_to_make_one(tmp_path):
    """Lessons 02-04 and 08 print the reference at the article's sizes with its provenance,
    states, table and verdicts, and draw its curves labelled as reference; without one shipped,
    one line names the command that makes it."""
    import matplotlib

    matplotlib.use("Agg")
    from codex_lab.reference import article_reference_lines, plot_reference, save_reference

    assert "python scripts/reference_article.py --section 03" in article_reference_lines("03", directory=tmp_path)[0]
    assert plot_reference("l03_article", directory=tmp_path) is None
    data = {"geometry": "GEOM", "states": ["MHA base: trained (...)"], "table": ["| g |", "|---|"],
            "verdicts": {"primary": "g=4 ... -> holds"}, "primary": {"verdict": "holds"},
            "curves": {"MHA": [[[0, 3.0], [10, 2.0]], [[0, 3.2], [10, 2.2]]]}, "ylabel": "loss", "xlabel": "step"}
    save_reference("l03_article", data, provenance("python scripts/reference_article.py --section 03", 7200.0, "article"),
                   directory=tmp_path)
    text = "\n".join(article_reference_lines("03", directory=tmp_path))
    assert "shipped, not this run" in text and "2.0 h of compute" in text and "GEOM" in text
    assert "- MHA base: trained (...)" in text and "- primary: g=4 ... -> holds" in text
    fig = plot_reference("l03_article", directory=tmp_path)
    (line,) = fig.axes[0].get_lines()
    assert line.get_label() == "MHA (reference)" and list(line.get_ydata()) == [3.1, 2.1]
    assert "mean of 2 seeds" in fig.axes[0].get_title()


def _flat_run(level: float, steps: int, *, seeds: int = 3, noise: float = 0.002) -> list[list[list[float]]]:
    """Per-seed held-out curves: a fall to ``level`` by the first third, then flat (tiny seed noise)."""
    every = steps // 12
    return [[[float(i * every), level + 1.0 / (1 + i) ** 3 + noise * ((s + i) % 3 - 1)] for i in range(13)]
            for s in range(seeds)]


def _extension(data: dict, extended: dict) -> dict:
    """A reference's extension record for its one arm: the run at its steps, then with more (a loss)."""
    from codex_lab.reference import rejudge

    final = sum(c[-1][1] for c in data["curves"]["arm"]) / 3
    ext = sum(c[-1][1] for c in extended["curves"]["arm"]) / 3
    trained = rejudge(data)[0].trained
    gain = final - ext  # lower is better: the extension's gain
    return {"arm": {"steps": data["curves"]["arm"][0][-1][0], "extended_steps": extended["curves"]["arm"][0][-1][0],
                    "final": final, "extended_final": ext, "gain": gain, "trained": trained,
                    "confirmed": (gain < data["metric"]["min_change"]) if trained else None}}


def test_the_extension_check_confirms_a_levelled_arm_and_flips_when_more_steps_gain(tmp_path):
    """A reference's budget-extension check as the report reads it: an arm the rule calls trained
    whose extension moves it by less than min_change stands; one whose extension gains min_change or
    more is still learning, and the block says its verdicts do not stand: the input that flips it."""
    from codex_lab.reference import article_reference_lines, save_reference

    metric = {"higher_is_better": False, "min_change": 0.02}
    data = {"geometry": "G", "states": [], "table": [], "verdicts": {"primary": "x -> holds"}, "primary": {},
            "curves": {"arm": _flat_run(2.0, 1200)}, "metric": metric}
    same = {"curves": {"arm": _flat_run(2.005, 1800)}}
    better = {"curves": {"arm": _flat_run(1.95, 1800)}}  # more steps gain 0.05 nats: still learning
    ok, gained = _extension(data, same)["arm"], _extension(data, better)["arm"]
    assert ok["trained"] and ok["confirmed"] is True and ok["steps"] == 1200 and ok["extended_steps"] == 1800
    assert gained["confirmed"] is False and gained["gain"] == pytest.approx(0.05, abs=1e-9)
    for ext, says in ((same, "they stand"), (better, "still learning")):
        save_reference("l04_article", {**data, "extension": _extension(data, ext)},
                       provenance("python scripts/reference_article.py --section 04", 60.0, "article"), directory=tmp_path)
        text = "\n".join(article_reference_lines("04", directory=tmp_path))
        assert says in text, text
        # the refutation of the rule is stated only where the check contradicts a "trained" call
        assert ("The check refutes the rule here" in text) == (ext is better), text
    assert "**not a verdict**" in text and "**not confirmed**" in text
    # the same run with its learning rates recorded, decayed over the tail: today's rule (rule 6) no
    # longer calls the arm trained, and the block says the check's lines are the run's own judgement
    steps = [s for s, _ in data["curves"]["arm"][0]]
    decayed = [1.0 if s < 900 else 0.03 for s in steps]
    save_reference("l04_article", {**data, "rates": {"arm": decayed}, "extension": _extension(data, better)},
                   provenance("python scripts/reference_article.py --section 04", 60.0, "article"), directory=tmp_path)
    text = "\n".join(article_reference_lines("04", directory=tmp_path))
    assert "peak learning rate" in text and "as the run's rule did" in text and "refutes the rule here" not in text
    # an arm the rule does not call trained is reported, never confirmed
    rising = {**data, "curves": {"arm": [[[float(i * 100), 3.0 - 0.1 * i] for i in range(13)] for _ in range(3)]}}
    assert _extension(rising, better)["arm"]["confirmed"] is None


def test_standing_names_an_arm_that_did_not_learn_apart_from_one_still_moving():
    """A shipped accuracy reference: one arm flat with every seed learned (stands), then one seed
    of it flat far below its siblings (did not learn), then a still-rising arm (not at a plateau)."""
    from codex_lab.reference import standing

    steps = range(0, 3001, 150)
    flat = [[[float(s), v] for s in steps] for v in (0.97, 0.95, 0.96)]
    metric = {"higher_is_better": True, "min_change": 0.02, "chance": 0.125}
    assert standing({"curves": {"a": flat}, "metric": metric}) == (True, "")
    stuck = [flat[0], [[float(s), 0.26] for s in steps], flat[2]]
    ok, why = standing({"curves": {"a": stuck}, "metric": metric})
    assert not ok and why == "did not learn the task: a", why
    rising = [[[float(s), 0.3 + 0.0002 * s] for s in steps] for _ in range(3)]
    ok, why = standing({"curves": {"a": stuck, "b": rising}, "metric": metric})
    assert not ok and why == "did not learn the task: a; not at a plateau: b", why


def test_the_reference_block_says_which_arms_block_a_verdict_and_why(tmp_path):
    """An accuracy reference with one arm at its plateau, one whose seed did not learn (flat far
    below its siblings) and one still rising: the verdict header names each reason apart, and says
    that a verdict comparing only arms at a plateau stands. With every arm learned and flat, the
    header says the verdicts stand."""
    from codex_lab.reference import article_reference_lines, save_reference

    steps = range(0, 3001, 150)
    flat = [[[float(s), v] for s in steps] for v in (0.97, 0.95, 0.96)]
    stuck = [flat[0], [[float(s), 0.26] for s in steps], flat[2]]
    rising = [[[float(s), 0.3 + 0.0002 * s] for s in steps] for _ in range(3)]
    metric = {"higher_is_better": True, "min_change": 0.02, "chance": 0.125}
    base = {"geometry": "G", "states": [], "table": [], "verdicts": {"primary": "x -> holds"}, "primary": {},
            "metric": metric}
    prov = provenance("python scripts/reference_article.py --section 02", 60.0, "article")
    save_reference("l02_article", {**base, "curves": {"a": flat, "b": stuck, "c": rising}}, prov, directory=tmp_path)
    text = "\n".join(article_reference_lines("02", directory=tmp_path))
    assert "b: did not learn (its state above says why" in text and "c has not reached a plateau" in text, text
    assert "**not a verdict**" in text and "one whose arms are all at a plateau stands" in text, text
    save_reference("l02_article", {**base, "curves": {"a": flat, "b": flat}}, prov, directory=tmp_path)
    text = "\n".join(article_reference_lines("02", directory=tmp_path))
    assert "not a verdict" not in text and "every arm is at a plateau by today's rule" in text, text
