"""Checkpoints (atomic, complete) and the training loop (loss falls, resume continues)."""

import json
from pathlib import Path

import pytest
import torch

from codex_lab.training.checkpoint import load_checkpoint, load_pretrained, save_checkpoint
from codex_lab.nn.model import CodexModel
from codex_lab.training.pretrain import lr_at, preset_config, train

from conftest import tiny_config


def test_save_load_roundtrip(tmp_path: Path, small_tokenizer):
    torch.manual_seed(0)
    m = CodexModel(tiny_config(n_kv_head=2)).eval()
    save_checkpoint(tmp_path / "ck", m, small_tokenizer, {"note": "x"})
    ck = load_checkpoint(tmp_path / "ck")
    idx = torch.randint(0, 512, (1, 10))
    assert torch.equal(ck.model(idx).logits, m(idx).logits)
    assert ck.meta == {"note": "x"} and ck.config == m.cfg
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left


def test_failed_write_keeps_previous_checkpoint(tmp_path: Path, small_tokenizer, monkeypatch):
    m = CodexModel(tiny_config())
    save_checkpoint(tmp_path / "ck", m, small_tokenizer, {"v": 1})
    import codex_lab.training.checkpoint as ckmod

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ckmod, "save_model", boom)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path / "ck", m, small_tokenizer, {"v": 2})
    assert load_checkpoint(tmp_path / "ck").meta == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_missing_checkpoint_errors(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="missing"):
        load_checkpoint(tmp_path / "half")


def test_shipped_checkpoint_is_small_and_recorded():
    ck = load_pretrained()
    weights = ck.path / "model.safetensors"
    assert weights.stat().st_size <= 20 * 1024 * 1024
    for key in ("val_loss", "train_time_s", "history", "train_config", "command", "syntax_validity"):
        assert key in ck.meta, key
    # a model that learned something: far below the uniform-guess loss ln(4096) = 8.3
    assert ck.meta["val_loss"] < 5.0
    assert ck.meta["history"][-1]["val_loss"] < ck.meta["history"][0]["val_loss"]


def test_lr_schedule():
    tc = preset_config("tiny", steps=100, warmup=10, lr=1.0, min_lr=0.1)
    assert lr_at(0, tc) == pytest.approx(0.1)
    assert lr_at(9, tc) == pytest.approx(1.0)
    assert lr_at(100, tc) == pytest.approx(0.1)
    assert 0.1 < lr_at(55, tc) < 1.0


def test_train_loss_falls_and_resume_continues(tmp_path: Path):
    out = tmp_path / "run"
    tc = preset_config("tiny", out=str(out), steps=12, eval_every=6, max_files=20, lr=3e-3)
    r = train(tc, progress=False)
    hist = r.history
    assert [h["step"] for h in hist] == [6, 12]
    assert hist[-1]["val_loss"] < hist[0]["val_loss"]
    ck = load_checkpoint(r.out)
    assert ck.meta["step"] == 12
    tc2 = preset_config("tiny", out=str(out), steps=18, eval_every=6, max_files=20, lr=3e-3)
    r2 = train(tc2, resume=True, progress=False)
    assert [h["step"] for h in r2.history] == [6, 12, 18]
    assert load_checkpoint(r2.out).meta["step"] == 18
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        train(preset_config("tiny", out=str(tmp_path / "empty"), steps=2), resume=True, progress=False)


def test_unknown_preset_and_option():
    with pytest.raises(ValueError, match="unknown preset"):
        preset_config("huge")
    with pytest.raises(ValueError, match="unknown training options"):
        preset_config("tiny", bogus=1)
