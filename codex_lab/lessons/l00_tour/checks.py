"""Lesson 00 warm-up: characters per token, the tokenizer's compression."""

from __future__ import annotations

from typing import Any, Callable

from codex_lab.course.checks import exercise


@exercise("00", "chars_per_token")
def check_chars_per_token(fn: Callable[..., Any]) -> None:
    """fn(tokenizer, texts) must return total characters / total tokens."""
    from codex_lab.data.corpus import load_corpus
    from codex_lab.data.tokenizer import train_tokenizer

    texts = load_corpus(max_files=20).texts()
    tok = train_tokenizer(texts, vocab_size=400)
    samples = ["def f(x):\n    return x + 1\n", "import os\nprint(os.getcwd())\n", "    # indented comment\n"]
    expected = sum(map(len, samples)) / sum(len(tok.encode(s)) for s in samples)
    got = fn(tok, samples)
    assert isinstance(got, float), f"return a float, got {type(got).__name__}"
    assert abs(got - expected) < 1e-9, (
        f"got {got:.4f}, expected {expected:.4f}: divide the characters of all texts by the "
        "tokens of all texts (not the mean of per-text ratios)"
    )
    assert fn(tok, ["a"]) == 1.0, "one character, one token: the ratio is 1.0"
