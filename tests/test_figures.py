"""The README, the docs pages and the notebook headers state the figures of the records
(codex_lab/assets/timings.json: run times per lesson, the report's total, the test count and
the CI duration; codex_lab/assets/bench_records.json: the performance figures).
`python scripts/update_figures.py` rewrites them after re-timing.

The README keeps the lesson table, the report's total and the suite's figures; the measured
results and the performance goals live in docs/*.md (``figures.TEXTS``): a performance figure
is checked on the page that states it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from codex_lab.course import bench_figures, figure_audit, figures


def _copy_texts(root: Path) -> Path:
    """The README, the docs pages and the notebook sources, copied under ``root`` (the texts figures rewrite)."""
    (root / "notebooks").mkdir()
    (root / "docs").mkdir()
    shutil.copy(figures.ROOT / "README.md", root / "README.md")
    for p in (figures.ROOT / "docs").glob("*.md"):
        shutil.copy(p, root / "docs" / p.name)
    for p in (figures.ROOT / "notebooks").glob("0*.py"):
        shutil.copy(p, root / "notebooks" / p.name)
    return root


def test_every_stated_figure_agrees_with_the_record():
    bad = figures.mismatches()
    assert not bad, "run `python scripts/update_figures.py` after re-timing:\n" + "\n".join(bad)


def test_the_readme_states_the_timing_figures_itself():
    """The learner's figures stay on the front page: each lesson's run time in the course map,
    the report's fast-mode total, the test count and the CI duration are in README.md itself."""
    text = (figures.ROOT / "README.md").read_text(encoding="utf-8")
    for key, secs in figures.lesson_seconds(figures.record()).items():
        assert re.search(rf"\n\| \[{key} [^\n]*\| {secs} s \|\n", text), f"lesson {key}'s row in the README's course map"
    for pat in (figures.REPORT_RE, figures.TESTS_RE, figures.CI_RE):
        assert pat.search(text), f"the README states no figure matching {pat.pattern!r}"


def test_a_stale_figure_is_caught_and_rewritten(tmp_path):
    root = _copy_texts(tmp_path)
    rec = figures.record()
    key, secs = sorted(figures.lesson_seconds(rec).items())[3]
    nb = next((root / "notebooks").glob(f"{key}_*.py"))
    nb.write_text(figures.HEADER_RE.sub(lambda m: f"{m.group(1)}{secs + 7}{m.group(3)}", nb.read_text()))
    readme = root / "README.md"
    readme.write_text(figures.REPORT_RE.sub(lambda m: f"{m.group(1)}999{m.group(3)}", readme.read_text()))
    bad = figures.mismatches(rec, root)
    assert any(nb.name in b and str(secs + 7) in b for b in bad), bad
    assert any("README.md" in b and "999" in b for b in bad), bad
    changed = figures.apply(rec, root)
    assert set(changed) >= {"README.md", f"notebooks/{nb.name}"}
    assert figures.mismatches(rec, root) == []


def test_report_total_is_the_sum_of_its_sections():
    rec = {"report": {"fast/cpu": {"00": 1.4, "01": 2.4}}}
    assert figures.report_seconds(rec) == 4


def test_a_stale_performance_figure_is_caught_and_rewritten(tmp_path):
    """The decode figures (docs/PERFORMANCE.md) come from the bench record: a changed ratio in
    the text is listed with the record's value, and apply() writes the record's value back."""
    root = _copy_texts(tmp_path)
    bench = bench_figures.bench_record()
    fig = next(f for f in bench_figures.BENCH_FIGURES if f.key == "decode" and f.field == "speedup_vs_hf_generate")
    want = fig.value(bench["decode"]["rows"])
    readme = root / "docs" / "PERFORMANCE.md"
    text = readme.read_text()
    assert len(fig.pattern.findall(text)) == 1
    readme.write_text(fig.pattern.sub(lambda m: f"{m.group(1)}9.99{m.group(3)}", text))
    bad = figures.mismatches(root=root)
    assert any("9.99" in b and want in b for b in bad), bad
    assert figures.apply(root=root) == ["docs/PERFORMANCE.md"] and figures.mismatches(root=root) == []
    # a record whose rows changed is a stale text too
    rows = [dict(r) for r in bench["decode"]["rows"]]
    for r in rows:
        if r["impl"] == "codex_lab_fast_decode":
            r["speedup_vs_hf_generate"] = 1.234
    stale = {**bench, "decode": {**bench["decode"], "rows": rows}}
    assert any("1.23" in b for b in figures.mismatches(root=root, bench=stale))


def test_every_performance_figure_reads_a_recorded_bench():
    """Each figure's record exists and holds exactly one row it reads (else: re-record the bench)."""
    bench = bench_figures.bench_record()
    for fig in bench_figures.BENCH_FIGURES:
        assert fig.key in bench, f"no record {fig.key!r}: scripts/update_figures.py --bench {fig.key} FILE"
        # a bench of the command line, or a script of the repository (the restart time)
        assert bench[fig.key]["command"].startswith(("codex-lab bench", "python scripts/")) and bench[fig.key]["conditions"]
        float(fig.value(bench[fig.key]["rows"]))


