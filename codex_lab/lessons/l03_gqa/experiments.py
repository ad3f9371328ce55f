"""Grouped-query attention (lesson 03): the lesson's experiment.

With ``n_head`` query heads and ``n_kv_head`` key/value heads, each K/V head serves a group
of ``g = n_head / n_kv_head`` query heads (g = 1: multi-head attention, MHA; g = n_head:
multi-query attention, MQA). The core pieces live in the package's layers (import them from
there):

- KV-byte accounting: :mod:`codex_lab.nn.accounting` (:func:`kv_cache_bytes`,
  :func:`kv_bytes_per_token`, :func:`kv_saving`, :func:`measured_cache_bytes`);
- MHA -> GQA conversion by mean-pooling K/V heads (Ainslie et al. 2023):
  :mod:`codex_lab.nn.surgery` (:func:`mean_pool_heads`, :func:`mha_to_gqa`);
- uptraining: :func:`codex_lab.training.pretrain.uptrain` (the one training loop);
  validation loss: :func:`codex_lab.training.evaluate.val_loss`;
- decode speed: :func:`codex_lab.lessons.l03_gqa.bench.decode_tokens_per_s`.

What stays here is :func:`group_size_experiment`: validation loss right after conversion
and after uptraining, KV bytes per token and decode speed for several group sizes (one
base, one seed: a quick look, no verdict); and the quality protocol of Ainslie et al.
(:func:`run_protocol_seed`, :func:`protocol_verdicts`, :func:`plot_protocol`): the claim
"GQA keeps quality" judged for non-inferiority on arms whose held-out loss reached a plateau.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from codex_lab.lessons.l03_gqa.bench import decode_tokens_per_s
from codex_lab.nn.accounting import kv_bytes_per_token
from codex_lab.nn.model import CodexModel
from codex_lab.nn.surgery import mha_to_gqa
from codex_lab.stats import Comparison, holm, judge_trained, noninferiority
from codex_lab.training.evaluate import val_loss
from codex_lab.lessons.l03_gqa.sizes import ProtocolSizes, protocol_rates, schedule
from codex_lab.training_state import TrainingState, training_state
from codex_lab.training.curves import heldout_windows, small_vocab_streams
from codex_lab.training.curves import train_curve as _train_curve
from codex_lab.training.pretrain import uptrain

__all__ = ["MARGIN_NATS", "MIN_CHANGE_NATS", "ProtocolRun", "ProtocolVerdicts", "group_size_experiment",
    "heldout_sample", "plot_protocol", "protocol_data", "protocol_table", "protocol_states",
    "protocol_verdicts", "run_protocol_seed", "train_curve"]


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


# ------------------------------------------------------------------ the paper's protocol
#
# "GQA with group size 4-8 keeps quality" is a non-inferiority claim, judged the way Ainslie
# et al. (2023) measure it: an MHA base pre-trained until its held-out loss stops moving,
# mean-pooled to g = 2, 4, 8 and uptrained with about 5% of the pre-training steps (g = 1,
# the control, is the same base trained equally long), beside every g trained from scratch
# for as many steps as the MHA base. Every arm records a held-out curve (the training-state
# rule reads it); the seed draws the base's initialisation, the data order and the
# held-out windows the seed is scored on.

# The largest quality cost still called "kept", declared before any run: 0.05 nats/token is a
# perplexity ratio of exp(0.05) = 1.05 (5% more perplexity), about 1.5-2% of the losses these
# models reach (2.5-3.5 nats/token); Ainslie et al.'s uptrained GQA-8 lands within a few
# tenths of a point of MHA on their benchmarks, a cost far below a 5% perplexity change.
MARGIN_NATS = 0.05
# The smallest change of a held-out loss the training-state rule cares about: 0.01 nats/token
# (a 1% perplexity change), a fifth of the margin, so a curve still moving by less than that
# over another quarter of its run cannot move a verdict across the margin.
MIN_CHANGE_NATS = 0.01
def heldout_sample(tokens: Tensor, n_windows: int, seq_len: int, seed: int, batch_size: int = 16
                   ) -> list[tuple[Tensor, Tensor]]:
    """One seed's evaluation sample (:func:`codex_lab.training.curves.heldout_windows`, this protocol's stream)."""
    return heldout_windows(tokens, n_windows, seq_len, seed, batch_size, salt=17)


def train_curve(model: CodexModel, train_tokens: Tensor, eval_batches: Sequence[tuple[Tensor, Tensor]], *,
                weight_decay: float = 0.1, **kw: Any) -> list[tuple[float, float]]:
    """:func:`codex_lab.training.curves.train_curve` with this protocol's weight decay (0.1 on matrices)."""
    return _train_curve(model, train_tokens, eval_batches, weight_decay=weight_decay, **kw)


