"""How close the int8 model is to float32: measured on held-out text and greedy tokens.

:func:`int8_fidelity` compares a model with its weight-only int8 copy
(:func:`codex_lab.nn.int8.quantize_int8`) on the same held-out windows and prompts:

- **held-out loss**, non-inferiority at a declared margin (:data:`LOSS_MARGIN_NATS`): the int8
  copy keeps the quality when the one-sided 95% bound of its extra loss, paired window by
  window, is below the margin; "fails" when the lower bound is above it;
- **greedy tokens kept**: per prompt, the share of float32's greedy tokens the copy reproduces
  before its first differing one (a prompt that never diverges keeps all), judged by
  :func:`tokens_verdict`: non-inferiority against float32 (which keeps all of its own) at a
  margin of ``1 - TOKENS_KEPT_GOAL``, paired by prompt, so it holds only when the share's lower
  bound clears the goal.

Both verdicts come from :mod:`codex_lab.stats` and can come out either way (tests: a copy with its
codes perturbed fails both; synthetic shares hold, fail and stay unresolved).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from codex_lab.infer.generate import generate_ids_cached
from codex_lab.nn.model import CodexModel
from codex_lab.stats import Comparison, noninferiority
from codex_lab.training.evaluate import heldout_window_losses

# the largest extra held-out loss of the int8 copy that still counts as "kept", nats/token,
# declared before any run: a fifth of the 0.05 nats/token (a 5% higher perplexity) the course
# allows a trained design (lesson 03's margin), since quantising should cost far less than a
# change of architecture
LOSS_MARGIN_NATS = 0.01
# share of float32's greedy tokens the int8 copy must reproduce before its first differing token
TOKENS_KEPT_GOAL = 0.9


def tokens_kept(ref: Sequence[int], new: Sequence[int]) -> int:
    """How many of ``ref``'s tokens ``new`` reproduces before its first differing token."""
    n = 0
    for a, b in zip(ref, new):
        if a != b:
            break
        n += 1
    return n


def tokens_verdict(kept: Sequence[float], *, goal: float = TOKENS_KEPT_GOAL) -> Comparison:
    """Per prompt, the share of float32's greedy tokens a copy kept (0..1): does the copy keep at
    least ``goal`` of them? Non-inferiority of the copy against float32 (1.0 on every prompt),
    paired, margin ``1 - goal``: holds when the one-sided 95% upper bound of the tokens lost is
    under the margin, fails when its lower bound is over it, else not resolved (also when every
    prompt kept everything: no variance is measured, and the package never gives a zero-width holds)."""
    return noninferiority([1.0] * len(kept), list(kept), margin=1.0 - goal, higher_is_better=True, paired=True,
                          metric="share of float32's greedy tokens kept")


@torch.no_grad()
def int8_fidelity(model: CodexModel, qmodel: CodexModel, tokens: Tensor, prompts: Sequence[Sequence[int]], *,
                  seq_len: int = 256, batch_size: int = 16, new_tokens: int = 32,
                  margin: float = LOSS_MARGIN_NATS) -> dict[str, Any]:
    """``qmodel`` (the int8 copy) against ``model`` on held-out ``tokens`` (N,) and greedy
    continuations of ``prompts``: a flat record with the loss difference (nats/token), its
    non-inferiority verdict at ``margin``, and the share of greedy tokens kept."""
    T = min(seq_len, model.cfg.max_seq_len - 1)
    a = heldout_window_losses(model, tokens, seq_len=T, batch_size=batch_size).double().tolist()  # (n_win,)
    b = heldout_window_losses(qmodel, tokens, seq_len=T, batch_size=batch_size).double().tolist()
    c = noninferiority(a, b, margin=margin, metric="held-out loss (nats/token)", higher_is_better=False, paired=True)
    shares, same = [], 0
    for p in prompts:
        ref = generate_ids_cached(model, list(p), max_new_tokens=new_tokens)[0]
        new = generate_ids_cached(qmodel, list(p), max_new_tokens=new_tokens)[0]
        shares.append(tokens_kept(ref, new) / len(ref) if ref else 1.0)
        same += int(new == ref)
    t = tokens_verdict(shares)
    return {"windows": len(a), "loss_f32": sum(a) / len(a), "loss_int8": sum(b) / len(b),
            # extra loss of int8 = mean over windows of (int8 - f32), paired
            "loss_diff": c.diff, "loss_diff_lo": c.lo, "loss_diff_hi": c.hi, "margin": margin,
            "loss_verdict": c.verdict, "prompts": len(prompts), "new_tokens": new_tokens,
            # the kept share's interval = 1 + the interval of (kept - 1)
            "tokens_kept": 1.0 + t.diff, "tokens_kept_lo": 1.0 + t.lo, "tokens_kept_hi": 1.0 + t.hi,
            "prompts_identical": same, "tokens_goal": TOKENS_KEPT_GOAL, "tokens_verdict": t.verdict,
            "tokens_note": t.note}
