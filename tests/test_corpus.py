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
