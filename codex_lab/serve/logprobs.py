"""Log-probabilities in the completions wire format (``logprobs`` and ``echo``).

The completions API reports, per token of the returned text::

    {"tokens": ["def", " f"], "token_logprobs": [null, -1.2], "top_logprobs": [null, {" f": -1.2, " g": -2.0}],
     "text_offset": [0, 3]}

``tokens`` are each token's own text (``tokenizer.decode([id])``), ``token_logprobs`` the
natural log of its probability under the model's raw distribution (log-softmax of the
logits, before penalties and temperature: what vLLM reports by default), ``top_logprobs``
the k most likely tokens at that position, ``text_offset`` where the token's text starts in
the returned ``text``. With ``echo`` the prompt's tokens come first; the first has no
context, so its logprob and alternatives are ``null``.

Generated tokens get their entries from the engine (:func:`~codex_lab.infer.sampling.token_logprobs`
while decoding); the prompt's come from one forward pass over it (:func:`prompt_logprobs`).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import torch

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.infer.sampling import TokenLogprob

# one scoring forward at a time per process: they run beside the engine thread, on the same CPU
_SCORE_LOCK = threading.Lock()


@torch.no_grad()
def prompt_logprobs(model: Any, ids: Sequence[int], k: int) -> list[TokenLogprob | None]:
    """Each prompt token's log-probability given the tokens before it (the first: None).

    One forward over the whole prompt; ``model`` is a :class:`~codex_lab.nn.model.CodexModel`
    (its device is used), ``ids`` at most its ``max_seq_len`` tokens, ``k`` alternatives each.
    """
    dev = next(model.parameters()).device
    x = torch.tensor([list(ids)], dtype=torch.long, device=dev)  # (1, T)
    with _SCORE_LOCK:
        logits = model(x).logits[0]  # (T, V)
    # log p(ids[t] | ids[:t]) = log_softmax(logits[t - 1])[ids[t]]
    logp = torch.log_softmax(logits[:-1].float(), dim=-1).cpu()  # (T - 1, V)
    target = x[0, 1:].cpu()  # (T - 1,)
    chosen = logp.gather(1, target[:, None])[:, 0].tolist()  # (T - 1,)
    tops: list[list[tuple[int, float]]] = [[] for _ in chosen]
    if k > 0 and len(chosen):
        vals, idx = torch.topk(logp, min(k, logp.size(-1)), dim=-1)  # (T - 1, k)
        tops = [list(zip(i, v)) for i, v in zip(idx.tolist(), vals.tolist())]
    out: list[TokenLogprob | None] = [None]
    out.extend(TokenLogprob(int(t), float(lp), top) for t, lp, top in zip(target.tolist(), chosen, tops))
    return out


def token_text(tokenizer: CodeTokenizer, token: int) -> str:
    """One token's text as the wire format shows it (a partial UTF-8 character decodes to U+FFFD)."""
    return tokenizer.decode([token])


def wire_logprobs(tokenizer: CodeTokenizer, tokens: Sequence[int], entries: Sequence[TokenLogprob | None],
                  offset: int = 0) -> dict[str, list[Any]]:
    """The completions ``logprobs`` object for ``tokens`` (their entries in the same order; None for
    a token without context), text offsets counted from ``offset`` characters."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tok, e in zip(tokens, entries):
        s = token_text(tokenizer, tok)
        out["tokens"].append(s)
        out["text_offset"].append(offset)
        offset += len(s)
        if e is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(e.logprob)
        top: dict[str, float] = {}
        for t, lp in e.top:  # most likely first; two ids with one text keep the likelier
            top.setdefault(token_text(tokenizer, t), lp)
        out["top_logprobs"].append(top)
    return out


def merge_wire(a: dict[str, list[Any]] | None, b: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Two ``logprobs`` objects one after the other (echoed prompt, then the completion)."""
    if a is None:
        return b
    return {key: a[key] + b[key] for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def cumulative_logprob(entries: Sequence[TokenLogprob]) -> float:
    """Sum of the sampled tokens' log-probabilities: how ``best_of`` ranks candidates (as vLLM does)."""
    return float(sum(e.logprob for e in entries))
