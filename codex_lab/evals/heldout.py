"""Compare checkpoints on the held-out corpus: the loss on every validation token and the
share of generated function bodies that parse (``codex-lab eval heldout``).

The loss is given per token (comparable only between models that share a tokenizer) and in
bits per character (comparable between any two tokenizers): bits/char = nats/token *
tokens / characters / ln 2.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from codex_lab.data.batches import tokenize_texts
from codex_lab.data.corpus import Corpus
from codex_lab.infer.syntax import function_prompts, syntax_validity
from codex_lab.training.checkpoint import Checkpoint
from codex_lab.stats import compare
from codex_lab.training.evaluate import heldout_window_losses


def score_checkpoint(ck: Checkpoint, corpus: Corpus, name: str, *, seq_len: int = 256, batch_size: int = 32,
                     prompts: int = 32, max_new_tokens: int = 96) -> dict[str, Any]:
    """One flat record for ``ck`` on ``corpus``'s validation split: ``loss_nats_per_token``
    (all held-out tokens), ``bits_per_char``, ``syntax_validity`` (``prompts`` function
    signatures, greedy bodies of up to ``max_new_tokens`` tokens) and the seconds each took."""
    texts = corpus.texts("val")
    t0 = time.perf_counter()
    tokens = tokenize_texts(ck.tokenizer, texts)  # (N,)
    T = min(seq_len, ck.model.cfg.max_seq_len - 1)
    windows = heldout_window_losses(ck.model, tokens, seq_len=T, batch_size=batch_size)  # (n_win,)
    # loss over every scored token = mean of the equal windows' means
    loss, n = float(windows.double().mean()), windows.numel() * T
    loss_s = time.perf_counter() - t0
    chars = sum(len(t) for t in texts)
    t0 = time.perf_counter()
    rep = syntax_validity(ck.model, ck.tokenizer, function_prompts(texts, prompts), max_new_tokens=max_new_tokens,
                          progress=False) if prompts else None
    return {"checkpoint": name, "params": ck.model.num_params(), "val_files": len(texts),
            "tokens_scored": n, "loss_nats_per_token": loss,
            # bits/char = nats/token * (tokens / chars) / ln 2, tokens/chars of the whole split
            "bits_per_char": loss * tokens.numel() / chars / math.log(2),
            "syntax_validity": rep.rate if rep else None, "syntax_prompts": rep.n if rep else 0, "max_new_tokens": max_new_tokens,
            "loss_s": loss_s, "syntax_s": time.perf_counter() - t0,
            "device": str(next(ck.model.parameters()).device), "torch": torch.__version__,
            # per-unit values for paired comparisons (:func:`paired_verdicts`), not printed
            "_windows": windows.tolist(), "_bits_per_nat_token": tokens.numel() / chars / math.log(2),
            "_syntax_ok": [ok for _, _, ok in rep.samples] if rep else []}


def paired_verdicts(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Is ``new`` better than ``base`` (two :func:`score_checkpoint` records on the same corpus)?

    - bits/char: the difference new - base over the same held-out windows (paired; one
      tokenizer, so the windows hold the same text), in bits/char, with its 95% interval;
      lower is better, so "holds" means the whole interval is below 0;
    - syntax validity: new - base over the same prompts (paired 0/1 outcomes), with its 95%
      interval; "holds" means the whole interval is above 0.
    Verdicts: ``codex_lab.stats`` (holds / fails / not resolved). A flat dict of both.
    """
    out: dict[str, Any] = {"base": base["checkpoint"], "new": new["checkpoint"]}
    wa, wb = base["_windows"], new["_windows"]
    if len(wa) == len(wb) and len(wa) >= 2 and base["tokens_scored"] == new["tokens_scored"]:
        k = base["_bits_per_nat_token"]  # bits/char per nat/token (the same tokenizer: the same factor)
        c = compare([x * k for x in wa], [x * k for x in wb], metric="bits/char", higher_is_better=False, paired=True)
        out.update(bits_per_char_diff=c.diff, bits_per_char_lo=c.lo, bits_per_char_hi=c.hi, bits_per_char_verdict=c.verdict,
                   windows=len(wa))
    else:
        out["bits_per_char_verdict"] = "not compared (different tokenizers or window counts)"
    sa, sb = base["_syntax_ok"], new["_syntax_ok"]
    if len(sa) == len(sb) and len(sa) >= 2:
        c = compare([float(x) for x in sa], [float(x) for x in sb], metric="syntax validity", paired=True)
        out.update(syntax_diff=c.diff, syntax_lo=c.lo, syntax_hi=c.hi, syntax_verdict=c.verdict, prompts=len(sa))
    else:
        out["syntax_verdict"] = "not compared (different prompt counts)"
    return out
