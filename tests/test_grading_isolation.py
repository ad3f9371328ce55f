"""Hostile submissions graded in one folder run beside a solved, an untouched, a notebook
(.ipynb) and a lesson-notebook submission, with --csv, --json, --gradescope and --hidden:
the run finishes, every submission is in the CSV, the untouched one scores 0, the solved
ones full marks (public and hidden), each hostile one loses only its own points, and no
file outside the sandbox's temporary folder changes."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from codex_lab.sandbox import isolation_mode

ROOT = Path(__file__).resolve().parents[1]

HIDDEN_CHECK = '''
from codex_lab.course.checks import case, exercise


@exercise("00", "chars_per_token", points=2)
def hidden_chars_per_token(fn):
    class Tok:  # one token per character: the ratio is exactly 1.0
        def encode(self, s):
            return list(s)

    class Pairs:  # one token per two characters, rounded up
        def encode(self, s):
            return [s[i:i + 2] for i in range(0, len(s), 2)]

    with case(1, "one token per character"):
        assert fn(Tok(), ["abc", "de"]) == 1.0, "one token per character gives a ratio of 1.0"
    with case(1, "two characters per token"):
        got = fn(Pairs(), ["abcd", "ef"])
        assert got == 2.0, f"6 characters in 3 tokens is 2.0, got {got}"
'''

HOSTILE = {
    "loop": "def chars_per_token(tok, texts):\n    while True:\n        pass\n",
    "exit": "import sys\n\n\ndef chars_per_token(tok, texts):\n    sys.exit(0)\n",
    "osexit": "import os\n\n\ndef chars_per_token(tok, texts):\n    os._exit(0)\n",
    "patch": ("class Evil:\n    import codex_lab.course.grading as g\n"
              "    g.run_check = lambda ex, fn: g.Result(ex.lesson, ex.name, 'passed', 'ok', ex.points, ex.points)\n\n\n"
              "def chars_per_token(tok, texts):\n    raise NotImplementedError\n"),
    "solread": ("def chars_per_token(tok, texts):\n    ns = {}\n"
                f"    exec(open({str(ROOT / 'solutions' / '00_tour.py')!r}).read(), ns)\n"
                "    return ns['chars_per_token'](tok, texts)\n"),
    "bigprint": "import sys\n\n\ndef chars_per_token(tok, texts):\n    sys.__stdout__.write('x' * 100_000_000)\n    return 1.0\n",
    # forging a result: walk the stack to the grader's emitter, patch every check through gc, fake equality
    "frames": ("import sys\n\n\ndef chars_per_token(tok, texts):\n    f = sys._getframe()\n    while f is not None:\n"
               "        for v in list(f.f_locals.values()) + list(f.f_globals.values()):\n"
               "            if callable(v) and getattr(v, '__name__', '') == 'emit':\n"
               "                v('RESULT', {'key': ['00', 'chars_per_token', 'public'], 'status': 'passed', 'message': 'ok',"
               " 'points': 1})\n        f = f.f_back\n    raise NotImplementedError\n"),
    "gcpatch": ("import gc\n\n\nclass Patch:\n    for o in gc.get_objects():\n"
                "        if type(o).__name__ == 'Exercise':\n            object.__setattr__(o, 'check', lambda fn: None)\n\n\n"
                "def chars_per_token(tok, texts):\n    raise NotImplementedError\n"),
    "alwayseq": ("class Yes(float):\n    def __eq__(self, o):\n        return True\n\n    def __sub__(self, o):\n        return 0.0\n\n"
                 "    __rsub__ = __sub__\n\n\ndef chars_per_token(tok, texts):\n    return Yes(0.0)\n"),
    "checksimport": ("def chars_per_token(tok, texts):\n    from codex_lab.lessons.l00_tour import checks\n"
                     "    return checks._SAMPLES and 1.0\n"),
    "gitread": ("def chars_per_token(tok, texts):\n"
                f"    return float(len(open({str(ROOT / '.git' / 'HEAD')!r}).read()))\n"),
    "forks": ("import posix\nimport time\n\n\ndef chars_per_token(tok, texts):\n    for _ in range(50):\n        try:\n"
              "            if posix.fork() == 0:\n                time.sleep(1000)\n        except OSError:\n            pass\n"
              "    return 1.0\n"),
}


def _snapshot(*folders: Path) -> dict[str, str]:
    out = {}
    for folder in folders:
        for p in sorted(folder.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and ".pytest_cache" not in p.parts:
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.mark.skipif(isolation_mode() != "root", reason="the hostile set needs the root sandbox (uid switch, namespaces)")
def test_hostile_folder_run(tmp_path):
    subs, hidden, out = tmp_path / "subs", tmp_path / "hidden", tmp_path / "out"
    for d in (subs, hidden, out):
        d.mkdir()
    (hidden / "lesson00.py").write_text(HIDDEN_CHECK)
    for name, src in (("solved", "solutions/00_tour.py"), ("untouched", "exercises/00_tour.py"),
                      ("notebook", "solutions/00_tour.ipynb"), ("lessonnb", "notebooks/00_tour.ipynb")):
        (subs / name).mkdir()
        shutil.copy(ROOT / src, subs / name / Path(src).name)
    for name, src in HOSTILE.items():
        (subs / name).mkdir()
        (subs / name / "00_tour.py").write_text(src)
    (subs / "peer").mkdir()  # another submission's file, by its absolute path
    (subs / "peer" / "00_tour.py").write_text(
        "def chars_per_token(tok, texts):\n    ns = {}\n"
        f"    exec(open({str(subs / 'solved' / '00_tour.py')!r}).read(), ns)\n    return ns['chars_per_token'](tok, texts)\n")
    (subs / "link").mkdir()  # a link to the answers
    (subs / "link" / "00_tour.py").symlink_to(ROOT / "solutions" / "00_tour.py")
    (subs / "deepnb").mkdir()  # a notebook nested 200,000 levels deep: that row fails, the others are graded
    (subs / "deepnb" / "00_tour.ipynb").write_text("[" * 200_000 + "]" * 200_000)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    writes = [victim, ROOT / "PWNED_BY_SUBMISSION", ROOT / "codex_lab" / "course" / "checks.py"]
    (subs / "writer").mkdir()
    (subs / "writer" / "00_tour.py").write_text(
        "def chars_per_token(tok, texts):\n"
        f"    for p in {[str(p) for p in writes]!r}:\n"
        "        try:\n            open(p, 'a').write('pwned')\n        except OSError:\n            pass\n"
        "    return 1.0\n")
    before = _snapshot(subs, hidden)  # (the package and solutions/ are edited by others while tests run)
    cmd = [sys.executable, "-m", "codex_lab.cli", "grade", str(subs), "--csv", str(out / "s.csv"), "--json",
           str(out / "s.json"), "--gradescope", str(out / "results.json"), "--hidden", str(hidden), "--timeout", "20"]
    # the run's time budget: 13 submissions on a shared 2-core machine; a hang guard, not a speed test
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]

    rows = list(csv.DictReader((out / "s.csv").open()))
    score: dict[str, dict[str, int]] = {}
    for r in rows:  # points summed over lesson 00's exercises, per visibility
        per = score.setdefault(r["submission"].split("/")[0], {})
        per[r["visibility"]] = per.get(r["visibility"], 0) + int(r["points"])
    assert set(score) == set(HOSTILE) | {"solved", "untouched", "notebook", "lessonnb", "writer", "link", "deepnb", "peer"}, score
    from codex_lab.course.checks import exercises_for

    public = sum(e.points for e in exercises_for("00"))  # lesson 00's public maximum (other exercises may join)
    assert score["solved"] == {"public": public, "hidden": 2}
    assert score["notebook"] == {"public": public, "hidden": 2}  # an .ipynb grades like its .py
    assert score["untouched"] == {"public": 0, "hidden": 0}
    assert score["lessonnb"] == {"public": 0, "hidden": 0}  # a lesson notebook earns nothing
    # the hostile answers are all chars_per_token: read that exercise's rows (and the hidden ones)
    by_sub = {r["submission"].split("/")[0] + "/" + r["visibility"]: r for r in rows
              if r["visibility"] == "hidden" or r["name"] == "chars_per_token"}
    assert "timed out" in by_sub["loop/public"]["message"] and "timed out" in by_sub["loop/hidden"]["message"]
    assert "sys.exit" in by_sub["exit/public"]["message"]
    assert "ended" in by_sub["osexit/public"]["message"]
    # the learner's code has no way to the run's output: 100 MB written to fd 1 vanish (the answer 1.0 is wrong)
    assert by_sub["bigprint/public"]["status"] == "failed"
    for name in ("patch", "frames", "gcpatch"):  # the grader is another process: patches change nothing
        assert by_sub[f"{name}/public"]["status"] == "not yet done", (name, by_sub[f"{name}/public"])
    assert "cannot be graded" in by_sub["alwayseq/public"]["message"]
    assert "checks" in by_sub["checksimport/public"]["message"]
    assert "link to a file outside" in by_sub["link/public"]["message"]
    assert "could not read" in by_sub["deepnb/public"]["message"]
    assert "FileNotFoundError" in by_sub["solread/public"]["message"]  # solutions/ is hidden from submissions
    for name in [*HOSTILE, "link", "deepnb", "peer"]:
        assert score[name]["public"] == 0, (name, score[name])
    for name in ("frames", "gcpatch", "alwayseq", "checksimport", "gitread", "peer", "link", "deepnb"):
        assert score[name]["hidden"] == 0, (name, score[name])
    # returning 1.0 earns exactly the hidden case it satisfies: partial credit, per submission
    assert score["forks"] == {"public": 0, "hidden": 1} and score["writer"] == {"public": 0, "hidden": 1}
    assert by_sub["writer/hidden"]["status"] == "partial"

    assert victim.read_text() == "keep" and not (ROOT / "PWNED_BY_SUBMISSION").exists()
    assert not (ROOT / "codex_lab" / "course" / "checks.py").read_text().endswith("pwned")
    assert _snapshot(subs, hidden) == before

    data = json.loads((out / "s.json").read_text())
    assert len(data) == len(rows) and {d["visibility"] for d in data} == {"public", "hidden"}
    gs = json.loads((out / "results.json").read_text())
    assert gs["score"] == sum(int(r["points"]) for r in rows)
    assert {t["visibility"] for t in gs["tests"]} == {"visible", "hidden"}
    assert all({"name", "score", "max_score", "output", "visibility"} <= set(t) for t in gs["tests"])


def test_file_mode_honours_csv_json_gradescope(tmp_path):
    sub = tmp_path / "00_tour.ipynb"
    shutil.copy(ROOT / "exercises" / "00_tour.ipynb", sub)
    cmd = [sys.executable, "-m", "codex_lab.cli", "grade", str(sub), "--csv", str(tmp_path / "s.csv"), "--json",
           str(tmp_path / "s.json"), "--gradescope", str(tmp_path / "r.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stderr[-2000:]  # graded, not every exercise passed
    assert "not yet done" in proc.stdout and "0/" in proc.stdout
    rows = list(csv.DictReader((tmp_path / "s.csv").open()))
    assert rows and all((r["status"], r["points"]) == ("not yet done", "0") for r in rows), rows
    assert json.loads((tmp_path / "s.json").read_text())[0]["status"] == "not yet done"
    gs = json.loads((tmp_path / "r.json").read_text())
    assert gs["score"] == 0 and gs["tests"][0]["max_score"] >= 1


def test_bad_input_exits_2(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "codex_lab.cli", "grade", *a], capture_output=True, text=True, timeout=300)  # noqa: E731
    assert run(str(tmp_path / "nope.py")).returncode == 2
    assert run(str(tmp_path)).returncode == 2  # no gradable file
    assert run(str(ROOT / "solutions" / "00_tour.py"), "--hidden", str(tmp_path / "missing")).returncode == 2
