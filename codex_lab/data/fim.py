"""Fill-in-the-middle (FIM) training data and prompts (Bavarian et al. 2022, "Efficient
Training of Language Models to Fill in the Middle").

A document is cut at two uniformly random *character* positions into prefix, middle and
suffix, and moved so the middle comes last; a left-to-right model trained on that learns to
write a middle that joins a given prefix to a given suffix. With probability ``rate`` a
document is transformed, half of those (``spm_share``) in each format:

    PSM: <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|> middle
    SPM: <|fim_prefix|> <|fim_suffix|> suffix <|fim_middle|> prefix middle

(SPM is the paper's variant of Appendix D: the prefix sits right before the middle, so both
formats share one set of sentinels.) The rest stay plain text. Every piece is encoded on its
own (:func:`fim_token_stream`), so no token spans a split point: at inference the prompt ends
exactly at a piece boundary (:func:`fim_prompt_ids`) and the model meets the same boundary it
was trained on. Long documents are first cut into chunks of about ``chunk_chars`` characters
at line ends (the paper's "context-level" FIM), so a whole FIM example fits in one training
window; consecutive plain chunks of one document stay joined, so ``rate=0`` gives exactly
:func:`codex_lab.data.batches.tokenize_texts`.
"""

from __future__ import annotations

import random
from typing import Iterable, Iterator, Literal

import torch
from torch import Tensor

from codex_lab.data.batches import DEFAULT_CHUNK_CHARS
from codex_lab.data.tokenizer import EOT, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, CodeTokenizer

FimFormat = Literal["psm", "spm"]
FIM_FORMATS: tuple[str, ...] = ("psm", "spm")
SENTINELS: tuple[str, ...] = (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE)


def _check_rates(rate: float, spm_share: float) -> None:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"fim rate must be in [0, 1] (a probability per document), got {rate}")
    if not 0.0 <= spm_share <= 1.0:
        raise ValueError(f"spm_share must be in [0, 1] (the share of FIM documents in SPM format), got {spm_share}")


def fim_split(text: str, rng: random.Random) -> tuple[str, str, str]:
    """``(prefix, middle, suffix)`` of ``text`` cut at two uniformly random character
    positions in ``[0, len(text)]`` (sorted; any of the three may be empty)."""
    a, b = sorted((rng.randint(0, len(text)), rng.randint(0, len(text))))
    return text[:a], text[a:b], text[b:]


def fim_segments(prefix: str, middle: str, suffix: str, fmt: FimFormat = "psm") -> list[str]:
    """The FIM example as pieces to encode one by one (sentinels are pieces of their own).

    ``"".join`` of the result is the example as text; empty pieces are kept out."""
    if fmt == "psm":
        parts = [FIM_PREFIX, prefix, FIM_SUFFIX, suffix, FIM_MIDDLE, middle]
    elif fmt == "spm":
        parts = [FIM_PREFIX, FIM_SUFFIX, suffix, FIM_MIDDLE, prefix, middle]
    else:
        raise ValueError(f"unknown FIM format {fmt!r}; choose one of {list(FIM_FORMATS)}")
    return [p for p in parts if p]


def fim_document(text: str, rng: random.Random, rate: float = 0.5, spm_share: float = 0.5) -> list[str]:
    """One document as pieces: ``[text]`` with probability ``1 - rate``, else a FIM example
    (SPM with probability ``spm_share``, PSM otherwise). Draws from ``rng`` only for
    transformed documents' split points and format after the one rate draw."""
    _check_rates(rate, spm_share)
    if rate == 0.0 or rng.random() >= rate:
        return [text] if text else []
    fmt: FimFormat = "spm" if rng.random() < spm_share else "psm"
    return fim_segments(*fim_split(text, rng), fmt=fmt)


def fim_transform(text: str, rng: random.Random, rate: float = 0.5, spm_share: float = 0.5) -> str:
    """:func:`fim_document` as one string (the sentinels written as their token strings)."""
    return "".join(fim_document(text, rng, rate, spm_share))


