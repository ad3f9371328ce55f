"""Lesson 00 warm-ups: characters per token (the tokenizer's compression) and where a generated
function ends (the cut the lesson's syntax check makes before parsing), and (derived) bits per character.

The check computes the expected value itself (no package helper), and when the answer is
wrong it recognises the usual mistakes (the ratio upside down, the mean of per-text ratios,
floor division, one text only) and names them.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from codex_lab.course.check_tools import as_float, pyrng
from codex_lab.course.checks import exercise

_SAMPLES = ["def f(x):\n    return x + 1\n", "import os\nprint(os.getcwd())\n", "    # indented comment\n",
            "class Point:\n    x: int = 0\n    y: int = 0\n", "# café: π ≈ 3.14159\nname = 'Zoë'\n"]


def _tokenizer() -> Any:
    from codex_lab.data.corpus import load_corpus
    from codex_lab.data.tokenizer import train_tokenizer

    return train_tokenizer(load_corpus(max_files=20).texts(), vocab_size=400)


@exercise("00", "chars_per_token", forbid=("codex_lab.data.tokenizer.tokenizer_summary",))
def check_chars_per_token(fn: Callable[..., Any]) -> None:
    """fn(tokenizer, texts) must return total characters / total tokens (a float)."""
    tok = _tokenizer()
    chars = [len(s) for s in _SAMPLES]
    tokens = [len(tok.encode(s)) for s in _SAMPLES]
    # ratio = sum_i len(text_i) / sum_i len(tokens_i), pooled over all texts
    expected = sum(chars) / sum(tokens)
    got = as_float(fn(tok, list(_SAMPLES)))
    if isinstance(got, int):
        raise AssertionError(f"got the int {got}: `//` is floor division and drops the fraction; use `/` for a float")
    assert isinstance(got, float), f"return a float, got {type(got).__name__}"
    if abs(got - expected) < 1e-9:
        assert as_float(fn(tok, ["a"])) == 1.0, "one character, one token: the ratio is 1.0"
        _drawn(fn, tok)
        return
    per_text = sum(c / t for c, t in zip(chars, tokens)) / len(chars)
    if abs(got - 1 / expected) < 1e-9:
        raise AssertionError(f"got {got:.4f} = tokens per character; expected characters per token ({expected:.4f}): "
                             "divide the characters by the tokens")
    if abs(got - per_text) < 1e-9:
        raise AssertionError(
            f"got {got:.4f}: that is the mean of the per-text ratios; pool instead: all characters of all "
            f"texts divided by all tokens of all texts ({expected:.4f})")
    if abs(got - chars[0] / tokens[0]) < 1e-9:
        raise AssertionError(f"got {got:.4f}: that is the first text only; count every text in `texts`")
    n_bytes = sum(len(s.encode("utf-8")) for s in _SAMPLES)
    if abs(got - n_bytes / sum(tokens)) < 1e-9:
        raise AssertionError("that counts UTF-8 bytes (len(text.encode())); characters are len(text): 'é' is one "
                             "character but two bytes")
    words = sum(len(s.split()) for s in _SAMPLES)
    if abs(got - sum(chars) / words) < 1e-9:
        raise AssertionError("that divides by words (str.split); count tokens with tokenizer.encode(text)")
    raise AssertionError(f"got {got:.4f}, expected {expected:.4f}: sum(len(text)) / sum(len(tokenizer.encode(text)))")


def _drawn(fn: Callable[..., Any], tok: Any) -> None:
    """Texts drawn for this grading run (lines of the samples, shuffled and cut): a ratio
    hard-coded for the fixed samples fails here."""
    r = pyrng("00.chars_per_token")
    lines = [ln for s in _SAMPLES for ln in s.splitlines(keepends=True)]
    for _ in range(3):
        texts = ["".join(r.sample(lines, r.randint(1, 4)))[: r.randint(5, 60)] or "x" for _ in range(r.randint(2, 5))]
        # ratio = sum_i len(text_i) / sum_i len(tokens_i)
        want = sum(len(t) for t in texts) / sum(len(tok.encode(t)) for t in texts)
        got = as_float(fn(tok, list(texts)))
        assert isinstance(got, float) and abs(got - want) < 1e-9, (
            f"on {len(texts)} other texts drawn for this run: got {got!r}, expected {want:.4f}; the answer must "
            "hold for any texts, not only the examples")


# ---------------------------------------------------------------- exercise 2: where the function ends

# (completion, what survives): the lesson's syntax check cuts a generated body where the function ends
_CUT_CASES = [
    ("\n    return x + 1\n\ndef g():\n    pass\n", "\n    return x + 1\n\n"),  # stop at the next top-level def
    ("    y = 2\n    return y\nprint(f(1))\n", "    y = 2\n    return y\n"),  # the first piece is part of the prompt's line
    ("x + 1\n", "x + 1\n"),  # nothing at column 0 after the first line: all kept
    ("\n\tif x:\n\t\treturn 1\n\n\treturn 0\nclass A:\n", "\n\tif x:\n\t\treturn 1\n\n\treturn 0\n"),  # tabs indent too
    ("\n    a = 1\n\n\n    b = 2", "\n    a = 1\n\n\n    b = 2"),  # blank lines inside the body, no final newline
    ("", ""),
]


def _cut_reference(completion: str) -> str:
    # keep the text up to the first newline (it continues the prompt's last line), then every line
    # until the first non-blank one that starts at column 0
    first, nl, rest = completion.partition("\n")
    out = first + nl
    for line in rest.splitlines(keepends=True):
        if line.strip() and not line[0].isspace():
            break
        out += line
    return out


def _drawn_completions(n: int) -> list[str]:
    r = pyrng("00.cut_at_function_end")
    body = ["    x = 1\n", "\tx += 2\n", "\n", "    # note\n", "        return x\n", "  \n"]
    top = ["def h():\n", "class K:\n", "print(1)\n", "@decorator\n", "x = 3\n"]
    out = []
    for _ in range(n):
        lines = [r.choice(["", "(a, b):", "x"]) + "\n"] + [r.choice(body) for _ in range(r.randint(0, 6))]
        if r.random() < 0.7:
            lines.append(r.choice(top))
            lines += [r.choice(body + top) for _ in range(r.randint(0, 3))]
        out.append("".join(lines))
    return out


@exercise("00", "cut_at_function_end", forbid=("codex_lab.infer.syntax.cut_function",))
def check_cut_at_function_end(fn: Callable[..., Any]) -> None:
    """fn(completion) keeps the completion up to the first non-blank line at column 0."""
    for completion, want in _CUT_CASES:
        got = fn(completion)
        assert isinstance(got, str), f"return the kept text as a str, got {type(got).__name__}"
        if got == want:
            continue
        shown = f"for {completion!r} expected {want!r}, got {got!r}"
        if got.startswith(want) and got[len(want):].split("\n", 1)[0].strip():
            raise AssertionError(f"{shown}: the line at column 0 starts the next statement; stop *before* it")
        if completion.startswith("\n") is False and not got.startswith(completion.partition("\n")[0]):
            raise AssertionError(f"{shown}: the text before the first newline continues the prompt's last line; "
                                 "always keep it, even when it starts at column 0")
        if want.startswith(got) and want[len(got):].split("\n", 1)[0].startswith("\t"):
            raise AssertionError(f"{shown}: a tab indents a line too (test the first character with str.isspace())")
        if want.startswith(got) and got.endswith("\n") and not want[len(got):].split("\n", 1)[0].strip():
            raise AssertionError(f"{shown}: a blank line does not end a function; only a non-blank line at column 0 does")
        if got == want.rstrip("\n") or got.replace("\n", "") == want.replace("\n", ""):
            raise AssertionError(f"{shown}: keep the newlines (str.splitlines(keepends=True)) so the text joins back exactly")
        raise AssertionError(shown)
    for completion in _drawn_completions(12):
        want = _cut_reference(completion)
        got = fn(completion)
        assert got == want, (f"on a completion drawn for this run, {completion!r}: expected {want!r}, got {got!r}; "
                             "the rule must hold for any completion, not only the examples")


@exercise("00", "bits_per_char", points=1)
def check_bits_per_char(fn: Callable[..., Any]) -> None:
    """fn(loss nats/token, chars_per_token) must return bits per character: loss / chars_per_token / ln 2."""
    r = pyrng("00.bits_per_char")  # drawn for this run: a table of answers fails
    cases = [(2.0, 3.0), (1.386, 2.5), (4.2, 1.8)] + [(r.uniform(0.5, 5.0), r.uniform(1.5, 5.0)) for _ in range(4)]
    got = []
    for loss, cpt in cases:
        x = as_float(fn(loss, cpt))
        assert isinstance(x, (float, int)) and not isinstance(x, bool), f"return a float, got {type(x).__name__}"
        got.append(float(x))

    def agrees(f: Callable[[float, float], float]) -> bool:
        # 1e-9 relative: the same three operations in another order differ by a few ulps at most
        return all(abs(g - f(lo, c)) <= 1e-9 * max(1.0, abs(f(lo, c))) for g, (lo, c) in zip(got, cases))

    # bits/char = (nats/token) / (chars/token) / ln 2
    if agrees(lambda lo, c: lo / c / math.log(2)):
        return
    mistakes = {
        "that is nats per character: one nat is 1 / ln 2 = 1.443 bits, so divide by ln 2 as well":
            lambda lo, c: lo / c,
        "that is bits per token: a token covers chars_per_token characters, so divide by it":
            lambda lo, c: lo / math.log(2),
        "bits per character are fewer than bits per token (a token covers several characters): divide by "
        "chars_per_token, do not multiply": lambda lo, c: lo * c / math.log(2),
        "that used log base 10 (bans): bits are log base 2, so divide the nats by ln 2, not ln 10":
            lambda lo, c: lo / c / math.log(10),
        "that multiplies by ln 2: nats -> bits divides by ln 2 (1 nat = 1.443 bits)":
            lambda lo, c: lo / c * math.log(2),
        "that is the perplexity per character; bits per character is the loss itself rescaled, no exp":
            lambda lo, c: math.exp(lo) / c,
    }
    for msg, f in mistakes.items():
        if agrees(f):
            raise AssertionError(f"bits_per_char: {msg}")
    (lo, c), g = cases[0], got[0]
    raise AssertionError(f"bits_per_char({lo}, {c}) returned {g:.6f}, expected {lo / c / math.log(2):.6f} "
                         "(nats per token / characters per token, then nats to bits)")
