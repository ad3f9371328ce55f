"""The engine's output processing: a request's text, decoded token by token without decoding
the whole output again (:class:`IncrementalText`), the prefix that is safe to stream
(:func:`streamable`: no half character, no tail that could still become a stop string), and
the cut at a stop string (:func:`cut_at_stop`). No model code and no scheduling here.
"""

from __future__ import annotations

from typing import Callable


class IncrementalText:
    """``decode(ids)`` of a growing id list without re-decoding the whole list every token.

    ``decode`` must be a byte-level decoder (each id maps to bytes, the bytes are joined and
    read as UTF-8 with U+FFFD for bad or incomplete sequences), as
    :meth:`~codex_lab.data.tokenizer.CodeTokenizer.decode` is. The text of ``ids[:k]`` is kept
    once it ends with a complete character (its last character is not U+FFFD): a UTF-8 reader
    starts afresh after a complete character, so ``decode(ids) == decode(ids[:k]) +
    decode(ids[k:])`` and only the tail after ``k`` (usually one token) is decoded again.
    A tail ending in U+FFFD (a character split across tokens) is not kept, so the next call
    decodes it again with its missing bytes. Cost per call: the tail, not the whole output.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.k = 0  # ids whose text is kept in self.head
        self.head = ""  # decode(ids[:k]); ends with a complete character (or is empty)
        self.last = -1  # ids[k - 1]: a cheap check that the next call extends the same list

    def text(self, ids: list[int]) -> str:
        """``decode(ids)``; ``ids`` extends the list of the previous call (else start over)."""
        if len(ids) < self.k or (self.k and ids[self.k - 1] != self.last):  # not an extension: start over
            self.k, self.head = 0, ""
        tail = self.decode(ids[self.k:])
        full = self.head + tail
        if tail and not tail.endswith("\ufffd"):
            self.k, self.head, self.last = len(ids), full, ids[-1]
        return full


def streamable(text: str, stop: list[str]) -> str:
    """The prefix of ``text`` that is safe to stream: no trailing U+FFFD (a character whose
    bytes are incomplete) and no tail that could still grow into a stop string."""
    safe = text.rstrip("\ufffd")
    hold = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(safe)), hold, -1):
            if safe.endswith(s[:k]):
                hold = k
                break
    return safe[: len(safe) - hold]


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """``text`` cut before the first stop string, and whether one was found."""
    cuts = [text.find(s) for s in stop if s in text]
    return (text[: min(cuts)], True) if cuts else (text, False)
