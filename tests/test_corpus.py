from pathlib import Path

import pytest

from codex_lab.data.corpus import load_corpus, split_of


def test_default_corpus_is_stdlib_and_deterministic():
    a = load_corpus(max_files=30)
    b = load_corpus(max_files=30)
    assert [f.path for f in a.files] == [f.path for f in b.files]
    assert [f.path for f in a.files] == sorted(f.path for f in a.files)
    assert any(f.path.endswith(".py") for f in a.files)
    s = a.stats()
    assert s["train_files"] + s["val_files"] == len(a.files)


def test_split_is_stable_hash():
    assert split_of("os.py", 0.05) == split_of("os.py", 0.05)
    # about 5% of many paths land in validation (binomial, n=4000: 5% +- 1% is > 4 sigma)
    share = sum(split_of(f"pkg/m{i}.py", 0.05) == "val" for i in range(4000)) / 4000
    assert 0.04 < share < 0.06


def test_dedup_undecodable_and_custom_folder(tmp_path: Path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("x = 1\n")  # exact duplicate of a.py
    (tmp_path / "c.py").write_bytes(b"s = '\xff\xfe'\n")  # not UTF-8
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.py").write_text("def f():\n    return 2\n")
    (tmp_path / "notes.txt").write_text("not code")
    c = load_corpus(tmp_path)
    assert sorted(f.path for f in c.files) == ["a.py", "sub/d.py"]
    assert c.skipped_duplicates == 1
    assert c.skipped_undecodable == ["c.py"]


def test_missing_and_empty_paths_are_clear_errors(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_corpus(tmp_path / "nope")
    with pytest.raises(ValueError, match="no readable"):
        load_corpus(tmp_path)
    (tmp_path / "f.py").write_text("x = 1\n")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_corpus(tmp_path / "f.py")


def test_hostile_folder_is_skipped_and_counted(tmp_path: Path):
    """FIFOs, sockets, symlink loops, dangling links, oversized and unreadable files: skipped, counted, no hang."""
    import os
    import socket

    (tmp_path / "good.py").write_text("x = 1\n")
    os.mkfifo(tmp_path / "fifo.py")  # reading it would block forever
    (tmp_path / "loop.py").symlink_to(tmp_path / "loop.py")  # ELOOP
    (tmp_path / "a.py").symlink_to(tmp_path / "b.py")  # a -> b -> a
    (tmp_path / "b.py").symlink_to(tmp_path / "a.py")
    (tmp_path / "dangling.py").symlink_to(tmp_path / "nowhere.py")
    (tmp_path / "dirlink").symlink_to(tmp_path)  # a folder loop: not followed
    (tmp_path / "folder.py").mkdir()  # a folder named *.py is walked, not read
    (tmp_path / "link_to_good.py").symlink_to(tmp_path / "good.py")  # a good link is read (then a duplicate)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock.py"))
    with open(tmp_path / "big.py", "wb") as f:  # 200 MB one-line file, sparse: the cap stops it unread
        f.truncate(200 * 1024 * 1024)
    (tmp_path / "medium.py").write_text("y = 2  # " + "z" * 5000 + "\n")
    (tmp_path / "locked.py").write_text("w = 3\n")
    (tmp_path / "locked.py").chmod(0)
    try:
        c = load_corpus(tmp_path, max_file_bytes=4096)
    finally:
        sock.close()
    root = os.geteuid() == 0  # root reads a mode-000 file
    assert sorted(f.path for f in c.files) == (["good.py", "locked.py"] if root else ["good.py"])
    s = c.stats()
    assert sorted(c.skipped_special) == ["fifo.py", "sock.py"]
    assert sorted(c.skipped_links) == ["a.py", "b.py", "dangling.py", "loop.py"]
    assert sorted(c.skipped_too_large) == ["big.py", "medium.py"]
    assert s["skipped_duplicates"] == 1
    assert c.skipped_unreadable == ([] if root else ["locked.py"])
    # a larger cap takes the medium file; the default (~1 MB) still refuses the 200 MB one
    c2 = load_corpus(tmp_path, max_file_bytes=10_000)
    assert "medium.py" in [f.path for f in c2.files] and c2.skipped_too_large == ["big.py"]
    assert load_corpus(tmp_path).skipped_too_large == ["big.py"]
    with pytest.raises(ValueError, match="max_file_bytes"):
        load_corpus(tmp_path, max_file_bytes=0)


def test_corpus_cli_cap_flag(tmp_path: Path, capsys):
    from codex_lab.cli import main

    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2  # " + "z" * 200 + "\n")
    assert main(["corpus", "--corpus", str(tmp_path), "--max-file-bytes", "100"]) == 0
    out = capsys.readouterr().out
    assert "skipped_too_large: 1" in out
    assert main(["corpus", "--corpus", str(tmp_path), "--max-file-bytes", "-1"]) == 2
    assert "max_file_bytes" in capsys.readouterr().err


def test_very_deep_folders_do_not_recurse(tmp_path: Path):
    import os

    deep, levels = tmp_path, []
    for _ in range(1200):  # os.walk in Python 3.11 recurses: RecursionError at ~1000 levels
        deep = deep / "d"
        os.mkdir(deep)  # (os.makedirs and shutil.rmtree recurse too)
        levels.append(deep)
    (deep / "x.py").write_text("x = 1\n")
    try:
        c = load_corpus(tmp_path)
        assert [f.path for f in c.files] == ["d/" * 1200 + "x.py"]
    finally:
        (deep / "x.py").unlink()
        for d in reversed(levels):
            d.rmdir()
