import pytest
import torch

from codex_lab import runtime


@pytest.fixture
def clean_mode(monkeypatch):
    """No flag, no CODEX_LAB_FAST, no CI, CPU device: the state of a learner's laptop."""
    runtime.set_mode(None)
    for var in ("CODEX_LAB_FAST", "CODEX_LAB_MODE", "CI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CODEX_LAB_DEVICE", "cpu")
    yield
    runtime.set_mode(None)


def test_fast_mode_flag(clean_mode, monkeypatch):
    monkeypatch.setenv("CODEX_LAB_FAST", "1")
    assert runtime.fast_mode() and runtime.pick(1, 2) == 1
    monkeypatch.setenv("CODEX_LAB_FAST", "0")
    monkeypatch.setenv("CI", "true")
    assert not runtime.fast_mode() and runtime.pick(1, 2) == 2
    assert runtime.mode_info().source == "env"


def test_default_follows_the_device(clean_mode, monkeypatch):
    info = runtime.mode_info()
    # a laptop's default: standard mode (fast sizes, the quality experiments sized to converge)
    assert info.mode == "standard" and info.source == "device" and "CPU" in info.reason
    assert runtime.fast_mode() and info.converge  # laptop sizes, converged quality runs
    assert runtime.pick(1, 2) == 1 and runtime.pick(1, 2, standard=3) == 3
    # a CUDA device (faked: the check only reads get_device().type) means full mode
    monkeypatch.setattr(runtime, "get_device", lambda prefer=None: torch.device("cuda"))
    info = runtime.mode_info()
    assert info.mode == "full" and info.source == "device" and "CUDA" in info.reason


def test_fast_mode_follows_ci(clean_mode, monkeypatch):
    monkeypatch.setattr(runtime, "get_device", lambda prefer=None: torch.device("cuda"))
    monkeypatch.setenv("CI", "true")
    assert runtime.fast_mode() and runtime.mode_info().source == "ci"
    monkeypatch.setenv("CI", "false")
    assert not runtime.fast_mode()  # back to the (fake) GPU's choice


def test_set_mode_beats_env_and_is_undone(clean_mode, monkeypatch):
    monkeypatch.setenv("CODEX_LAB_FAST", "1")
    runtime.set_mode("full")
    info = runtime.mode_info()
    assert info.mode == "full" and info.source == "flag" and "--mode" in info.reason
    import os

    assert os.environ["CODEX_LAB_MODE"] == "full"  # child processes follow the flag (it beats CODEX_LAB_FAST)
    runtime.set_mode(None)
    assert runtime.fast_mode() and "CODEX_LAB_MODE" not in os.environ and os.environ["CODEX_LAB_FAST"] == "1"
    with pytest.raises(ValueError, match="medium"):
        runtime.set_mode("medium")


def test_mode_override_restores(clean_mode):
    runtime.set_mode("full")
    with runtime.mode_override("fast", "test"):
        assert runtime.fast_mode()
    assert not runtime.fast_mode() and runtime.mode_info().source == "flag"


def test_fast_mode_rejects_garbage(clean_mode, monkeypatch):
    monkeypatch.setenv("CODEX_LAB_FAST", "maybe")
    with pytest.raises(ValueError, match="CODEX_LAB_FAST"):
        runtime.fast_mode()


def test_expected_seconds_scales_recorded_times(clean_mode, monkeypatch):
    table = runtime.recorded_timings()
    ref = table["reference"]["matmul_ms"]
    monkeypatch.setattr(runtime, "calibrate_ms", lambda: 2 * ref)  # a machine twice as slow
    est = runtime.expected_seconds("lesson", ["05"], "fast", "cpu")
    assert est.seconds == pytest.approx(2 * table["lesson"]["fast/cpu"]["05"])
    both = runtime.expected_seconds("report", ["00", "02"], "fast", "cpu")
    assert both.seconds == pytest.approx(2 * sum(table["report"]["fast/cpu"][k] for k in ("00", "02")))
    # nothing recorded for full mode on a GPU yet: the estimate says unknown instead of guessing
    gpu = runtime.expected_seconds("report", ["00"], "full", "cuda")
    assert gpu.seconds is None and "unknown" in gpu.text()


def test_timings_cover_every_lesson():
    from codex_lab.course.plugins import lesson_packages

    keys = {p.rsplit(".", 1)[1][1:3] for p in lesson_packages()}
    t = runtime.recorded_timings()
    assert keys == set(t["lesson"]["fast/cpu"]) == set(t["report"]["fast/cpu"]) == set(t["report"]["full/cpu"])


def test_calibration_is_a_plausible_time():
    ms = runtime.calibrate_ms()
    assert 0.01 < ms < 1000  # a 113 MFLOP matmul: from ~10 us (fast server) to ~1 s (anything slower is broken)


def test_lesson_header_prints_mode_and_time(clean_mode, capsys):
    assert runtime.lesson_header("l03") is True
    out = capsys.readouterr().out
    assert "lesson 03" in out and "standard mode" in out and "CPU" in out and "expected time" in out
    assert "CODEX_LAB_MODE=<mode>" in out and "fast or full" in out  # how to choose the other modes


def test_format_seconds():
    assert runtime.format_seconds(8.4) == "8 s"
    assert runtime.format_seconds(75) == "1 min 15 s"
    assert runtime.format_seconds(4000) == "1 h 06 min"


def test_device_override(monkeypatch):
    monkeypatch.setenv("CODEX_LAB_DEVICE", "cpu")
    assert runtime.get_device().type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            runtime.get_device("cuda")


def test_seed_everything_repeats():
    runtime.seed_everything(3)
    a = torch.rand(3)
    runtime.seed_everything(3)
    assert torch.equal(a, torch.rand(3))


def test_three_modes_by_environment_and_pick(clean_mode, monkeypatch):
    monkeypatch.setenv("CODEX_LAB_MODE", "standard")
    monkeypatch.setenv("CODEX_LAB_FAST", "1")  # CODEX_LAB_MODE is the stronger of the two
    info = runtime.mode_info()
    assert info.mode == "standard" and info.source == "env" and info.fast and info.converge
    assert runtime.pick(fast=1, full=2, standard=3) == 3 and runtime.pick(fast=1, full=2) == 1
    monkeypatch.setenv("CODEX_LAB_MODE", "fast")
    assert runtime.pick(fast=1, full=2, standard=3) == 1 and not runtime.mode_info().converge
    monkeypatch.setenv("CODEX_LAB_MODE", "full")
    assert runtime.pick(fast=1, full=2, standard=3) == 2 and not runtime.fast_mode()
    monkeypatch.setenv("CODEX_LAB_MODE", "quick")
    with pytest.raises(ValueError, match="CODEX_LAB_MODE='quick'.*fast, standard, full"):
        runtime.mode_info()


def test_standard_timings_fall_back_to_fast_per_section(clean_mode, monkeypatch):
    monkeypatch.setattr(runtime, "recorded_timings", lambda: {
        "report": {"fast/cpu": {"00": 10.0, "03": 20.0}, "standard/cpu": {"03": 200.0}}, "provenance": {}})
    table, _ = runtime.timing_table("report", "standard", "cpu")
    # section 00 runs its fast sizes in standard mode; section 03 has its own standard time
    assert table == {"00": 10.0, "03": 200.0}
