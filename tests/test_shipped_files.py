"""Shipped files carry no absolute path of the machine that built them (corpus root, run
folder, home directory): such paths mean nothing on a learner's machine and leak the
builder's layout. Every file under codex_lab/assets is read: text whole, safetensors by
their JSON header (the weights are raw floats, where short byte patterns occur by chance)."""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "codex_lab" / "assets"
# absolute paths of common build machines: POSIX homes and temp/work folders, Windows drives
ABSOLUTE = re.compile(r"(?<![\w.])(/work/|/home/|/root/|/tmp/|/Users/|/private/var/|[A-Za-z]:\\\\|[A-Za-z]:\\(?=[A-Za-z]))")


def readable_text(path: Path) -> str:
    """The part of a shipped file where a path could be written."""
    raw = path.read_bytes()
    if path.suffix == ".safetensors":
        (n,) = struct.unpack("<Q", raw[:8])  # header length, little-endian u64
        return raw[8 : 8 + n].decode("utf-8")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        pytest.fail(f"{path.relative_to(ROOT)} is binary and has no reader here: add one to readable_text")


SHIPPED = sorted(p for p in ASSETS.rglob("*") if p.is_file())


def test_there_are_shipped_files():
    names = {p.name for p in SHIPPED}
    assert {"meta.json", "config.json", "tokenizer.json", "model.safetensors", "timings.json"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ASSETS)))
def test_no_absolute_paths(path):
    text = readable_text(path)
    hits = sorted({m.group(0) for m in ABSOLUTE.finditer(text)})
    assert not hits, f"{path.relative_to(ROOT)} holds absolute paths starting {hits}; use relative or descriptive values"


def test_the_pattern_catches_what_it_should():
    # the scan must be able to fail: the values the shipped meta.json once held, and Windows ones
    for bad in ('"root": "/root/.pyenv/versions/3.11.7/lib/python3.11"', '"out": "/tmp/ship/tiny"',
                "/home/ana/codex", "/work/main/runs", 'C:\\\\Users\\\\ana', "C:\\Users\\ana"):
        assert ABSOLUTE.search(bad), bad
    for fine in ("runs/tiny", "codex-lab train --preset tiny --out runs/tiny", "lr 1.7e-3 / step", "https://x.org/tmp/"):
        assert not ABSOLUTE.search(fine), fine


def test_ship_script_makes_meta_portable():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from ship_checkpoint import portable_meta
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    import sysconfig

    meta = {"corpus": {"root": sysconfig.get_paths()["stdlib"], "train_files": 3},
            "train_config": {"out": "/tmp/ship/tiny", "lr": 3e-3},
            "other": ["C:\\build\\data\\x.txt", "runs/tiny"], "command": "codex-lab train --out runs/tiny"}
    clean = portable_meta(meta)
    assert "standard library" in clean["corpus"]["root"] and clean["corpus"]["train_files"] == 3
    assert clean["train_config"] == {"out": "ship/tiny", "lr": 3e-3}
    assert clean["other"] == ["x.txt", "runs/tiny"] and clean["command"] == meta["command"]
    assert not ABSOLUTE.search(json.dumps(clean))
    other_root = portable_meta({"corpus": {"root": "/home/ana/myrepo"}})
    assert other_root["corpus"]["root"] == "a folder named 'myrepo' (--corpus)"
