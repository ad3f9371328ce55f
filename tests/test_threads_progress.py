"""Thread settings live in one place (runtime.compute_threads) that every lesson header and
report section uses, and a long report section prints progress lines that say when it
overruns and whether the machine is busier than expected."""

from __future__ import annotations

import os
import time
import types

import pytest
import torch

from codex_lab.runtime.mode import Mode

from codex_lab import runtime
from codex_lab.course import report as rep


def test_compute_threads_policy(monkeypatch):
    monkeypatch.delenv("CODEX_LAB_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert runtime.compute_threads() == 1  # 2 cores: one math thread
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert runtime.compute_threads() == 7
    monkeypatch.setenv("CODEX_LAB_THREADS", "3")
    assert runtime.compute_threads() == 3
    monkeypatch.setenv("CODEX_LAB_THREADS", "two")
    with pytest.raises(ValueError, match="CODEX_LAB_THREADS"):
        runtime.compute_threads()


def test_use_compute_threads_sets_and_restores(monkeypatch):
    monkeypatch.setenv("CODEX_LAB_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with runtime.use_compute_threads() as n:
            assert n == 1 and torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_lesson_header_sets_the_threads_and_says_so(monkeypatch, capsys):
    monkeypatch.setenv("CODEX_LAB_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runtime.lesson_header("05")
        assert torch.get_num_threads() == 1
        assert "1 math thread(s)" in capsys.readouterr().out
    finally:
        torch.set_num_threads(before)


def test_every_report_section_runs_with_the_policy_threads(monkeypatch, tmp_path):
    monkeypatch.setenv("CODEX_LAB_THREADS", "1")
    monkeypatch.setenv("CODEX_LAB_DEVICE", "cpu")
    seen = []
    mod = types.ModuleType("fake.lessons.l05_fake.report")
    mod.TITLE, mod.ORDER = "fake", 5
    mod.run = lambda ctx: seen.append(torch.get_num_threads()) or "body"
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        rep.run_report(tmp_path, mode=Mode("fast"), modules=[mod], progress=False)
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_heartbeat_lines_say_elapsed_expected_and_busy(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(os, "getloadavg", lambda: (9.5, 9.0, 8.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with rep.Heartbeat("05", 0.05, lines.append, first_s=0.1, every_s=0.1):
        time.sleep(0.45)
    assert len(lines) >= 2, lines  # it kept talking while the section ran
    assert all("05: still running" in ln and "expected ~" in ln and "load average 9.5 on 2 cores" in ln for ln in lines)
    assert "busier than expected" in lines[-1]
    quiet = rep.Heartbeat("05", 100.0, lines.append)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert "busier" not in quiet.line(30.0)  # within its expected time: no verdict on the machine
    assert "not busy" in rep.Heartbeat("05", 10.0, lines.append).line(30.0)


def test_a_short_section_prints_no_heartbeat():
    lines: list[str] = []
    with rep.Heartbeat("02", 5.0, lines.append, first_s=0.5):
        time.sleep(0.05)
    assert lines == []


def test_no_lesson_or_section_sets_its_own_thread_count():
    """The one place: a lesson or report section that calls torch.set_num_threads with a number
    of its own would diverge from compute_threads() on a machine with more cores. Allowed:
    lesson 06's measured choice (it times 1 vs the policy's threads and keeps the faster, a
    lesson in itself) and restoring a saved count (``set_num_threads(threads)``)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = sorted((root / "notebooks").glob("0*.py")) + sorted((root / "codex_lab" / "lessons").glob("l0*/report.py"))
    allowed = {"notebooks/06_fast_inference.py": {"threads", "best"}, "codex_lab/lessons/l06_inference/report.py": {"1"}}
    bad = []
    for f in files:
        rel = str(f.relative_to(root))
        for arg in re.findall(r"set_num_threads\(([^)]*)\)", f.read_text(encoding="utf-8")):
            if arg.strip() not in {"threads", "old_threads", "before"} | allowed.get(rel, set()):
                bad.append(f"{rel}: set_num_threads({arg})")
    assert not bad, "use runtime.compute_threads() (lesson_header / the report do):\n" + "\n".join(bad)
    src = (root / "codex_lab" / "commands" / "serve.py").read_text(encoding="utf-8")
    assert "torch.set_num_threads(threads)" in src and "threads = compute_threads()" in src
