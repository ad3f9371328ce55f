"""Lesson 02 experiments: does sparse attention keep long-range code dependencies?

Tiny models are trained from scratch on the recall task of :mod:`codex_lab.data.longrange`
(scattered layout: each constant is bound at a random line of real code and checked exactly
``distance`` tokens later) with one attention pattern per layer, and scored on held-out
sequences at every query distance. The geometry is shrunk *together* so that every arm
converges on a laptop: 128-token sequences (the article's 1-2k), window 12 and stride 16 (its
64-128 and 16-32), the window-only arm widened to 16 (matched density), 3 layers (one to gather
what a window sees, one to relay it, one to read it), so the window-only stack's reach
L(w - 1) = 45 tokens and the far distances (61-110) are 1.4-2.4 times it.

Protocol: for one seed every arm starts from the same initial weights (the
patterns add no parameters) and sees the same batches, and the seed also draws the held-out
evaluation sequences; so seeds vary initialisation, data order and evaluation sample, and arms
are compared paired by seed. During training :func:`codex_lab.training.loop.run_loop` calls an
evaluation every ``eval_every`` steps: the held-out accuracy over all distances is the curve the
training-state rule (:func:`codex_lab.training_state.training_state`) judges, with
``MIN_CHANGE`` = 0.02 accuracy. The loss and the accuracy count the query positions only.

Arms (:func:`arm_specs` of the config's geometry; ``MOBA``, ``SCHEDULES``): dense (the ceiling),
window-only (widened to 16 so it keeps as many causal pairs as window + stride:
:func:`densities`), and far links added to a window of 12: a token stride of 16, global tokens
at fixed positions (every 16th, Child et al.'s "fixed" columns, placed independently of the
bindings; full mode), MoBA's learned blocks (full mode). Full mode runs the article's window 128
and stride 32 on 1024-token files (:func:`full_config`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from codex_lab.data.longrange import (RecallBatch, RecallTask, RecallVocab, candidates, filler_lines, make_recall_batch,
                                      recall_vocab)
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.parallel import run_units
from codex_lab.runtime import get_device
from codex_lab.stats import HOLDS, NOT_RESOLVED, Comparison, compare, holm, judge_trained, noninferiority
from codex_lab.training.loop import LoopConfig, adamw, rates_at, run_loop
from codex_lab.training_state import TrainingState, held_floor, training_state
# the geometry (arms, sizes per mode, densities) is geometry.py's
from codex_lab.lessons.l02_sparse_attention.geometry import RecallConfig

# the smallest change of held-out accuracy the claims care about: the claimed effects are ~0.5,
# and 0.02 is about the evaluation sample's own standard error (sqrt(0.25 / 600) at 600 queries)
MIN_CHANGE = 0.02
# "strided links keep the far dependencies": window + stride may lose at most this much far
# accuracy against dense attention (declared before any run; a tenth of the ~0.5 the window alone loses)
FAR_MARGIN = 0.05


@functools.lru_cache(maxsize=4)
def task_data(n_files: int, max_line: int = 24) -> tuple[RecallVocab, int, tuple[list[int], ...], tuple[list[int], ...]]:
    """The recall vocabulary, the tokenizer's size, and filler lines (at most ``max_line``
    tokens) from ``n_files`` train files (training) and ``n_files // 2`` val files (evaluation:
    no filler line is shared)."""
    from codex_lab.data.corpus import load_corpus
    from codex_lab.training.checkpoint import load_pretrained

    tok = load_pretrained().tokenizer
    vocab = recall_vocab(tok)
    corpus = load_corpus()
    train = filler_lines(tok, corpus.texts("train")[:n_files], vocab, max_line)
    val = filler_lines(tok, corpus.texts("val")[: max(10, n_files // 2)], vocab, max_line)
    return vocab, tok.vocab_size, tuple(train), tuple(val)


def hidden_states(model: CodexModel, idx: Tensor) -> Tensor:
    """Final-norm hidden states (B, T, d) of ``model`` on positions 0..T-1 (no logits: the
    lesson scores a few query positions, and (B, T, vocab) logits would cost more than the model)."""
    B, T = idx.shape
    # one row of positions for the whole batch: masks (1, T, T) and rope tables broadcast over B
    positions = torch.arange(T, device=idx.device)[None]  # (1, T)
    cos = model.rope_cos[positions].unsqueeze(1)  # (1, 1, T, hd)
    sin = model.rope_sin[positions].unsqueeze(1)  # (1, 1, T, hd)
    x = model.embed(idx)  # (B, T, d)
    for layer in model.layers:
        x = layer(x, cos, sin, positions, None, True)
    return model.norm(x)


def query_logits(model: CodexModel, batch: RecallBatch, cand: Tensor) -> Tensor:
    """Logits (B, Q, P) of each query's candidates ``cand`` (B, Q, P): the model's own next-token
    logits (``model(tokens).logits``) at the query positions, read at the pool's token ids (a
    multiple-choice readout: chance is exactly 1/P)."""
    h = hidden_states(model, batch.tokens)  # (B, T, d)
    hq = h.gather(1, batch.query_pos[..., None].expand(-1, -1, h.shape[-1]))  # (B, Q, d)
    w = model.lm_head.weight[cand]  # (B, Q, P, d)
    return (w @ hq[..., None]).squeeze(-1)  # (B, Q, P)


def build_model(patterns: Sequence[str], cfg: RecallConfig, vocab_size: int, attn_impl: str = "sdpa") -> CodexModel:
    """A small model with one pattern spec per layer. ``attn_impl="sdpa"`` computes sparse layers
    as SDPA under the pattern's mask (the same numbers as the block kernels, which the tests hold
    equal; at these sizes the fastest on a CPU); "blocks" runs the block-sparse kernel."""
    mcfg = ModelConfig(vocab_size=vocab_size, d_model=cfg.d_model, n_layer=len(patterns), n_head=cfg.n_head,
                       ffn_hidden=cfg.ffn_hidden, max_seq_len=cfg.task.seq_len, attn_patterns=list(patterns),
                       attn_impl=attn_impl)
    return CodexModel(mcfg)


def _on_device(batch: RecallBatch, vocab: RecallVocab, model: CodexModel) -> tuple[RecallBatch, Tensor]:
    """The batch and its candidates (B, Q, P) on the model's device."""
    dev = next(model.parameters()).device
    cand = candidates(vocab, batch.key)  # (B, Q, P), built on the CPU
    moved = replace(batch, **{f: getattr(batch, f).to(dev) for f in
                              ("tokens", "targets", "query_pos", "source_pos", "distance", "answer", "key")})
    return moved, cand.to(dev)


