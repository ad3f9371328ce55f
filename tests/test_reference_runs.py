"""Reference runs: resumable units, provenance, shipped data (codex_lab.reference)."""

from __future__ import annotations

import json

import pytest

from codex_lab.errors import InputError
from codex_lab.reference import (REQUIRED_PROVENANCE, ResumableRun, describe_provenance, load_reference, provenance,
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
    """The report's lesson 05 prints a shipped reference run beside its own figures, with the
    provenance line and the reference's own states and verdict; nothing without one, nor in full mode."""
    import codex_lab.reference as ref_mod
    from codex_lab.lessons.l05_multitask.report import reference_lines

    monkeypatch.setattr(ref_mod, "load_reference", lambda name, **kw: None)
    assert reference_lines("standard") == []
    prov = ref_mod.provenance("python scripts/reference_l05.py", 1234.0, "converge")
    fake = {"provenance": prov, "data": {
        "setup": "2 layers", "table": "TABLE", "audit": "AUDIT", "states": {"coba": "coba: trained (...)"},
        "primary": {"describe": "coba - single-task ... -> holds"}, "naive_vs_primary": "coba - naive ... -> not resolved"}}
    seen = []
    monkeypatch.setattr(ref_mod, "load_reference", lambda name, **kw: seen.append(name) or fake)
    text = "\n".join(reference_lines("standard"))
    assert seen == ["l05_converge_iid"]
    assert "shipped, not this run" in text and "python scripts/reference_l05.py" in text and "21 min" in text
    assert "TABLE" in text and "coba: trained" in text and "primary: coba - single-task ... -> holds" in text
    assert reference_lines("full") == []
