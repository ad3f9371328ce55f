"""The README and the notebook headers state the figures of the one record
(codex_lab/assets/timings.json): run times per lesson, the report's total, the test count and
the CI duration. `python scripts/update_figures.py` rewrites them after re-timing."""

from __future__ import annotations

import shutil
from pathlib import Path

from codex_lab.course import figures


def test_every_stated_figure_agrees_with_the_record():
    bad = figures.mismatches()
    assert not bad, "run `python scripts/update_figures.py` after re-timing:\n" + "\n".join(bad)


def test_a_stale_figure_is_caught_and_rewritten(tmp_path):
    root = tmp_path
    (root / "notebooks").mkdir()
    shutil.copy(figures.ROOT / "README.md", root / "README.md")
    for p in (figures.ROOT / "notebooks").glob("0*.py"):
        shutil.copy(p, root / "notebooks" / p.name)
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