@dataclass
class ProtocolRun:
    """One seed of the protocol: every arm's held-out curve, ``(step, nats/token)`` pairs.

    ``base``: the MHA pre-training (also the g = 1 from-scratch arm); ``scratch[g]``: g trained
    from scratch as long as the base (``scratch[1] is base``); ``converted[g]``: the held-out
    loss right after mean-pooling the base to g; ``uptrain[g]``: the uptraining curve of g
    (steps counted from the conversion; g = 1 is the control, the base trained further).
    """

    seed: int
    base: list[tuple[float, float]]
    scratch: dict[int, list[tuple[float, float]]]
    converted: dict[int, float]
    uptrain: dict[int, list[tuple[float, float]]]
    seconds: float = 0.0
    model: CodexModel | None = None  # the pre-trained MHA base, when asked for (keep_base=True)

    def final(self, arm: str, g: int) -> float:
        """The last held-out loss of ``arm`` (``"uptrain"`` or ``"scratch"``) at group size ``g``."""
        return (self.uptrain if arm == "uptrain" else self.scratch)[g][-1][1]


def run_protocol_seed(seed: int, train_tokens: Tensor, val_tokens: Tensor, vocab_size: int, sizes: ProtocolSizes, *,
                      group_sizes: Sequence[int] = (1, 2, 4, 8), device: torch.device | None = None,
                      keep_base: bool = False) -> ProtocolRun:
    """Run the protocol for one seed (module comment above): pre-train an MHA base, convert and
    uptrain every g, train every g > 1 from scratch equally long. ``seed`` sets the
    initialisations, the data order (pre-training, from scratch and uptraining share one
    stream per seed, so the arms of a seed are paired) and the held-out windows. ``keep_base``:
    return the pre-trained base in ``ProtocolRun.model`` (for more conversions)."""
    import time

    from codex_lab.nn.config import ModelConfig

    t0 = time.perf_counter()
    dev = device or torch.device("cpu")
    s = sizes
    evals = heldout_sample(val_tokens, s.eval_windows, s.seq_len, seed)

    def build(g: int) -> CodexModel:
        torch.manual_seed(seed)  # the seed's initialisation (same draw order for every g)
        cfg = ModelConfig(vocab_size=vocab_size, d_model=s.d_model, n_layer=s.n_layer, n_head=s.n_head,
                          n_kv_head=s.n_head // g, max_seq_len=max(1024, s.seq_len))
        return CodexModel(cfg).to(dev)

    def pretrain(model: CodexModel) -> list[tuple[float, float]]:
        return train_curve(model, train_tokens, evals, **schedule(s, "pretrain"), batch_size=s.batch_size,
                           seq_len=s.seq_len, seed=seed, eval_every=s.eval_every, weight_decay=s.weight_decay)

    base = build(1)
    base_curve = pretrain(base)
    converted, up = {}, {}
    for g in group_sizes:
        model = mha_to_gqa(base, s.n_head // g)  # a copy; g = 1 copies the base unchanged
        converted[g] = val_loss(model, evals)
        # uptraining: its own schedule (schedule(s, "uptrain")); one data stream per seed
        up[g] = train_curve(model, train_tokens, evals, **schedule(s, "uptrain"), batch_size=s.batch_size,
                            seq_len=s.seq_len, seed=seed + 1_000_003, eval_every=s.uptrain_eval_every,
                            weight_decay=s.weight_decay)
    scratch = {1: base_curve}
    for g in group_sizes:
        if g != 1:
            scratch[g] = pretrain(build(g))
    return ProtocolRun(seed, base_curve, scratch, converted, up, time.perf_counter() - t0, base if keep_base else None)


def protocol_states(runs: Sequence[ProtocolRun], *, min_change: float = MIN_CHANGE_NATS,
                    sizes: ProtocolSizes | None = None) -> dict[str, TrainingState]:
    """Every arm's training state over the seeds (:func:`codex_lab.training_state.training_state`
    on the held-out loss, lower is better): ``"MHA base"`` (pre-training), ``"uptrained g=G"``
    and ``"scratch g=G"`` (g = 1 from scratch is the base). With ``sizes``, the schedule's rate
    at each evaluation too (:func:`protocol_rates`)."""
    if not runs:
        raise ValueError("no runs: give one ProtocolRun per seed")
    pre_rates = up_rates = None
    if sizes is not None:
        first_up = runs[0].uptrain[sorted(runs[0].uptrain)[0]]
        pre_rates, up_rates = protocol_rates(sizes, [st for st, _ in runs[0].base], [st for st, _ in first_up])
    out = {"MHA base": training_state([r.base for r in runs], higher_is_better=False, min_change=min_change,
                                      arm="MHA base", rates=pre_rates)}
    for g in sorted(runs[0].uptrain):
        out[f"uptrained g={g}"] = training_state([r.uptrain[g] for r in runs], higher_is_better=False,
                                                 min_change=min_change, arm=f"uptrained g={g}", rates=up_rates)
    for g in sorted(runs[0].scratch):
        if g != 1:
            out[f"scratch g={g}"] = training_state([r.scratch[g] for r in runs], higher_is_better=False,
                                                   min_change=min_change, arm=f"scratch g={g}", rates=pre_rates)
    return out


@dataclass
class ProtocolVerdicts:
    """The claim's comparisons: ``primary`` (g = 4 uptrained vs the MHA control trained equally
    long), ``secondary`` (Holm-corrected: g = 2 and 8 uptrained, g = 2, 4, 8 from scratch vs
    MHA from scratch), each judged by :func:`codex_lab.stats.judge_trained`; ``states`` every
    arm's training state."""

    primary: Comparison
    secondary: dict[str, Comparison]
    states: dict[str, TrainingState]
    margin: float


def protocol_verdicts(runs: Sequence[ProtocolRun], *, margin: float = MARGIN_NATS, min_change: float = MIN_CHANGE_NATS,
                      primary_g: int = 4, sizes: ProtocolSizes | None = None) -> ProtocolVerdicts:
    """Judge "GQA keeps MHA's quality" on the protocol's runs (one per seed, >= 3).

    Every comparison is :func:`codex_lab.stats.noninferiority` of the final held-out losses,
    paired by seed (both arms of a seed share the initialisation draw, data order and held-out
    windows), ``cost = loss(GQA) - loss(MHA)``, with ``margin`` nats/token; then
    :func:`~codex_lab.stats.judge_trained` with both arms' states (and the base's, for the
    uptrained arms: conversion starts from a plateaued base or not at all).
    """
    states = protocol_states(runs, min_change=min_change, sizes=sizes)
    gs = sorted(runs[0].uptrain)
    if 1 not in gs or primary_g not in gs:
        raise ValueError(f"the runs need g = 1 (the MHA control) and g = {primary_g} (the primary comparison); got {gs}")
    up1 = [r.final("uptrain", 1) for r in runs]

    def up(g: int) -> Comparison:
        c = noninferiority(up1, [r.final("uptrain", g) for r in runs], margin=margin, paired=True, higher_is_better=False,
                           metric=f"held-out loss, uptrained g={g} minus MHA trained equally long (nats/token)")
        return judge_trained(c, [states["MHA base"], states["uptrained g=1"], states[f"uptrained g={g}"]])

    def scratch(g: int) -> Comparison:
        c = noninferiority([r.final("scratch", 1) for r in runs], [r.final("scratch", g) for r in runs], margin=margin,
                           paired=True, higher_is_better=False,
                           metric=f"held-out loss, g={g} from scratch minus MHA from scratch (nats/token)")
        return judge_trained(c, [states["MHA base"], states[f"scratch g={g}"]])

    secondary_names, secondary = [], []
    for g in gs:
        if g not in (1, primary_g):
            secondary_names.append(f"uptrained g={g}")
            secondary.append(up(g))
    for g in sorted(runs[0].scratch):
        if g != 1:
            secondary_names.append(f"scratch g={g}")
            secondary.append(scratch(g))
    return ProtocolVerdicts(up(primary_g), dict(zip(secondary_names, holm(secondary))), states, margin)


def protocol_data(corpus: Any, sizes: ProtocolSizes) -> tuple[Tensor, Tensor, int]:
    """The protocol's token streams (:func:`codex_lab.training.curves.small_vocab_streams`):
    (train ids, val ids, vocabulary size)."""
    return small_vocab_streams(corpus, sizes.vocab_size, sizes.max_files)


def protocol_table(runs: Sequence[ProtocolRun]) -> list[str]:
    """Markdown rows: per g, the held-out loss right after pooling, after uptraining and from
    scratch at equal steps, each the mean over the seeds (nats/token)."""
    n = len(runs)
    out = ["| g | loss right after pooling | after uptraining | from scratch (equal steps) |", "|---|---|---|---|"]
    for g in sorted(runs[0].uptrain):
        conv = sum(r.converted[g] for r in runs) / n
        up = sum(r.final("uptrain", g) for r in runs) / n
        sc = sum(r.final("scratch", g) for r in runs) / n
        out.append(f"| {g} | {conv:.3f} | {up:.3f} | {sc:.3f} |")
    return out + ["", f"(mean of {n} seeds, nats/token on each seed's held-out windows)"]


def plot_protocol(runs: Sequence[ProtocolRun], *, zoom_from: float = 0.5) -> Any:
    """Held-out loss vs steps, mean over seeds: every g from scratch (solid) and every g's
    uptraining after the MHA base (dashed, from the conversion at the end of pre-training).
    Left: the whole run; right: from ``zoom_from`` of pre-training on. Returns the figure."""
    import matplotlib.pyplot as plt

    def mean_curve(curves: Sequence[Sequence[tuple[float, float]]], offset: float = 0.0) -> tuple[list[float], list[float]]:
        xs = [s + offset for s, _ in curves[0]]
        return xs, [sum(c[i][1] for c in curves) / len(curves) for i in range(len(xs))]

    p = runs[0].base[-1][0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax in axes:
        for i, g in enumerate(sorted(runs[0].scratch)):
            xs, ys = mean_curve([r.scratch[g] for r in runs])
            ax.plot(xs, ys, color=f"C{i}", label=f"g={g} from scratch" + (" (MHA base)" if g == 1 else ""))
            if g in runs[0].uptrain:
                ux, uy = mean_curve([r.uptrain[g] for r in runs], offset=p)
                ax.plot(ux, uy, "--", color=f"C{i}", marker=".", label=f"g={g} uptrained" + (" (control)" if g == 1 else ""))
        ax.set_xlabel("training steps (uptraining counted after pre-training)")
    axes[0].set_ylabel("held-out loss (nats/token)")
    lo = zoom_from * p
    tail = [v for r in runs for c in [*r.scratch.values(), *r.uptrain.values()] for s, v in c if s >= lo or c in r.uptrain.values()]
    axes[1].set_xlim(lo, max(x for r in runs for x, _ in r.uptrain[1]) + p + 5)
    axes[1].set_ylim(min(tail) - 0.02, max(tail) + 0.02)
    axes[1].set_title(f"zoom: from step {lo:g}; uptraining = {runs[0].uptrain[1][-1][0]:g} steps")
    axes[0].set_title(f"mean of {len(runs)} seeds")
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
