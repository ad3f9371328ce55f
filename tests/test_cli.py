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