def line_chunks(text: str, max_chars: int) -> list[str]:
    """``text`` cut at line ends into consecutive chunks of at most ``max_chars`` characters
    (a single longer line is a chunk of its own); ``"".join`` of the result is ``text``."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    if len(text) <= max_chars:
        return [text] if text else []
    chunks: list[str] = []
    cur: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        if cur and size + len(line) > max_chars:
            chunks.append("".join(cur))
            cur, size = [], 0
        cur.append(line)
        size += len(line)
    if cur:
        chunks.append("".join(cur))
    return chunks


def fim_pieces(
    texts: Iterable[str], rate: float = 0.5, *, seed: int = 0, spm_share: float = 0.5, chunk_chars: int | None = None
) -> Iterator[list[str]]:
    """Per document, the pieces of the FIM training stream, ending with ``<|endoftext|>``.

    Each chunk (``line_chunks(doc, chunk_chars)``; the whole document when ``chunk_chars`` is
    None) is transformed with probability ``rate``; a transformed chunk is closed by
    ``<|endoftext|>`` (the model learns to stop after the middle) and preceded by one when
    plain text comes before it (every example starts like a document); consecutive plain
    chunks are joined back into one piece. Deterministic for a given ``seed``.
    """
    _check_rates(rate, spm_share)
    rng = random.Random(seed)
    for doc in texts:
        chunks = [doc] if chunk_chars is None else line_chunks(doc, chunk_chars)
        out: list[str] = []
        plain: list[str] = []
        for chunk in chunks:
            if not chunk:
                continue
            pieces = fim_document(chunk, rng, rate, spm_share)
            if pieces == [chunk]:
                plain.append(chunk)
                continue
            if plain:  # a FIM example is a document of its own: end the plain text before it
                out.extend(["".join(plain), EOT])
                plain = []
            out.extend(pieces)
            out.append(EOT)
        if plain:
            out.append("".join(plain))
        if not out or out[-1] != EOT:
            out.append(EOT)
        yield out


def fim_token_stream(
    tokenizer: CodeTokenizer,
    texts: Iterable[str],
    rate: float = 0.5,
    *,
    seed: int = 0,
    spm_share: float = 0.5,
    chunk_chars: int | None = None,
    group_chars: int = DEFAULT_CHUNK_CHARS,
) -> Tensor:
    """The training token stream (1-D int64, N tokens) with FIM applied: every piece of
    :func:`fim_pieces` encoded on its own and concatenated.

    With ``rate=0`` this equals ``tokenize_texts(tokenizer, texts)`` (tested). Pieces are
    encoded in groups of about ``group_chars`` characters to bound the Python lists' memory.
    """
    out: list[Tensor] = []
    group: list[str] = []
    size = 0

    def flush() -> None:
        ids = [i for enc in tokenizer.encode_batch(group) for i in enc]
        out.append(torch.tensor(ids, dtype=torch.long))  # (n,)

    for pieces in fim_pieces(texts, rate, seed=seed, spm_share=spm_share, chunk_chars=chunk_chars):
        group.extend(pieces)
        size += sum(len(p) for p in pieces)
        if size >= group_chars:
            flush()
            group, size = [], 0
    if group:
        flush()
    if not out:
        return torch.empty(0, dtype=torch.long)
    return out[0] if len(out) == 1 else torch.cat(out)  # (N,)


def fim_prompt_ids(tokenizer: CodeTokenizer, prefix: str, suffix: str, fmt: FimFormat = "psm") -> list[int]:
    """Token ids of an infilling prompt: the model continues with the middle and ends it with
    ``<|endoftext|>``. ``fmt`` is the checkpoint's ``meta["fim_format"]``.

        psm: <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|>
        spm: <|fim_prefix|> <|fim_suffix|> suffix <|fim_middle|> prefix

    Prefix and suffix are encoded separately, as in training. A prefix or suffix that
    contains a FIM sentinel string is refused (it would forge the prompt's structure).
    """
    if fmt not in FIM_FORMATS:
        raise ValueError(f"unknown FIM format {fmt!r}; choose one of {list(FIM_FORMATS)}")
    for name, text in (("prefix", prefix), ("suffix", suffix)):
        if not isinstance(text, str):
            raise TypeError(f"{name} must be a string, got {type(text).__name__}")
        bad = [s for s in (*SENTINELS, EOT) if s in text]
        if bad:
            raise ValueError(f"{name} contains the special token(s) {bad}; remove them from the text")
    pre, suf, mid = (tokenizer.token_id(s) for s in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE))
    p_ids = tokenizer.encode(prefix) if prefix else []
    s_ids = tokenizer.encode(suffix) if suffix else []
    if fmt == "psm":
        return [pre, *p_ids, suf, *s_ids, mid]
    return [pre, suf, *s_ids, mid, *p_ids]


def sentinel_ids(tokenizer: CodeTokenizer) -> list[int]:
    """Ids of the FIM sentinels (:data:`SENTINELS`) the tokenizer has, in that order."""
    return [i for i in (tokenizer.tok.token_to_id(s) for s in SENTINELS) if i is not None]


def stop_token_ids(tokenizer: CodeTokenizer) -> list[int]:
    """Where a plain (non-FIM) answer ends, end-of-text first: ``<|endoftext|>`` and the FIM
    sentinels. The one definition: ``codex-lab generate`` and the server end a request without
    ``suffix`` there (:func:`codex_lab.infer.generate.answer_end_ids`), and the exporters write it
    (the Hugging Face ``eos_token_id`` list; the GGUF's control tokens and eos / eot / FIM keys)."""
    return list(dict.fromkeys([int(tokenizer.eot_id), *sentinel_ids(tokenizer)]))

