import pytest
import torch

from codex_lab import runtime


@pytest.fixture
def clean_mode(monkeypatch):
    """No CODEX_LAB_FAST, CODEX_LAB_MODE or CI, CPU device: the state of a learner's laptop."""
    for var in ("CODEX_LAB_FAST", "CODEX_LAB_MODE", "CI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CODEX_LAB_DEVICE", "cpu")


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


def test_lesson_header_resolves_prints_and_returns_the_mode(clean_mode, capsys):
    mode = runtime.lesson_header("l03")
    assert isinstance(mode, runtime.Mode) and mode.name == "standard" and mode.fast and mode.converge
    out = capsys.readouterr().out
    assert "lesson 03" in out and "standard mode" in out and "CPU" in out and "expected time" in out
    assert "CODEX_LAB_MODE=<mode>" in out and "fast or full" in out  # how to choose the other modes
    assert runtime.lesson_header("03", mode="full").name == "full"  # the notebook may pass it explicitly


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


def test_standard_timings_fall_back_to_fast_per_section(clean_mode, monkeypatch):
    monkeypatch.setattr(runtime, "recorded_timings", lambda: {
        "report": {"fast/cpu": {"00": 10.0, "03": 20.0}, "standard/cpu": {"03": 200.0}}, "provenance": {}})
    table, _ = runtime.timing_table("report", "standard", "cpu")
    # section 00 runs its fast sizes in standard mode; section 03 has its own standard time
    assert table == {"00": 10.0, "03": 200.0}


def test_round_order_rotates_so_each_entry_leads_once_per_cycle():
    """Interleaved benches take each round's order from round_order: over len(names) rounds every
    entry runs first exactly once and keeps its neighbours' cyclic order; interleaved_times follows it."""
    names = ["a", "b", "c"]
    orders = [runtime.round_order(names, r) for r in range(4)]
    assert orders[:3] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]] and orders[3] == orders[0]
    assert runtime.round_order([], 5) == [] and names == ["a", "b", "c"]  # the input is not changed
    seen: list[str] = []
    runtime.interleaved_times({n: (lambda n=n: seen.append(n)) for n in names}, 2)
    assert seen == orders[0] + orders[1]
