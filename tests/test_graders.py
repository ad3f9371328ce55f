"""Graders: every exercise passes against solutions/ and reports "not yet done" against
exercises/; bulk grading tells a solved, an unsolved and a broken submission apart."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from codex_lab.course.checks import load_all
from codex_lab.course.grading import ERROR, NOT_DONE, PASSED, grade_file, grade_folder

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted({les for les, _ in load_all()})


def _path(folder: str, lesson: str) -> Path:
    matches = sorted((ROOT / folder).glob(f"{lesson}_*.py"))
    assert len(matches) == 1, f"expected one {folder}/{lesson}_*.py, found {matches}"
    return matches[0]


@pytest.mark.parametrize("lesson", LESSONS)
def test_solutions_pass_every_check(lesson):
    results = grade_file(_path("solutions", lesson))
    assert results and all(r.status == PASSED for r in results), [(r.name, r.status, r.message) for r in results]


@pytest.mark.parametrize("lesson", LESSONS)
def test_exercises_are_not_yet_done(lesson):
    results = grade_file(_path("exercises", lesson))
    assert results and all(r.status == NOT_DONE for r in results), [(r.name, r.status, r.message) for r in results]


def test_a_wrong_answer_fails(tmp_path):
    src = _path("solutions", "00").read_text().replace("return n_chars / n_tokens", "return n_tokens / n_chars")
    (tmp_path / "00_tour.py").write_text(src)
    (r,) = grade_file(tmp_path / "00_tour.py")
    assert r.status == "failed" and "expected" in r.message


def test_bulk_grading_and_cli(tmp_path):
    for name, src in (("solved", "solutions"), ("unsolved", "exercises")):
        (tmp_path / name).mkdir()
        shutil.copy(_path(src, "00"), tmp_path / name / "00_tour.py")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "00_tour.py").write_text("def chars_per_token(:\n")
    rows = {r["submission"]: r for r in grade_folder(tmp_path)}
    assert rows["solved/00_tour.py"]["status"] == PASSED
    assert rows["unsolved/00_tour.py"]["status"] == NOT_DONE
    assert rows["broken/00_tour.py"]["status"] == ERROR
    out = tmp_path / "scores.json"
    proc = subprocess.run([sys.executable, "-m", "codex_lab.cli", "grade", str(tmp_path), "--json", str(out), "--csv", str(tmp_path / "s.csv")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(out.read_text())) == 3
    assert (tmp_path / "s.csv").read_text().splitlines()[0].startswith("submission,lesson,name,status")
    one = subprocess.run([sys.executable, "-m", "codex_lab.cli", "grade", str(tmp_path / "unsolved" / "00_tour.py")],
                         capture_output=True, text=True, timeout=120)
    assert one.returncode == 1 and "not yet done" in one.stdout and "all tests passed" not in one.stdout
