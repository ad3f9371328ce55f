"""The registry against hostile files and races (issue 30): journal.log / .lock planted as
symlinks, verify racing a prune (threads and a process), and version ids past v999999999."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from codex_lab.errors import InputError
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.serve.registry_files import ChecksumError, check_version
from codex_lab.serve.registry import Registry


def model(seed: int, vocab: int) -> CodexModel:
    torch.manual_seed(seed)
    return CodexModel(ModelConfig(vocab_size=vocab, d_model=32, n_layer=1, n_head=2, max_seq_len=64)).eval()


def test_journal_symlink_is_refused_and_nothing_is_written_outside(tmp_path, small_tokenizer):
    root, victim = tmp_path / "reg", tmp_path / "victim.txt"
    reg = Registry(root)
    v1 = reg.add(model(0, small_tokenizer.vocab_size), small_tokenizer)
    reg.promote(v1)
    v2 = reg.add(model(1, small_tokenizer.vocab_size), small_tokenizer)
    victim.write_text("original\n")
    (root / "journal.log").unlink()
    (root / "journal.log").symlink_to(victim)
    with pytest.raises(InputError) as ei:
        reg.promote(v2)
    msg = str(ei.value)
    assert "journal.log" in msg and "symbolic link" in msg and "\n" not in msg, msg
    assert victim.read_text() == "original\n"  # nothing appended outside the registry
    assert reg.current() == v1  # the state did not move either
    # removing the link (the fix the message gives) lets the registry go on
    (root / "journal.log").unlink()
    reg.promote(v2)
    assert reg.current() == v2 and victim.read_text() == "original\n"


def test_lock_and_temporary_file_symlinks_are_not_followed(tmp_path, small_tokenizer):
    root = tmp_path / "reg"
    reg = Registry(root)
    v1 = reg.add(model(0, small_tokenizer.vocab_size), small_tokenizer)
    # a dangling .lock link: O_CREAT through it would create the file it names
    (root / ".lock").unlink()
    (root / ".lock").symlink_to(tmp_path / "created_outside")
    with pytest.raises(InputError, match=r"\.lock.*symbolic link"):
        Registry(root)
    assert not (tmp_path / "created_outside").exists()
    (root / ".lock").unlink()
    # a link planted under the state file's temporary name (pid-based, so guessable)
    victim = tmp_path / "victim2.txt"
    victim.write_text("original\n")
    (root / f".state.json.tmp-{os.getpid()}").symlink_to(victim)
    reg = Registry(root)
    reg.promote(v1)
    assert victim.read_text() == "original\n" and reg.current() == v1


def _racer_errors(reg_root: Path, stop: threading.Event, bad: list, counts: dict) -> None:
    """Verify every listed version again and again through its own Registry (its own lock fd)."""
    reg = Registry(reg_root)
    while not stop.is_set():
        for v in reg.versions():
            try:
                reg.verify(v)
                counts["ok"] += 1
            except ChecksumError as exc:  # a false alarm: the files were fine, only being pruned
                bad.append(f"ChecksumError: {exc}")
            except InputError:  # pruned before the lock was taken: a clean "no version ..." line
                counts["gone"] += 1
            except Exception as exc:  # noqa: BLE001 - a raw FileNotFoundError or anything else is the bug
                bad.append(f"{type(exc).__name__}: {exc}")


def test_verify_racing_prune_never_gives_false_errors(tmp_path, small_tokenizer):
    """Threads verifying while another promotes (which prunes) through separate Registry
    objects (separate lock descriptors, as separate processes have), plus one forked process
    verifying too: no ChecksumError and no raw FileNotFoundError, only passes or clean misses."""
    root = tmp_path / "reg"
    reg = Registry(root)
    m = model(0, small_tokenizer.vocab_size)
    reg.promote(reg.add(m, small_tokenizer))
    stop, bad, counts = threading.Event(), [], {"ok": 0, "gone": 0}
    threads = [threading.Thread(target=_racer_errors, args=(root, stop, bad, counts)) for _ in range(2)]
    out = tmp_path / "child.json"
    pid = os.fork()
    if pid == 0:  # a separate process verifying for the same time
        code = 0
        try:
            cbad: list = []
            ccounts = {"ok": 0, "gone": 0}
            cstop = threading.Event()
            t = threading.Thread(target=_racer_errors, args=(root, cstop, cbad, ccounts))
            t.start()
            time.sleep(4.0)
            cstop.set()
            t.join()
            out.write_text(json.dumps({"bad": cbad[:5], **ccounts}))
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    for t in threads:
        t.start()
    t0, promotions = time.time(), 0
    try:
        while time.time() - t0 < 4.0:
            reg.promote(reg.add(m, small_tokenizer))  # promote prunes the oldest version each time
            promotions += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
        _, status = os.waitpid(pid, 0)
    child = json.loads(out.read_text())
    print(f"\nverify racing prune: {promotions} promotions (each pruning), {counts['ok'] + child['ok']} verifies passed, "
          f"{counts['gone'] + child['gone']} found their version already pruned (a clean InputError), "
          f"{len(bad) + len(child['bad'])} false errors")
    assert status == 0 and child["bad"] == [], child
    assert bad == [], bad[:5]
    # the race really ran: versions were pruned under the verifiers' feet and verifies passed
    assert promotions >= 5 and counts["ok"] + child["ok"] > 10, (promotions, counts, child)


def test_version_ids_past_v999999999_are_listed_and_promotable(tmp_path, small_tokenizer):
    root = tmp_path / "reg"
    reg = Registry(root)
    m = model(0, small_tokenizer.vocab_size)
    v1 = reg.add(m, small_tokenizer)
    # move the first version to the last 9-digit id, as a long-lived registry would reach it
    old = root / "versions" / v1
    man = json.loads((old / "manifest.json").read_text())
    man["version"] = "v999999999"
    (old / "manifest.json").write_text(json.dumps(man))
    old.rename(root / "versions" / "v999999999")
    reg.promote("v999999999")
    nxt = reg.add(m, small_tokenizer)
    assert nxt == "v1000000000"
    assert reg.versions() == ["v999999999", "v1000000000"]  # by number, not as strings
    reg.promote(nxt)
    assert reg.current() == "v1000000000" and reg.history() == ["v999999999", "v1000000000"]
    assert [r["version"] for r in reg.table()] == ["v999999999", "v1000000000"]
    assert reg.rollback() == "v999999999"
    assert check_version("v" + "9" * 18) and check_version("v0001")
    for bad in ("v" + "1" * 19, "v123", "v1000000000/..", "v-1"):
        with pytest.raises(InputError):
            check_version(bad)
