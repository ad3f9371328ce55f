"""Grouped-query attention (lesson 03): the lesson's experiment.

With ``n_head`` query heads and ``n_kv_head`` key/value heads, each K/V head serves a group
of ``g = n_head / n_kv_head`` query heads (g = 1: multi-head attention, MHA; g = n_head:
multi-query attention, MQA). The core pieces live in the package's layers and are
re-exported here, the names the notebook and the report use:

- KV-byte accounting: :mod:`codex_lab.nn.accounting` (:func:`kv_cache_bytes`,
  :func:`kv_bytes_per_token`, :func:`kv_saving`, :func:`measured_cache_bytes`);
- MHA -> GQA conversion by mean-pooling K/V heads (Ainslie et al. 2023):
  :mod:`codex_lab.nn.surgery` (:func:`mean_pool_heads`, :func:`mha_to_gqa`);
- uptraining: :func:`codex_lab.training.pretrain.uptrain` (the one training loop);
  validation loss: :func:`codex_lab.training.evaluate.val_loss`;
- decode speed: :func:`codex_lab.lessons.l03_gqa.bench.decode_tokens_per_s`.

What stays here is :func:`group_size_experiment`: validation loss right after conversion
and after uptraining, KV bytes per token and decode speed for several group sizes; and
:func:`group_size_verdicts`, the quality verdict per group size over several seeds
(:func:`codex_lab.stats.compare`, paired by seed).
"""

from __future__ import annotations

from typing import Sequence

from torch import Tensor

from codex_lab.lessons.l03_gqa.bench import decode_tokens_per_s
from codex_lab.nn.accounting import kv_bytes_per_token, kv_cache_bytes, kv_saving, measured_cache_bytes
from codex_lab.nn.model import CodexModel
from codex_lab.nn.surgery import mean_pool_heads, mha_to_gqa
from codex_lab.stats import Comparison, compare
from codex_lab.training.evaluate import val_loss
from codex_lab.training.pretrain import uptrain

__all__ = [
    "decode_tokens_per_s", "group_size_experiment", "group_size_verdicts", "kv_bytes_per_token", "kv_cache_bytes", "kv_saving",
    "mean_pool_heads", "measured_cache_bytes", "mha_to_gqa", "uptrain", "val_loss",
]


def group_size_experiment(
    base: CodexModel,
    train_tokens: Tensor,
    val_batches: Sequence[tuple[Tensor, Tensor]],
    *,
    group_sizes: Sequence[int] = (1, 2, 4, 8),
    steps: int = 50,
    batch_size: int = 8,
    seq_len: int = 128,
    lr: float = 1e-3,
    decode_batch: int = 8,
    decode_prompt: int = 128,
    decode_tokens: int = 32,
    seed: int = 0,
    measure_decode: bool = True,
) -> list[dict[str, float]]:
    """Convert ``base`` (MHA) to each group size, uptrain each the same number of steps.

    g = 1 is the unconverted model trained for the same extra steps: the control that
    separates "extra training" from "recovery after conversion".

    Returns:
        one record per g: ``g``, ``n_kv_head``, ``val_loss_converted`` (nats/token, right
        after mean-pooling), ``val_loss_uptrained`` (after ``steps`` steps),
        ``kv_bytes_per_token`` (of the model's dtype), ``kv_saving`` (1 - 1/g, measured from
        the bytes), ``decode_tok_s`` (cached greedy decoding, tokens/s; NaN when
        ``measure_decode`` is False, e.g. for the extra seeds of a quality verdict).
    """
    assert base.cfg.n_kv_head is not None
    if base.cfg.n_kv_head != base.cfg.n_head:
        raise ValueError("the base model must be MHA (n_kv_head == n_head) so every g starts from the same point")
    bad = [g for g in group_sizes if g < 1 or base.cfg.n_head % g]
    if bad:
        raise ValueError(f"group sizes {bad} do not divide n_head={base.cfg.n_head}; build a base with more heads")
    dtype = next(base.parameters()).dtype
    mha_bytes = kv_bytes_per_token(base.cfg, dtype)
    rows = []
    for g in group_sizes:
        model = mha_to_gqa(base, base.cfg.n_head // g)
        converted = val_loss(model, val_batches)
        uptrain(model, train_tokens, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, seed=seed)
        per_tok = kv_bytes_per_token(model.cfg, dtype)
        rows.append({
            "g": g,
            "n_kv_head": model.cfg.n_kv_head,
            "val_loss_converted": converted,
            "val_loss_uptrained": val_loss(model, val_batches),
            "kv_bytes_per_token": per_tok,
            "kv_saving": 1.0 - per_tok / mha_bytes,
            "decode_tok_s": (decode_tokens_per_s(model, batch=decode_batch, prompt_len=decode_prompt, new_tokens=decode_tokens)
                             if measure_decode else float("nan")),
        })
    return rows


def group_size_verdicts(runs: Sequence[Sequence[dict[str, float]]], *, key: str = "val_loss_uptrained",
                        ) -> dict[int, Comparison]:
    """The claim "GQA keeps MHA's quality after uptraining", judged per group size over seeds.

    ``runs``: one :func:`group_size_experiment` result per seed (each with g = 1, the MHA
    control trained equally long). For every g > 1 the per-seed losses are compared with
    g = 1's, paired by seed (same base model and data order in both arms):
    ``diff = loss(g) - loss(MHA)``, lower is better. The rule of :mod:`codex_lab.stats`:
    "holds" only if GQA is lower with the interval excluding 0; "fails" if it is higher
    with the interval excluding 0 (a measurable quality cost); else "not resolved": any cost
    is smaller than the interval's half-width at this scale.
    """
    if len(runs) < 2:
        raise ValueError(f"need at least 2 seeds (the course uses >= 3), got {len(runs)}")
    by_g = [{int(r["g"]): float(r[key]) for r in rows} for rows in runs]
    if any(1 not in d for d in by_g):
        raise ValueError("every seed needs g = 1 (the MHA control trained equally long)")
    gs = sorted(set.intersection(*(set(d) for d in by_g)) - {1})
    return {g: compare([d[1] for d in by_g], [d[g] for d in by_g], metric=f"val loss, g={g} minus MHA (nats/token)",
                       higher_is_better=False, paired=True) for g in gs}
