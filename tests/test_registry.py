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
from codex_lab.serve.registry_files import ChecksumError
from codex_lab.serve.registry import Registry


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


BAD_IDS = ["../../x", "/etc/passwd", "v0001/../v0002", "v0001/", "", "v1", "V0001", "v0001\x00", "v0001 ",
           "..", ".", "v０００１", "v-001", "versions/v0001", "\\v0001", "v" + "9" * 20]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_only_registry_version_ids_are_accepted(bad, tmp_path, small_tokenizer):
    from codex_lab.errors import InputError

    reg = Registry(tmp_path / "reg")
    reg.promote(reg.add(model(0, small_tokenizer.vocab_size), small_tokenizer))
    (tmp_path / "x").mkdir()  # a target that ../../x would reach
    for call in (reg.promote, reg.verify, reg.load, reg.path, reg.manifest):
        with pytest.raises(InputError, match="not a registry version id"):
            call(bad)
    assert reg.current() == "v0001" and reg.versions() == ["v0001"]


def test_symlinked_version_folder_is_not_a_version(tmp_path, small_tokenizer):
    reg = Registry(tmp_path / "reg")
    v1 = reg.add(model(0, small_tokenizer.vocab_size), small_tokenizer)
    (tmp_path / "reg" / "versions" / "v0042").symlink_to(reg.path(v1))
    assert reg.versions() == [v1]
    with pytest.raises(FileNotFoundError, match="no version 'v0042'"):
        reg.promote("v0042")


def test_corrupt_manifest_is_named_listed_and_skipped_on_rollback(tmp_path, small_tokenizer):
    from codex_lab.serve.registry_files import RegistryFileError

    reg = Registry(tmp_path)
    for i in range(3):
        reg.promote(reg.add(model(i, small_tokenizer.vocab_size), small_tokenizer))
    mp = reg.path("v0002") / "manifest.json"
    mp.write_bytes(mp.read_bytes()[:40])  # truncated
    with pytest.raises(RegistryFileError, match=str(mp)):
        reg.verify("v0002")
    rows = {r["version"]: r for r in reg.table()}  # list still works
    assert rows["v0002"]["sha256"] == "BROKEN" and rows["v0003"]["current"]
    assert reg.rollback() == "v0001"  # skips the corrupt v0002
    mp.write_text('{"version": "v0002"}')  # valid JSON, missing fields
    with pytest.raises(RegistryFileError, match="manifest"):
        reg.manifest("v0002")


@pytest.mark.parametrize("damage", [b"", b'{"current": "v00', b"\x00\xff garbage", b"[]",
                                    b'{"current": "../../x", "history": ["../../x"]}'])
def test_corrupt_state_is_rebuilt_from_the_journal(damage, tmp_path, small_tokenizer):
    reg = Registry(tmp_path)
    for i in range(3):
        reg.promote(reg.add(model(i, small_tokenizer.vocab_size), small_tokenizer))
    reg.rollback()
    (tmp_path / "state.json").write_bytes(damage)
    with pytest.warns(UserWarning, match="rebuilt"):
        assert Registry(tmp_path).current() == "v0002"
    assert json.loads((tmp_path / "state.json").read_text())["current"] == "v0002"  # written back
    assert Registry(tmp_path).history() == ["v0001", "v0002"]


def test_corrupt_state_without_journal_is_refused_then_repaired(tmp_path, small_tokenizer, capsys):
    from codex_lab.cli import main as cli_main

    reg = Registry(tmp_path)
    for i in range(2):
        reg.promote(reg.add(model(i, small_tokenizer.vocab_size), small_tokenizer))
    (tmp_path / "state.json").write_text('{"current": "v0002", "hist')
    (tmp_path / "journal.log").write_bytes(b"\x00garbage\n{")
    for argv in (["registry", "list"], ["registry", "rollback"], ["registry", "promote", "v0001"]):
        assert cli_main([*argv, "--root", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and str(tmp_path / "state.json") in err and "registry repair" in err
    assert cli_main(["registry", "repair", "--root", str(tmp_path)]) == 0
    assert Registry(tmp_path).current() == "v0002"  # the newest version passing its checksum


def test_stale_temporary_files_are_cleaned_and_live_ones_kept(tmp_path, small_tokenizer):
    reg = Registry(tmp_path)
    v1 = reg.add(model(0, small_tokenizer.vocab_size), small_tokenizer)
    reg.promote(v1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        vdir = tmp_path / "versions"
        debris = [tmp_path / f".state.json.tmp-{dead.pid}", vdir / f".staging-{dead.pid}-ab12",
                  vdir / f".trash-{dead.pid}-cd34-v0000", vdir / f".v0009.staging-{dead.pid}",
                  vdir / v1 / f".manifest.json.tmp-{dead.pid}"]
        kept = [tmp_path / f".state.json.tmp-{live.pid}", vdir / f".staging-{live.pid}-ef56"]
        for p in debris + kept:
            p.mkdir() if "staging" in p.name or "trash" in p.name else p.write_text("{")
        Registry(tmp_path)
        assert [p.name for p in debris if p.exists()] == []
        assert all(p.exists() for p in kept)  # another process's staging folder is never deleted
        assert Registry(tmp_path).current() == v1
    finally:
        live.kill()
        live.wait()


def test_registry_cli_refuses_paths(tmp_path, capsys):
    from codex_lab.cli import main as cli_main

    for bad in ("../../x", "/tmp"):
        assert cli_main(["registry", "promote", bad, "--root", str(tmp_path)]) == 2
        assert "not a registry version id" in capsys.readouterr().err


def test_serve_registry_with_broken_current_version_exits_2(tmp_path, small_tokenizer, capsys):
    from codex_lab.cli import main as cli_main

    reg = Registry(tmp_path)
    reg.promote(reg.add(model(0, small_tokenizer.vocab_size), small_tokenizer))
    w = reg.path("v0001") / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100])  # truncated after registration
    assert cli_main(["serve", "--registry", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(w) in err and "checksum" in err
    (tmp_path / "state.json").write_text("{")
    (tmp_path / "journal.log").unlink()
    assert cli_main(["serve", "--registry", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(tmp_path / "state.json") in err