def recall_loss(model: CodexModel, batch: RecallBatch, cand: Tensor) -> Tensor:
    """Mean over queries of -log p(answer | sequence up to the query's ',', answer in the key's pool)."""
    logits = query_logits(model, batch, cand)  # (B, Q, P)
    target = (cand == batch.answer[..., None]).float().argmax(-1)  # (B, Q) index of the answer in the pool
    # loss = mean_q -log softmax(logits_q)[target_q]
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())


@dataclass
class RecallRun:
    """One arm, one seed: ``accuracy`` per query distance (str) at the end of training on the
    seed's held-out sequences; ``curve``: (step, held-out accuracy over all distances) at every
    evaluation (the training-state rule's input); ``far_curve``: the same for distances beyond
    the window-only reach; ``seconds``: process CPU time of training and evaluation."""

    accuracy: dict[str, float]
    curve: list[tuple[int, float]]
    far_curve: list[tuple[int, float]]
    seconds: float


_STREAM: dict[tuple[RecallConfig, int], list[RecallBatch]] = {}


def train_batches(cfg: RecallConfig, seed: int) -> list[RecallBatch]:
    """The seed's ``cfg.steps`` training batches (train-file filler), drawn once and shared by
    every arm of the seed (a batch costs ~1/3 of a model step on a CPU). The last seed's are kept."""
    key = (cfg, seed)
    if key not in _STREAM:
        _STREAM.clear()
        vocab, _, train_lines, _ = task_data(cfg.corpus_files, cfg.max_line)
        gen = torch.Generator().manual_seed(1000 + seed)
        _STREAM[key] = [make_recall_batch(train_lines, vocab, cfg.task, cfg.batch, gen) for _ in range(cfg.steps)]
    return _STREAM[key]