def test_recording_rows_that_lack_a_figure_is_refused(tmp_path):
    import pytest

    path = tmp_path / "bench.json"
    with pytest.raises(ValueError, match="0 bench rows match"):
        bench_figures.record_bench("decode", [{"impl": "hf_generate", "tokens_per_s": 1.0}], "codex-lab bench x", "quiet",
                             "2026-12-02", path=path)
    assert not path.exists()  # nothing half-written


def test_every_figure_on_the_pages_is_checked_or_declared():
    """README, every docs page and every lesson's prose: a number with a unit of time, speed,
    size, ratio or share is either read from a record (and checked above) or declared (a goal,
    a limit, an input of a test, a claim of the article: figures.DECLARED / PAGE_DECLARED)."""
    bad = figure_audit.unchecked()
    assert not bad, ("figures no record checks: compute them from a record (codex_lab/course/figures.py, bench_figures.py), "
                     "or remove them:\n" + "\n".join(bad))


def test_a_hand_typed_figure_is_caught_wherever_it_is_written(tmp_path):
    """The counterfactual: a measurement typed into a docs page, the README or a lesson's
    markdown is listed; the same number in code, as a goal, or in a code cell is not."""
    root = _copy_texts(tmp_path)
    page = root / "docs" / "PROFILE.md"
    page.write_text(page.read_text() + "\nFastDecoder decoded 1234 tokens/s here, 3.21x the old path.\n"
                    "The goal is < 50 ms; run `bench --timeout 77 s`.\n")
    nb = next((root / "notebooks").glob("03_*.py"))
    nb.write_text(nb.read_text() + "\n# %% [markdown]\n# It took 41.5 s on my laptop.\n\n# %%\nx = '99 ms'\n")
    readme = root / "README.md"
    readme.write_text(readme.read_text() + "\nThe whole report takes 987 s.\n")
    bad = figure_audit.unchecked(root=root)
    for want in ("1234 tokens/s", "3.21x", "41.5 s", "987 s"):
        assert any(b.endswith(": " + want) for b in bad), (want, bad)
    for never in ("50 ms", "77 s", "99 ms"):
        assert not any(b.endswith(": " + never) for b in bad), (never, bad)
    assert len(bad) == 4, bad


def test_the_standard_mode_figures_follow_the_record(tmp_path):
    """A lesson appendix's standard-mode section and the results page's sections come from the
    timings record: a changed section time in the record is a mismatch until the text is rewritten."""
    root = _copy_texts(tmp_path)
    rec = figures.record()
    rec["report"]["standard/cpu"]["03"] += 100.0
    bad = figures.mismatches(rec, root)
    assert any("03_gqa.py" in b for b in bad) and any("docs/RESULTS.md" in b for b in bad), bad
    figures.apply(rec, root)
    assert figures.mismatches(rec, root) == []


def test_a_unitless_measurement_must_be_one_its_records_hold(tmp_path):
    """The counterfactual for numbers without a unit: on a page bound to records, a pass@1 or an
    interval that the record holds passes, and the same figure nudged by one unit of its last digit
    is listed; on a page bound to none, any such decimal is listed unless declared."""
    import json as _json

    from codex_lab.course.figure_audit import PAGE_RECORDS, VALUE_DECLARED, record_values

    assets = tmp_path / "assets"
    (assets / "cb2_tuned").mkdir(parents=True)
    (assets / "cb2_tuned" / "meta.json").write_text(_json.dumps(
        {"pass_at_1": {"completion": 0.3541666, "curve": [0.1, 0.2, 0.3, 0.4, 0.51234]},
         "verdict": "difference -0.2800 (95% CI [-0.2841, -0.2759])"}))
    assert "docs/CODEBENCH2.md" in PAGE_RECORDS
    values = record_values([assets / "cb2_tuned" / "meta.json"])
    assert 0.3541666 in values and -0.2841 in values and 0.51234 not in values  # a long list is not quoted from
    (tmp_path / "root").mkdir()
    root = _copy_texts(tmp_path / "root")
    for name in ("CODEBENCH2.md", "SERVER_API.md"):
        (root / "docs" / name).write_text("placeholder\n")
    page = root / "docs" / "CODEBENCH2.md"
    page.write_text("completion 0.354, gap -0.2800 [-0.2841, -0.2759], floor 0.10.\n"
                    "completion 0.355, and a curve point 0.512.\n")
    (root / "docs" / "SERVER_API.md").write_text("style 0.984; version 0.3.36; margin 0.05.\n")
    bad = [b for b in figure_audit.unchecked(root=root, assets=assets)
           if b.startswith(("docs/CODEBENCH2.md", "docs/SERVER_API.md"))]
    assert sorted(bad) == ["docs/CODEBENCH2.md:2: 0.355", "docs/CODEBENCH2.md:2: 0.512",
                           "docs/SERVER_API.md:1: 0.984 (no record bound to this page)"], bad
    assert "0.10" in VALUE_DECLARED and "0.05" in VALUE_DECLARED
