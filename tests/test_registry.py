"""Model registry: versions, checksums, promote/rollback, pruning, crash mid-write, tampering."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.serve.registry import ChecksumError, Registry


def model(seed: int, vocab: int) -> CodexModel:
    torch.manual_seed(seed)
    return CodexModel(ModelConfig(vocab_size=vocab, d_model=32, n_layer=1, n_head=2, max_seq_len=64)).eval()


def same(a: CodexModel, b: CodexModel) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_add_promote_rollback_and_keep_two_previous(tmp_path, small_tokenizer):
    reg = Registry(tmp_path)
    models = [model(i, small_tokenizer.vocab_size) for i in range(5)]
    names = []
    for m in models:
        v = reg.add(m, small_tokenizer, gates={"passed": True})
        reg.promote(v)
        names.append(v)
    assert names == ["v0001", "v0002", "v0003", "v0004", "v0005"]
    assert reg.current() == "v0005"
    assert reg.versions() == ["v0003", "v0004", "v0005"]  # current + 2 previous kept, older pruned
    man = reg.manifest("v0005")
    assert man.parent == "v0004" and len(man.sha256) == 64 and man.gates == {"passed": True}
    assert same(reg.load().model, models[4])
    assert reg.rollback() == "v0004" and reg.current() == "v0004"
    assert same(reg.load().model, models[3])
    assert reg.rollback() == "v0003"
    with pytest.raises(ValueError, match="nothing to roll back"):
        reg.rollback()
    assert [r["version"] for r in reg.table()] == ["v0003", "v0004", "v0005"]


def test_candidates_newer_than_current_are_kept(tmp_path, small_tokenizer):
    reg = Registry(tmp_path)
    for i in range(3):
        reg.promote(reg.add(model(i, small_tokenizer.vocab_size), small_tokenizer))
    cand = reg.add(model(9, small_tokenizer.vocab_size), small_tokenizer)
    reg.prune()
    assert cand in reg.versions() and reg.current() == "v0003"


def test_tampered_checkpoint_is_refused(tmp_path, small_tokenizer):
    reg = Registry(tmp_path)
    v1 = reg.add(model(0, small_tokenizer.vocab_size), small_tokenizer)
    reg.promote(v1)
    v2 = reg.add(model(1, small_tokenizer.vocab_size), small_tokenizer)
    reg.promote(v2)
    w = reg.path(v2) / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-5] ^= 0xFF  # flip bits of one weight byte
    w.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="model.safetensors"):
        reg.load(v2)
    with pytest.raises(ChecksumError):
        reg.promote(v2)
    cfg = reg.path(v1) / "config.json"  # a config edit is tampering too
    c = json.loads(cfg.read_text())
    c["n_layer"] = 2
    cfg.write_text(json.dumps(c))
    with pytest.raises(ChecksumError, match="config.json"):
        reg.verify(v1)


def test_rollback_skips_a_corrupted_previous_version(tmp_path, small_tokenizer):
    reg = Registry(tmp_path)
    for i in range(3):
        reg.promote(reg.add(model(i, small_tokenizer.vocab_size), small_tokenizer))
    (reg.path("v0002") / "tokenizer.json").write_text("{}")
    assert reg.rollback() == "v0001"  # v0002 fails its checksum and is passed over


def test_crash_mid_write_leaves_no_half_version(tmp_path, small_tokenizer):
    """A child process dies (os._exit) halfway through writing the weights of v0002."""
    reg = Registry(tmp_path)
    v1 = reg.add(model(0, small_tokenizer.vocab_size), small_tokenizer)
    reg.promote(v1)
    small_tokenizer.save(tmp_path / "tok.json")
    code = textwrap.dedent(f"""
        import os, torch, safetensors.torch as st
        import codex_lab.training.checkpoint as ck
        from codex_lab.nn.config import ModelConfig
        from codex_lab.nn.model import CodexModel
        from codex_lab.serve.registry import Registry
        from codex_lab.data.tokenizer import CodeTokenizer
        def half_then_die(model, path, metadata=None):
            with open(path, "wb") as f:
                f.write(b"\\x00" * 1000)  # half a file...
                f.flush()
            os._exit(9)  # ...and the process is killed
        ck.save_model = half_then_die
        tok = CodeTokenizer.load({str(tmp_path / 'tok.json')!r})
        m = CodexModel(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layer=1, n_head=2, max_seq_len=64))
        Registry({str(tmp_path)!r}).add(m, tok)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr[-2000:]
    staging = [p.name for p in (tmp_path / "versions").iterdir() if p.name.startswith(".")]
    assert staging, "the crash should have left a staging folder behind"
    reg2 = Registry(tmp_path)  # reopening cleans the debris
    assert reg2.versions() == [v1] and reg2.current() == v1
    assert not [p for p in (tmp_path / "versions").iterdir() if p.name.startswith(".")]
    reg2.load()  # the last good version still loads and passes its checksum
    assert reg2.add(model(1, small_tokenizer.vocab_size), small_tokenizer) == "v0002"


def test_keep_previous_must_be_at_least_two(tmp_path):
    with pytest.raises(ValueError, match="at least 2"):
        Registry(tmp_path, keep_previous=1)


def test_registry_cli(tmp_path, small_tokenizer, capsys):
    from codex_lab.training.checkpoint import save_checkpoint
    from codex_lab.cli import main as cli_main

    root = str(tmp_path / "reg")
    for i in range(2):
        save_checkpoint(tmp_path / f"ck{i}", model(i, small_tokenizer.vocab_size), small_tokenizer)
        assert cli_main(["registry", "add", str(tmp_path / f"ck{i}"), "--root", root]) == 0
        assert cli_main(["registry", "promote", f"v000{i + 1}", "--root", root]) == 0
    assert cli_main(["registry", "rollback", "--root", root]) == 0
    capsys.readouterr()
    assert cli_main(["registry", "list", "--root", root]) == 0
    out = capsys.readouterr().out
    assert "v0001" in out and "v0002" in out and Registry(root).current() == "v0001"
    (tmp_path / "reg" / "versions" / "v0002" / "model.safetensors").write_bytes(b"junk")
    assert cli_main(["registry", "promote", "v0002", "--root", root]) == 2  # refused: checksum
    assert "fails its checksum" in capsys.readouterr().err