def eval_batches(cfg: RecallConfig, seed: int) -> list[RecallBatch]:
    """The seed's held-out sequences (val-file filler): every evaluation of every arm of this
    seed scores them; another seed draws others."""
    vocab, _, _, val_lines = task_data(cfg.corpus_files, cfg.max_line)
    gen = torch.Generator().manual_seed(20_000 + seed)
    n = max(1, math.ceil(cfg.eval_sequences / cfg.batch))
    return [make_recall_batch(val_lines, vocab, cfg.task, min(cfg.batch, cfg.eval_sequences), gen) for _ in range(n)]


@torch.no_grad()
def evaluate_recall(model: CodexModel, vocab: RecallVocab, batches: Sequence[RecallBatch],
                    distances: Sequence[int]) -> dict[str, float]:
    """Accuracy at each query distance on ``batches``: the candidate with the highest logit is
    the answer (chance = 1 / pool size)."""
    was = model.training
    model.eval()
    hits: dict[int, list[float]] = {d: [] for d in distances}
    for b in batches:
        batch, cand = _on_device(b, vocab, model)
        pred = cand.gather(-1, query_logits(model, batch, cand).argmax(-1, keepdim=True)).squeeze(-1)  # (B, Q)
        for d in distances:
            hits[d] += (pred == batch.answer)[batch.distance == d].float().tolist()
    model.train(was)
    return {str(d): sum(h) / len(h) for d, h in hits.items()}


def train_recall(patterns: Sequence[str], cfg: RecallConfig, seed: int) -> RecallRun:
    """Seed -> initial weights, batches and evaluation sequences; ``patterns`` (one spec per
    layer) -> ``cfg.steps`` steps of :func:`run_loop` with an evaluation every ``cfg.eval_every``.

    Same seed -> same initial weights, the same batches and the same evaluation sequences for
    every arm: only the patterns differ.
    """
    import time

    vocab, vocab_size, _, _ = task_data(cfg.corpus_files, cfg.max_line)
    if len(patterns) != cfg.n_layer:
        raise ValueError(f"{len(patterns)} patterns for {cfg.n_layer} layers; give one spec per layer")
    t0 = time.process_time()
    torch.manual_seed(seed)
    model = build_model(patterns, cfg, vocab_size).to(get_device())
    stream = train_batches(cfg, seed)
    held_out = eval_batches(cfg, seed)
    far_d = [d for d in cfg.task.distances if d > cfg.reach]
    curve: list[tuple[int, float]] = []
    far_curve: list[tuple[int, float]] = []
    last: dict[str, float] = {}

    def loss_fn(step: int) -> tuple[Tensor, dict[str, float]]:
        batch, cand = _on_device(stream[step], vocab, model)
        return recall_loss(model, batch, cand), {}

    def eval_fn(step: int, row: dict[str, float]) -> None:
        acc = evaluate_recall(model, vocab, held_out, cfg.task.distances)
        last.clear(); last.update(acc)
        # overall = mean over distances (each distance has the same number of queries)
        curve.append((step, sum(acc.values()) / len(acc)))
        if far_d:
            far_curve.append((step, sum(acc[str(d)] for d in far_d) / len(far_d)))

    loop = recall_loop(cfg)
    run_loop(loss_fn, adamw(model, loop), loop, eval_fn=eval_fn)
    return RecallRun(dict(last), curve, far_curve, time.process_time() - t0)


def run_arms(arms_: dict[str, Sequence[str]], cfg: RecallConfig,
             progress: Callable[[str, int], None] | None = None) -> dict[str, list[RecallRun]]:
    """Every arm (one pattern spec per layer) and seed, seed-major (all arms of seed 0, then of
    seed 1, ...), one run per worker process where cores allow (:func:`codex_lab.parallel.run_units`:
    the same numbers as a loop). ``progress(arm, seed)`` after each run, in that order."""
    out: dict[str, list[RecallRun]] = {name: [] for name in arms_}
    units = [(list(patterns), cfg, seed) for seed in cfg.seeds for patterns in arms_.values()]
    labels = [(name, seed) for seed in cfg.seeds for name in arms_]
    runs = run_units(train_recall, units, names=[f"arm {n}, seed {s}" for n, s in labels])
    for (name, seed), run in zip(labels, runs):
        out[name].append(run)
        if progress is not None:
            progress(name, seed)
    return out


