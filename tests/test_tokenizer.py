import pytest

from codex_lab.data.tokenizer import EOT, SPECIAL_TOKENS, CodeTokenizer, train_tokenizer


def test_roundtrip_and_specials(small_tokenizer: CodeTokenizer, tmp_path):
    tok = small_tokenizer
    for text in ["def f(x):\n\treturn x  # ünïcode ✓\n", "    \n\n  x=1", EOT + "print(1)"]:
        assert tok.decode(tok.encode(text)) == text
    ids = [tok.token_id(s) for s in SPECIAL_TOKENS]
    assert len(set(ids)) == len(SPECIAL_TOKENS)
    assert tok.encode(EOT) == [tok.eot_id]  # a special token is one id, never split
    tok.save(tmp_path / "t.json")
    again = CodeTokenizer.load(tmp_path / "t.json")
    assert again.encode("import os") == tok.encode("import os")
    assert tok.vocab_size == 512


def test_compresses_code(small_tokenizer, small_corpus):
    text = small_corpus.files[0].text
    # raw bytes give 1.0 character per token; even 512 - 267 = 245 merges learned on 40
    # files pack common words and indentation (measured ~1.8 here, ~3+ at vocab 4096)
    assert len(text) / len(small_tokenizer.encode(text)) > 1.5


def test_bad_vocab_size():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["x"], vocab_size=100)
    with pytest.raises(FileNotFoundError):
        CodeTokenizer.load("/nonexistent/tokenizer.json")
