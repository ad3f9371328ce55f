"""A completion's text on its way out: the part that may be sent now (stop strings cut, a
possible stop string's start and an incomplete UTF-8 character held back) and OpenAI's
``finish_reason`` for the engine's reason (re-exported by :mod:`codex_lab.serve.protocol`).
"""

from __future__ import annotations


def wire_finish(reason: str) -> tuple[str, str | None]:
    """OpenAI's ``finish_reason`` for an engine reason, and the detail kept as an extension.

    OpenAI's completions only know "stop" and "length". A request cut by its deadline ends
    with "length" (it ran out of its budget, here of time) and ``finish_detail: "deadline"``,
    a field of this server that clients may ignore.
    """
    if reason in ("stop", "length"):
        return reason, None
    return "length", reason


def safe_text(text: str, stop: list[str], floor: int | None = 0, keep: bool = False) -> tuple[str, bool]:
    """The part of ``text`` that can be sent now, and whether a stop string occurred.

    A stop string cuts the text where it starts (``keep``: after it, vLLM's
    ``include_stop_str_in_output``). Only a match that ends after character ``floor`` counts
    (``min_tokens``: the text of the first tokens cannot stop the answer); ``floor=None``:
    none counts yet. Without a match, a tail that could be the start of a stop string is
    held back, and so is an incomplete UTF-8 character (U+FFFD).
    """
    if floor is not None:
        best, which = -1, ""
        for s in stop:
            at = text.find(s, max(0, floor - len(s) + 1))
            if at >= 0 and (best < 0 or at < best):
                best, which = at, s
        if best >= 0:
            return text[: best + (len(which) if keep else 0)], True
    hold = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    out = text[: len(text) - hold]
    while out.endswith("\ufffd"):
        out = out[:-1]
    return out, False
