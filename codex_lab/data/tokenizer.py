"""Byte-level BPE tokenizer for code, trained with the Hugging Face ``tokenizers`` library.

Byte-level means every string round-trips exactly (no unknown tokens), which matters for
code: indentation and odd characters must survive. Special tokens for later lessons are
reserved up front so every checkpoint shares the same ids for them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from codex_lab.errors import InputError, MissingFileError

MAX_TOKENIZER_BYTES = 64 << 20  # 64 MiB: a 100k-token BPE is ~5 MB of JSON

EOT = "<|endoftext|>"
PAD = "<|pad|>"
FIM_PREFIX = "<|fim_prefix|>"
FIM_MIDDLE = "<|fim_middle|>"
FIM_SUFFIX = "<|fim_suffix|>"
# Task tags for multi-task fine-tuning (lesson 05) and the answer separator.
TASK_TAGS = {
    "completion": "<|completion|>",
    "bugfix": "<|bugfix|>",
    "testgen": "<|testgen|>",
    "docstring": "<|docstring|>",
    "translate": "<|translate|>",
}
ANSWER = "<|answer|>"
SPECIAL_TOKENS: list[str] = [EOT, PAD, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, *TASK_TAGS.values(), ANSWER]


_FLAGS = ("add_prefix_space", "trim_offsets", "use_regex")
_TOP_KEYS = {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
             "decoder", "model"}
_ADDED_KEYS = {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}
_BPE_KEYS = {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
             "byte_fallback", "ignore_merges", "vocab", "merges"}


def _byte_level(d: object) -> bool:
    """Whether ``d`` is a ByteLevel component (pre-tokenizer, decoder, post-processor) with only
    its boolean options: its split regex is the library's built-in one, never a file's."""
    return isinstance(d, dict) and d.get("type") == "ByteLevel" and set(d) <= {"type", *_FLAGS} and all(
        isinstance(d[k], bool) for k in _FLAGS if k in d)


def check_tokenizer_json(d: object, path: str | Path) -> None:
    """Refuse a ``tokenizer.json`` that is not the shape :func:`train_tokenizer` writes, before
    the Rust library builds it: byte-level BPE, no normalizer, the ByteLevel pre-tokenizer and
    decoder with their built-in regex, a dense vocabulary ``0..n-1`` and added tokens inside it.

    A file's own regex (e.g. a catastrophically backtracking ``Split`` pattern) or normalizer
    (a ``Replace`` that multiplies the text until the process aborts) is never run, and no id
    past the vocabulary can reach a model.

    Raises:
        InputError: one line naming the file, the part that differs, and the fix.
    """
    fix = "use a tokenizer.json written by CodeTokenizer.save (re-train it: codex-lab train)"

    def bad(what: str) -> InputError:
        return InputError(f"{path}: {what}, not the course's byte-level BPE tokenizer; {fix}")

    if not isinstance(d, dict):
        raise bad(f"a JSON {type(d).__name__}, not an object")
    extra = sorted(set(d) - _TOP_KEYS)
    if extra:
        raise bad(f"unknown keys {extra[:3]}")
    for key in ("truncation", "padding", "normalizer"):
        if d.get(key) is not None:
            kind = d[key].get("type") if isinstance(d[key], dict) else type(d[key]).__name__
            raise bad(f"has a {key} ({str(kind)[:40]})")
    if not _byte_level(d.get("pre_tokenizer")):
        kind = d["pre_tokenizer"].get("type") if isinstance(d.get("pre_tokenizer"), dict) else d.get("pre_tokenizer")
        raise bad(f"pre_tokenizer is {str(kind)[:40]!r} (only ByteLevel with its built-in regex is read)")
    for key in ("decoder", "post_processor"):
        if d.get(key) is not None and not _byte_level(d[key]):
            raise bad(f"{key} is not ByteLevel")
    m = d.get("model")
    if not (isinstance(m, dict) and m.get("type") == "BPE" and set(m) <= _BPE_KEYS):
        raise bad("model is not a BPE model")
    if any(m.get(k) is not None for k in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix")):
        raise bad("model sets dropout/unk_token/prefix/suffix")
    vocab, merges = m.get("vocab"), m.get("merges")
    if not isinstance(vocab, dict) or not all(isinstance(i, int) and not isinstance(i, bool) for i in vocab.values()):
        raise bad("model.vocab is not a mapping of tokens to integer ids")
    n = len(vocab)
    if sorted(vocab.values()) != list(range(n)):
        far = max(vocab.values(), default=-1)
        raise bad(f"model.vocab ids are not 0..{n - 1} each once (largest {far})")
    pair = lambda x: (isinstance(x, str) and x.count(" ") == 1) or (  # noqa: E731
        isinstance(x, list) and len(x) == 2 and all(isinstance(t, str) for t in x))
    if not isinstance(merges, list) or len(merges) > n or not all(pair(x) for x in merges):
        raise bad("model.merges is not a list of token pairs")
    added = d.get("added_tokens", [])
    if not isinstance(added, list):
        raise bad("added_tokens is not a list")
    for a in added:
        ok = (isinstance(a, dict) and set(a) <= _ADDED_KEYS and isinstance(a.get("content"), str)
              and isinstance(a.get("id"), int) and not isinstance(a.get("id"), bool))
        if not ok:
            raise bad("an added_tokens entry is malformed")
        if not 0 <= a["id"] < n or vocab.get(a["content"]) != a["id"]:
            raise bad(f"added token {a['content'][:30]!r} has id {a['id']}, not its id in the vocabulary 0..{n - 1}")


class CodeTokenizer:
    """Thin typed wrapper over a ``tokenizers.Tokenizer`` (byte-level BPE)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        missing = [s for s in SPECIAL_TOKENS if tok.token_to_id(s) is None]
        if missing:
            raise ValueError(f"tokenizer lacks the reserved special tokens {missing}; retrain it.")
        # read once: the course never adds tokens to a built tokenizer, and ``get_vocab_size`` walks the
        # added tokens on every call (about ten microseconds: once per decoded token while streaming)
        self._vocab_size = tok.get_vocab_size()

    @property
    def vocab_size(self) -> int:
        """Number of token ids, special tokens included."""
        return self._vocab_size

    @property
    def eot_id(self) -> int:
        """Id of ``<|endoftext|>``, which separates documents and ends generations."""
        return self.token_id(EOT)

    @property
    def pad_id(self) -> int:
        """Id of ``<|pad|>``."""
        return self.token_id(PAD)

    def token_id(self, token: str) -> int:
        """Id of a (special) token; KeyError naming the token if it is unknown."""
        idx = self.tok.token_to_id(token)
        if idx is None:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return idx

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token strings inside it are recognised)."""
        return self.tok.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of many texts (parallel in Rust)."""
        return [e.ids for e in self.tok.encode_batch(list(texts))]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; byte-level, so ``decode(encode(s)) == s`` for any string.

        Raises:
            InputError: an id outside ``0..vocab_size-1`` (names it and the vocabulary size).
        """
        ids = list(ids)
        n = self.vocab_size
        bad = next((i for i in ids if not (isinstance(i, int) and 0 <= i < n)), None) if ids else None
        if bad is not None:
            raise InputError(f"token id {bad!r} is outside this tokenizer's vocabulary 0..{n - 1}; "
                             "decode ids produced by this tokenizer or a model of the same vocabulary")
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def save(self, path: str | Path) -> None:
        """Write ``tokenizer.json`` (the standard format ``transformers`` also reads)."""
        self.tok.save(str(path))

    @classmethod
    def load(cls, path: str | Path) -> "CodeTokenizer":
        """Read a ``tokenizer.json`` written by :meth:`save`.

        Raises:
            MissingFileError: no file at ``path``.
            InputError: the file is not a tokenizer (garbage, truncated, too large, or lacking the
                reserved special tokens); one line naming the file and the fix.
        """
        path = Path(path)
        fix = "re-save it with CodeTokenizer.save (or re-train: codex-lab train)"
        if not path.is_file():
            raise MissingFileError(f"no tokenizer file at {str(path)!r}; {fix}")
        try:
            size = path.stat().st_size
            if size > MAX_TOKENIZER_BYTES:
                raise InputError(f"{path}: {size:,} bytes is over the {MAX_TOKENIZER_BYTES >> 20} MiB limit for a tokenizer; {fix}")
            text = path.read_text(encoding="utf-8")
            check_tokenizer_json(json.loads(text), path)  # the course's own shape, before Rust sees it
            tok = Tokenizer.from_str(text)
        except InputError:
            raise
        except Exception as exc:  # the Rust library raises plain Exception for any bad file
            msg = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise InputError(f"{path}: not a readable tokenizer.json ({msg}); {fix}") from None
        missing = [s for s in SPECIAL_TOKENS if tok.token_to_id(s) is None]
        if missing:
            raise InputError(f"{path}: the tokenizer lacks the reserved special tokens {missing}; {fix}")
        if tok.get_vocab_size() < 256 + len(SPECIAL_TOKENS):
            raise InputError(f"{path}: {tok.get_vocab_size()} ids is too few for a byte-level tokenizer; {fix}")
        return cls(tok)

    def to_hf(self):  # -> transformers.PreTrainedTokenizerFast
        """The same tokenizer as a ``transformers.PreTrainedTokenizerFast`` (needs the hf extra)."""
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=self.tok, eos_token=EOT, pad_token=PAD)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2) -> CodeTokenizer:
    """Train a byte-level BPE tokenizer on ``texts``.

    Args:
        texts: training documents (source files).
        vocab_size: total vocabulary size, the 256 byte tokens and the special tokens included.
        min_frequency: a pair must occur this often to be merged.
    """
    n_base = 256 + len(SPECIAL_TOKENS)
    if vocab_size < n_base:
        raise ValueError(f"vocab_size must be at least {n_base} (256 bytes + special tokens), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((_bounded_runs(t) for t in texts), trainer=trainer)
    return CodeTokenizer(tok)


MAX_TRAIN_RUN = 256  # characters: the longest run without whitespace the BPE trainer sees
_LONG_RUN = re.compile(r"\S{%d,}" % (MAX_TRAIN_RUN + 1))


def _bounded_runs(text: str) -> str:
    """``text`` with runs of over 256 non-space characters cut into 256-character lines.

    The BPE trainer re-scans a whole "word" at every merge it applies there, so one
    1 MB run (a minified line, a base64 blob) costs ~merges x 1 MB and takes minutes.
    Real code almost never has such runs (3 in the whole standard library); cutting them
    only changes which pieces are counted, never the text that is later encoded.
    """
    if len(text) <= MAX_TRAIN_RUN or not _LONG_RUN.search(text):
        return text
    return _LONG_RUN.sub(lambda m: "\n".join(m[0][i : i + MAX_TRAIN_RUN] for i in range(0, len(m[0]), MAX_TRAIN_RUN)), text)


def tokenizer_summary(tok: CodeTokenizer, texts: Sequence[str]) -> dict[str, float]:
    """Characters per token over ``texts`` (higher = better compression) and vocab size."""
    n_chars = sum(len(t) for t in texts)
    n_tokens = sum(len(ids) for ids in tok.encode_batch(texts))
    # chars_per_token = total characters / total tokens
    return {"vocab_size": tok.vocab_size, "chars_per_token": n_chars / max(n_tokens, 1), "tokens": n_tokens}


