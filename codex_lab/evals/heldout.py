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
from codex_lab.training.evaluate import heldout_loss


def score_checkpoint(ck: Checkpoint, corpus: Corpus, name: str, *, seq_len: int = 256, batch_size: int = 32,
                     prompts: int = 32, max_new_tokens: int = 96) -> dict[str, Any]:
    """One flat record for ``ck`` on ``corpus``'s validation split: ``loss_nats_per_token``
    (all held-out tokens), ``bits_per_char``, ``syntax_validity`` (``prompts`` function
    signatures, greedy bodies of up to ``max_new_tokens`` tokens) and the seconds each took."""
    texts = corpus.texts("val")
    t0 = time.perf_counter()
    tokens = tokenize_texts(ck.tokenizer, texts)  # (N,)
    loss, n = heldout_loss(ck.model, tokens, seq_len=min(seq_len, ck.model.cfg.max_seq_len - 1), batch_size=batch_size)
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
            "device": str(next(ck.model.parameters()).device), "torch": torch.__version__}
