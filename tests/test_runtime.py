import pytest
import torch

from codex_lab import runtime


def test_fast_mode_flag(monkeypatch):
    monkeypatch.setenv("CODEX_LAB_FAST", "1")
    assert runtime.fast_mode() and runtime.pick(1, 2) == 1
    monkeypatch.setenv("CODEX_LAB_FAST", "0")
    monkeypatch.setenv("CI", "true")
    assert not runtime.fast_mode() and runtime.pick(1, 2) == 2


def test_fast_mode_follows_ci(monkeypatch):
    monkeypatch.delenv("CODEX_LAB_FAST", raising=False)
    monkeypatch.setenv("CI", "true")
    assert runtime.fast_mode()
    monkeypatch.setenv("CI", "")
    assert not runtime.fast_mode()
    monkeypatch.setenv("CI", "false")
    assert not runtime.fast_mode()


def test_fast_mode_rejects_garbage(monkeypatch):
    monkeypatch.setenv("CODEX_LAB_FAST", "maybe")
    with pytest.raises(ValueError, match="CODEX_LAB_FAST"):
        runtime.fast_mode()


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
