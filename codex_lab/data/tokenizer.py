"""Byte-level BPE tokenizer for code, trained with the Hugging Face ``tokenizers`` library.

Byte-level means every string round-trips exactly (no unknown tokens), which matters for
code: indentation and odd characters must survive. Special tokens for later lessons are
reserved up front so every checkpoint shares the same ids for them.
"""

from __future__ import annotations

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


class CodeTokenizer:
    """Thin typed wrapper over a ``tokenizers.Tokenizer`` (byte-level BPE)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        missing = [s for s in SPECIAL_TOKENS if tok.token_to_id(s) is None]
        if missing:
            raise ValueError(f"tokenizer lacks the reserved special tokens {missing}; retrain it.")

    @property
    def vocab_size(self) -> int:
        """Number of token ids, special tokens included."""
        return self.tok.get_vocab_size()

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
        """Text of ``ids``; byte-level, so ``decode(encode(s)) == s`` for any string."""
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

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