def chance_of(cfg: RecallConfig) -> float:
    """Accuracy of a reader that learned nothing: 1 / pool size (the candidates of a query)."""
    return 1 / len(task_data(cfg.corpus_files, cfg.max_line)[0].pools[0])


def recall_loop(cfg: RecallConfig) -> LoopConfig:
    """The schedule every arm of the recall task trains with: warm-up, then a cosine to half of
    ``lr`` (:func:`codex_lab.training_state.held_floor`): the tail the training-state rule judges
    runs at half the peak rate or more, so a flat curve there is a plateau, not a decayed rate."""
    return LoopConfig(steps=cfg.steps, lr=cfg.lr, min_lr=held_floor(cfg.lr), warmup=cfg.warmup, eval_every=cfg.eval_every)


def arm_states(results: dict[str, list[RecallRun]], cfg: RecallConfig | None = None, *,
               schedule_rates: bool = True) -> dict[str, TrainingState]:
    """The training-state rule (:func:`codex_lab.training_state.training_state`) on each arm's
    held-out accuracy curves (one per seed), with ``MIN_CHANGE`` = 0.02 accuracy; with ``cfg``,
    also its ``chance=`` (1 / pool size): a seed ending at chance "did not learn" the task. Dense
    attention, which sees every pair any sparse arm sees, is also held to the ceiling the task
    shows elsewhere (the best other arm's final accuracy): ending less than half-way from chance
    to it is a failed optimisation, not a plateau. The sparse arms are not: falling short of the
    ceiling is what a design may cost, and the comparisons measure it. With ``cfg``, the
    schedule's learning rate at each evaluation too: a flat tail at a decayed rate is not a
    plateau (the rule's ``rates``); ``schedule_rates=False`` for runs that held their rate
    (:mod:`~codex_lab.lessons.l02_sparse_attention.plateau`).
    """
    chance = chance_of(cfg) if cfg is not None else None
    finals = {k: sum(r.curve[-1][1] for r in runs) / len(runs) for k, runs in results.items() if k != "dense"}
    ceiling = max(finals.values()) if finals and chance is not None else None
    # with cfg, the schedule's rate at each evaluation: a tail at a decayed rate is not a plateau
    rates = {name: rates_at([s for s, _ in runs[0].curve], recall_loop(cfg)) for name, runs in results.items()
             } if cfg is not None and schedule_rates else {}
    return {name: training_state([r.curve for r in runs], higher_is_better=True, min_change=MIN_CHANGE, arm=name,
                                 chance=chance, ceiling=ceiling if name == "dense" else None, rates=rates.get(name))
            for name, runs in results.items()}


def far_accuracy(acc: dict[str, float], beyond: int) -> float:
    """Mean accuracy over the query distances > ``beyond`` (the far dependencies)."""
    far = [a for d, a in acc.items() if int(d) > beyond]
    if not far:
        raise ValueError(f"no query distance beyond {beyond}; add longer distances to the task")
    return sum(far) / len(far)


def near_accuracy(acc: dict[str, float], upto: int) -> float:
    """Mean accuracy over the query distances <= ``upto`` (inside the window-only reach)."""
    near = [a for d, a in acc.items() if int(d) <= upto] or [math.nan]
    return sum(near) / len(near)


def cliff(acc: dict[str, float], chance: float) -> int | None:
    """First distance below halfway from chance to the nearest distance's accuracy (or None)."""
    ds = sorted(acc, key=int)
    top = acc[ds[0]]
    if top <= chance:
        return None
    half = chance + (top - chance) / 2
    return next((int(d) for d in ds if acc[d] < half), None)


def claim_verdict(far: dict[str, list[float]], base: str, arm: str, *, paired: bool = True,
                  states: dict[str, TrainingState] | None = None) -> Comparison:
    """compare(): far-distance accuracy of ``arm`` against ``base`` over seeds (paired: same
    seed = same initial weights, batches and evaluation sequences); with ``states``, judged by
    the training-state rule (:func:`codex_lab.stats.judge_trained`)."""
    c = compare(far[base], far[arm], metric=f"far accuracy, {arm} minus {base}", paired=paired)
    return judge_trained(c, [states[base], states[arm]]) if states is not None else c


