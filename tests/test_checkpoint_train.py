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
    tc = preset_config("tiny", mode="fast", steps=100, warmup=10, lr=1.0, min_lr=0.1)
    assert lr_at(0, tc) == pytest.approx(0.1)
    assert lr_at(9, tc) == pytest.approx(1.0)
    assert lr_at(100, tc) == pytest.approx(0.1)
    assert 0.1 < lr_at(55, tc) < 1.0


def test_train_loss_falls_and_resume_continues(tmp_path: Path):
    out = tmp_path / "run"
    tc = preset_config("tiny", mode="fast", out=str(out), steps=12, eval_every=6, max_files=20, lr=3e-3)
    r = train(tc, progress=False)
    hist = r.history
    assert [h["step"] for h in hist] == [6, 12]
    assert hist[-1]["val_loss"] < hist[0]["val_loss"]
    ck = load_checkpoint(r.out)
    assert ck.meta["step"] == 12
    tc2 = preset_config("tiny", mode="fast", out=str(out), steps=18, eval_every=6, max_files=20, lr=3e-3)
    r2 = train(tc2, resume=True, progress=False)
    assert [h["step"] for h in r2.history] == [6, 12, 18]
    assert load_checkpoint(r2.out).meta["step"] == 18
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        train(preset_config("tiny", mode="fast", out=str(tmp_path / "empty"), steps=2), resume=True, progress=False)


def test_unknown_preset_and_option():
    with pytest.raises(ValueError, match="unknown preset"):
        preset_config("huge", mode="fast")
    with pytest.raises(ValueError, match="unknown training options"):
        preset_config("tiny", mode="fast", bogus=1)


def test_train_config_nests_model_config_and_reads_old_flat_configs():
    from dataclasses import asdict

    from codex_lab.training.pretrain import TrainConfig

    tc = preset_config("tiny", mode="fast", n_kv_head=2, d_model=64, n_head=4, seq_len=2048)
    assert tc.model.n_kv_head == 2 and tc.model.d_model == 64 and tc.model.max_seq_len == 2048
    assert TrainConfig.from_dict(asdict(tc)) == tc  # the nested form round-trips
    # the shipped checkpoint's meta has the older flat form; it still rebuilds the model's shape
    ck = load_pretrained()
    old = TrainConfig.from_dict(ck.meta["train_config"])
    assert old.model_config(ck.config.vocab_size) == ck.config
    assert old.steps == ck.meta["train_config"]["steps"]


def test_loop_accumulation_equals_one_big_batch_and_hooks_fire():
    from codex_lab.training.loop import LoopConfig, adamw, lr_schedule, run_loop

    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(0))
    y = torch.randn(8, 1, generator=torch.Generator().manual_seed(1))

    def run(accum: int) -> torch.Tensor:
        torch.manual_seed(0)
        lin = torch.nn.Linear(5, 1)
        cfg = LoopConfig(steps=3, lr=1e-2, warmup=2, grad_clip=None, accum_steps=accum, eval_every=2)
        parts = iter([(x, y)] * 3 if accum == 1 else [(x[:4], y[:4]), (x[4:], y[4:])] * 3)
        seen = []

        def loss_fn(step):
            xb, yb = next(parts)
            return torch.nn.functional.mse_loss(lin(xb), yb), {}

        res = run_loop(loss_fn, adamw(lin, cfg), cfg, eval_fn=lambda s, row: seen.append(s))
        assert seen == [2, 3] and [r["step"] for r in res.rows] == [1, 2, 3]
        assert [r["lr"] for r in res.rows] == [lr_schedule(i, 1e-2, 2, 3) for i in range(3)]
        return torch.cat([p.detach().flatten() for p in lin.parameters()])

    # the mean of two half-batch gradients is the full-batch gradient (equal halves, mean loss);
    # float32 sums in a different order: 1e-6 relative is far below one AdamW step (1e-2)
    assert torch.allclose(run(1), run(2), rtol=1e-5, atol=1e-6)
    assert lr_schedule(0, 1.0, 4, 10) == 0.25 and lr_schedule(7, 1.0, 4, 10) == 1.0  # constant without min_lr
    assert lr_schedule(10, 1.0, 4, 10, min_lr=0.1) == pytest.approx(0.1)


def test_warmup_convention_against_hugging_face():
    """Ours is Hugging Face's cosine schedule with the warm-up one step earlier (documented in
    lr_schedule): ours(t) = HF(t + 1) while warming up, ours(t) = HF(t) from step `warmup` on."""
    transformers = pytest.importorskip("transformers")
    import torch

    from codex_lab.training.loop import lr_schedule

    lr, warmup, steps = 1e-3, 10, 50
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = transformers.get_cosine_schedule_with_warmup(opt, num_warmup_steps=warmup, num_training_steps=steps)
    hf = [sched.lr_lambdas[0](t) * lr for t in range(steps + 1)]
    assert hf[0] == 0.0 and lr_schedule(0, lr, warmup, steps, min_lr=0.0) == pytest.approx(lr / warmup)
    for t in range(warmup):
        assert lr_schedule(t, lr, warmup, steps, min_lr=0.0) == pytest.approx(hf[t + 1], rel=1e-12)
    for t in range(warmup, steps + 1):
        # 1e-12 relative: the same cosine formula, evaluated in the same order up to rounding
        assert lr_schedule(t, lr, warmup, steps, min_lr=0.0) == pytest.approx(hf[t], rel=1e-12, abs=1e-18)
