"""The command line: clear errors, and train -> generate end to end in fast mode."""

import subprocess
import sys


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "codex_lab.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_corpus_errors_are_one_clear_line(tmp_path):
    p = cli("corpus", "--corpus", str(tmp_path / "missing"))
    assert p.returncode == 2 and "does not exist" in p.stderr and "Traceback" not in p.stderr
    p = cli("corpus", "--corpus", str(tmp_path))
    assert p.returncode == 2 and "no readable" in p.stderr


def test_train_then_generate(tmp_path):
    out = tmp_path / "run"
    p = cli("train", "--preset", "tiny", "--out", str(out), "--steps", "4", "--eval-every", "2", "--max-files", "15", "--no-progress")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "validation loss" in p.stdout
    g = cli("generate", "def fibonacci(n):", "--checkpoint", str(out / "checkpoint"), "--max-new-tokens", "8")
    assert g.returncode == 0, g.stderr[-2000:]
    assert g.stdout.startswith("def fibonacci(n):") and "finish_reason" in g.stdout


def test_generate_with_shipped_model_and_sampling():
    g = cli("generate", "import os\n", "--max-new-tokens", "6", "--temperature", "0.8", "--top-p", "0.9", "--seed", "3")
    g2 = cli("generate", "import os\n", "--max-new-tokens", "6", "--temperature", "0.8", "--top-p", "0.9", "--seed", "3")
    assert g.returncode == 0 and g.stdout == g2.stdout  # same seed, same text


def test_mode_flag_on_experiment_commands():
    from codex_lab.cli import build_parser
    from codex_lab.course.benches import discover

    parser = build_parser()
    assert parser.parse_args(["report", "--mode", "full"]).mode == "full"
    assert parser.parse_args(["--mode", "fast", "report"]).mode == "fast"  # global, before the command
    # every command accepts the three modes the same way, before or after the command
    assert parser.parse_args(["--mode", "standard", "report"]).mode == "standard"
    assert parser.parse_args(["report", "--mode", "standard"]).mode == "standard"
    assert parser.parse_args(["train", "--mode", "fast"]).mode == "fast"
    assert parser.parse_args(["finetune", "--mode", "full"]).mode == "full"
    bench = sorted(discover())[0]
    assert parser.parse_args(["bench", bench, "--mode", "fast"]).mode == "fast"  # nested bench parsers too
    assert parser.parse_args(["--mode", "full", "bench", bench]).mode == "full"  # not reset by a sub-parser default
    assert not hasattr(parser.parse_args(["report"]), "mode")  # nothing given: the device decides


def test_mode_flag_reaches_the_command_as_a_mode(monkeypatch):
    from codex_lab import cli
    from codex_lab.commands import report

    monkeypatch.delenv("CODEX_LAB_FAST", raising=False)
    seen = {}
    monkeypatch.setattr(report, "main", lambda args: seen.update(info=args.mode) or 0)
    assert cli.main(["report", "--mode", "full"]) == 0
    assert seen["info"].name == "full" and seen["info"].source == "flag" and "--mode" in seen["info"].reason
    import os

    assert os.environ.get("CODEX_LAB_MODE") != "full"  # nothing global was set: the command got it as an argument


def test_report_unknown_section_is_one_clear_line(tmp_path):
    p = cli("report", "--sections", "99", "--out", str(tmp_path / "r"), "--no-progress")
    assert p.returncode == 2 and "no report section matches '99'" in p.stderr and "Traceback" not in p.stderr


def test_experiment_commands_announce_their_mode(monkeypatch, capsys):
    from codex_lab import cli
    from codex_lab.commands import bench

    monkeypatch.delenv("CODEX_LAB_FAST", raising=False)
    monkeypatch.delenv("CODEX_LAB_MODE", raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("CODEX_LAB_DEVICE", "cpu")
    monkeypatch.setattr(bench, "main", lambda args: 0)
    assert cli.main(["bench"]) == 0
    err = capsys.readouterr().err
    assert "[codex-lab bench] standard mode: the device is CPU" in err and "--mode fast/full" in err