@dataclass
class Verdicts:
    """One pre-declared primary comparison per claim, the rest Holm-corrected within it."""

    states: dict[str, TrainingState]
    far: dict[str, list[float]]
    stride: Comparison  # primary: window+stride non-inferior to dense on far accuracy (margin FAR_MARGIN)
    needs_far: Comparison  # the contrast: window+stride minus window (the task needs far links)
    links: list[Comparison]  # secondary: window+global, moba vs window (Holm)
    schedule: Comparison  # primary: dense early vs sparse early, far accuracy
    schedule_more: list[Comparison]  # secondary: dense early vs all sparse (Holm)


def far_links_verdict(far: dict[str, list[float]], states: dict[str, TrainingState] | None = None, *,
                      margin: float = FAR_MARGIN) -> tuple[Comparison, Comparison]:
    """"Strided links keep the far dependencies": (primary, contrast).

    - primary: window + stride is non-inferior to dense attention on far accuracy (dense minus
      window + stride below ``margin``, paired by seed): the arm that could beat it is dense;
    - contrast: window + stride minus the window alone (superiority): the task needs far links.

    The primary "holds" only when the contrast holds too; if the window alone does as well, the
    task did not test far links and the claim is "not resolved" (the note says why).
    """
    c = noninferiority(far["dense"], far["window+stride"], margin=margin, paired=True, higher_is_better=True,
                       metric="far accuracy, window+stride against dense")
    contrast = claim_verdict(far, "window", "window+stride", states=states)
    if states is not None:
        c = judge_trained(c, [states["dense"], states["window+stride"]])
    if c.verdict == HOLDS and contrast.verdict != HOLDS:
        c = replace(c, verdict=NOT_RESOLVED, note=f"the window alone is not shown to lose the far links "
                                                 f"(contrast: {contrast.verdict}): the task did not test them")
    return c, contrast


def judge(results: dict[str, list[RecallRun]], cfg: RecallConfig,
          states: dict[str, TrainingState] | None = None) -> Verdicts:
    """States of every arm (``states``, or :func:`arm_states` on the runs' curves), then the
    pre-declared comparisons on far accuracy (paired by seed)."""
    states = arm_states(results, cfg) if states is None else states
    far = {k: [far_accuracy(r.accuracy, cfg.reach) for r in runs] for k, runs in results.items()}
    stride, needs_far = far_links_verdict(far, states)
    links = holm([claim_verdict(far, "window", k, states=states) for k in ("window+global", "moba") if k in far])
    far_sched = dict(far, **{"all sparse": far["window"]})
    st_sched = dict(states, **{"all sparse": states["window"]})
    schedule = claim_verdict(far_sched, "sparse early, dense deep", "dense early, sparse deep", states=st_sched)
    more = holm([claim_verdict(far_sched, "all sparse", "dense early, sparse deep", states=st_sched)])
    return Verdicts(states, far, stride, needs_far, links, schedule, more)


def mean_by_distance(runs: Sequence[RecallRun | dict[str, float]]) -> dict[str, float]:
    """Mean over seeds of the accuracy at each distance."""
    accs = [r.accuracy if isinstance(r, RecallRun) else r for r in runs]
    return {d: sum(a[d] for a in accs) / len(accs) for d in accs[0]}


def reach_table(arms_: dict[str, Sequence[str]], task: RecallTask) -> dict[str, dict[str, float]]:
    """Derived receptive field: for each arm and query distance d, the fraction of binding
    positions b (value token) whose query at b + d the stacked patterns connect to b (1.0 =
    every placement; the scattered layout puts b anywhere).

    Content-based patterns (moba) have no positional answer and are left out.
    """
    from codex_lab.data.longrange import reach

    n = task.seq_len
    out: dict[str, dict[str, float]] = {}
    for name, patterns in arms_.items():
        if any(str(p).startswith("moba") for p in patterns):
            continue
        r = reach(list(patterns), n)  # (n, n)
        row = {}
        for d in task.distances:
            src = (torch.arange(2, n - d) if task.layout == "scattered"
                   else torch.tensor([4 * k + 2 for k in range(task.n_keys) if 4 * k + 2 + d < n]))
            row[str(d)] = float(r[src + d, src].float().mean())
        out[name] = row
    return out
