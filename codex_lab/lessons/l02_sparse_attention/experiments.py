"""Lesson 02 experiments: does sparse attention keep long-range code dependencies?

Small models (2-4 layers, d=32-64) are trained on the recall task of
:mod:`codex_lab.data.longrange` with one attention pattern (or a per-layer schedule) and
scored on held-out sequences (filler from the corpus' validation files) at every query
distance. Every arm of one seed starts from the same initial weights and sees the same
batches; only the patterns differ. The loss and the accuracy count the query positions only.

The arms (``ARMS``) are matched in density: every sparse pattern keeps about the fraction of
causal pairs that the window-only arm keeps at the training length (checked by
:func:`densities`), so a difference between them is where the links go, not how many there are.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from codex_lab.data.longrange import (RecallBatch, RecallTask, RecallVocab, candidates, filler_lines, make_recall_batch,
                                      recall_vocab)
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.nn.patterns import parse_pattern
from codex_lab.runtime import get_device
from codex_lab.stats import Comparison, compare

# window w = 32 (16 with global tokens) plus one far-reaching part, densities 0.116-0.150 at
# N = 1024, against a window-only arm of about the same density (window 64: 0.121)
ARMS: dict[str, str] = {
    "dense": "dense",
    "window": "window:64",
    "window+stride": "window:32+strided:16",
    "window+blockstride": "window:32+blockstride:8:16",
    "window+global": "window:16+global:64",  # the 64-token header is global: that is what global tokens are for
}


def moba_available() -> bool:
    """True when ``parse_pattern`` knows the learned ``moba:B:K`` pattern."""
    try:
        parse_pattern("moba:16:3")
    except ValueError:
        return False
    return True


WARM_ASSET = Path(__file__).resolve().parents[2] / "assets" / "l02_recall_warm.safetensors"


def _stages() -> tuple[tuple[RecallTask, int, int], ...]:
    """The warm-up curriculum: (task, steps, batch) from 128 to 1024 tokens, dense attention."""
    return ((RecallTask(seq_len=128, n_keys=4, distances=(24, 48), per_distance=1), 400, 8),
            (RecallTask(seq_len=256, n_keys=8, distances=(24, 48, 96, 160), per_distance=1), 300, 8),
            (RecallTask(seq_len=1024), 300, 4))


@dataclass(frozen=True)
class RecallConfig:
    """One experiment's sizes: model, task, training. ``fast_config()``/``full_config()`` are the modes.

    Training has two stages. Warm-up (``warm_stages``, dense attention): the model learns the
    recall mechanism on a curriculum of lengths 128 -> 256 -> 1024; from scratch at 1024 tokens
    it takes thousands of steps (attention starts uniform over ~1000 keys, so the gradient toward
    the one binding is ~1/1000 of the signal). Then every arm starts from the same warm weights,
    takes its own patterns and trains ``steps`` steps on ``task``: far queries need the pattern
    to carry the binding across the distance. ``warm_from_asset``: the warm weights come from
    ``codex_lab/assets/l02_recall_warm.safetensors`` (trained once by :func:`train_warm`, seed 0), and
    the seeds vary the arms' own steps (batches) only; otherwise each seed trains its warm-up.
    """

    task: RecallTask = field(default_factory=RecallTask)
    warm_stages: tuple[tuple[RecallTask, int, int], ...] = field(default_factory=_stages)
    warm_from_asset: bool = True
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 2
    batch: int = 4  # batch at the task's length
    steps: int = 20
    lr: float = 3e-3
    eval_sequences: int = 32
    seeds: tuple[int, ...] = (0, 1, 2)
    corpus_files: int = 40


def fast_config() -> RecallConfig:
    """CPU fast mode: 1024 tokens, 2 layers, the shipped warm start, 3 seeds."""
    return RecallConfig()


def full_config() -> RecallConfig:
    """GPU full mode: 2048 tokens, distances out to 1792, a warm-up per seed, 5 seeds."""
    task = RecallTask(seq_len=2048, distances=(24, 48, 96, 160, 320, 640, 1280, 1792))
    stages = _stages() + ((task, 300, 8),)
    return RecallConfig(task=task, warm_stages=stages, warm_from_asset=False, batch=8, steps=200, eval_sequences=128,
                        seeds=(0, 1, 2, 3, 4), corpus_files=200)


@functools.lru_cache(maxsize=4)
def task_data(n_files: int) -> tuple[RecallVocab, int, tuple[list[int], ...], tuple[list[int], ...]]:
    """The recall vocabulary, the tokenizer's size, and filler lines from ``n_files`` train
    files (training) and ``n_files // 2`` val files (evaluation: no filler line is shared)."""
    from codex_lab.data.corpus import load_corpus
    from codex_lab.training.checkpoint import load_pretrained

    tok = load_pretrained().tokenizer
    vocab = recall_vocab(tok)
    corpus = load_corpus()
    train = filler_lines(tok, corpus.texts("train")[:n_files], vocab)
    val = filler_lines(tok, corpus.texts("val")[: max(10, n_files // 2)], vocab)
    return vocab, tok.vocab_size, tuple(train), tuple(val)


def hidden_states(model: CodexModel, idx: Tensor) -> Tensor:
    """Final-norm hidden states (B, T, d) of ``model`` on positions 0..T-1 (no logits: the
    lesson scores a few query positions, and (B, T, vocab) logits would cost more than the model)."""
    B, T = idx.shape
    positions = torch.arange(T, device=idx.device).expand(B, T)  # (B, T)
    cos = model.rope_cos[positions].unsqueeze(1)  # (B, 1, T, hd)
    sin = model.rope_sin[positions].unsqueeze(1)  # (B, 1, T, hd)
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
                       max_seq_len=max(cfg.task.seq_len, *(t.seq_len for t, _, _ in cfg.warm_stages)),
                       attn_patterns=list(patterns), attn_impl=attn_impl)
    return CodexModel(mcfg)


def _on_device(batch: RecallBatch, vocab: RecallVocab, model: CodexModel) -> tuple[RecallBatch, Tensor]:
    """The batch and its candidates (B, Q, P) on the model's device."""
    dev = next(model.parameters()).device
    cand = candidates(vocab, batch.key)  # (B, Q, P), built on the CPU
    moved = replace(batch, **{f: getattr(batch, f).to(dev) for f in
                              ("tokens", "targets", "query_pos", "source_pos", "distance", "answer", "key")})
    return moved, cand.to(dev)


def _train(model: CodexModel, task: RecallTask, steps: int, batch_size: int, cfg: RecallConfig,
           gen: torch.Generator) -> None:
    """``steps`` AdamW steps on fresh recall batches (cosine decay to 10% of ``cfg.lr``)."""
    vocab, _, train_lines, _ = task_data(cfg.corpus_files)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    for step in range(steps):
        batch, cand = _on_device(make_recall_batch(train_lines, vocab, task, batch_size, gen), vocab, model)
        logits = query_logits(model, batch, cand)  # (B, Q, P)
        target = (cand == batch.answer[..., None]).float().argmax(-1)  # (B, Q) index of the answer
        # loss = mean over queries of -log p(value | sequence up to the query, value in the key's pool)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for g in opt.param_groups:  # lr = lr0 * (0.1 + 0.45 (1 + cos(pi t / steps)))
            g["lr"] = cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
        opt.step()


_WARM: dict[tuple[RecallConfig, int], dict[str, Tensor]] = {}


def train_warm(cfg: RecallConfig, seed: int) -> CodexModel:
    """The warm-up: a dense model trained through ``cfg.warm_stages`` (seeded)."""
    _, vocab_size, _, _ = task_data(cfg.corpus_files)
    torch.manual_seed(seed)
    model = build_model(["dense"] * cfg.n_layer, cfg, vocab_size).to(get_device())
    gen = torch.Generator().manual_seed(500 + seed)
    for task, steps, batch in cfg.warm_stages:
        _train(model, task, steps, batch, cfg, gen)
    return model


def save_warm(state: dict[str, Tensor]) -> None:
    """Write warm weights to ``WARM_ASSET`` (safetensors; the tied output head stored once)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in state.items() if k != "lm_head.weight"}, str(WARM_ASSET))


def warm_state(cfg: RecallConfig, seed: int) -> dict[str, Tensor]:
    """Warm weights for one seed: the shipped asset (``cfg.warm_from_asset``), else trained once
    per process by :func:`train_warm`."""
    if cfg.warm_from_asset:
        if not WARM_ASSET.exists():
            raise FileNotFoundError(f"{WARM_ASSET} is missing; rebuild it with "
                                    "`python -m codex_lab.lessons.l02_sparse_attention.experiments`")
        from safetensors.torch import load_file

        state = load_file(WARM_ASSET)
        state["lm_head.weight"] = state["embed.weight"]  # tied: stored once
        return state
    key = (cfg, seed)
    if key not in _WARM:
        _WARM[key] = {k: v.detach().cpu().clone() for k, v in train_warm(cfg, seed).state_dict().items()}
    return _WARM[key]


def train_recall(patterns: Sequence[str], cfg: RecallConfig, seed: int) -> dict[str, float]:
    """Warm model of ``seed`` -> ``patterns`` (one spec per layer) -> ``cfg.steps`` steps at
    ``cfg.task``'s length; returns accuracy per query distance on held-out sequences.

    Same seed -> same warm weights and the same batches for every arm: only the patterns differ.
    """
    vocab, vocab_size, _, val_lines = task_data(cfg.corpus_files)
    if len(patterns) != cfg.n_layer:
        raise ValueError(f"{len(patterns)} patterns for {cfg.n_layer} layers; give one spec per layer")
    model = build_model(patterns, cfg, vocab_size).to(get_device())
    model.load_state_dict(warm_state(cfg, seed))
    _train(model, cfg.task, cfg.steps, cfg.batch, cfg, torch.Generator().manual_seed(1000 + seed))
    return evaluate_recall(model, vocab, val_lines, cfg)


@torch.no_grad()
def evaluate_recall(model: CodexModel, vocab: RecallVocab, lines: Sequence[list[int]], cfg: RecallConfig) -> dict[str, float]:
    """Accuracy at each query distance on ``cfg.eval_sequences`` fixed held-out sequences."""
    model.eval()
    gen = torch.Generator().manual_seed(12345)  # the same evaluation sequences for every arm and seed
    hits: dict[int, list[float]] = {d: [] for d in cfg.task.distances}
    for _ in range(max(1, cfg.eval_sequences // cfg.batch)):
        batch, cand = _on_device(make_recall_batch(lines, vocab, cfg.task, cfg.batch, gen), vocab, model)
        pred = cand.gather(-1, query_logits(model, batch, cand).argmax(-1, keepdim=True)).squeeze(-1)  # (B, Q)
        for d in cfg.task.distances:
            hits[d] += (pred == batch.answer)[batch.distance == d].float().tolist()
    model.train()
    return {str(d): sum(h) / len(h) for d, h in hits.items()}


def densities(specs: dict[str, str], n: int) -> dict[str, float]:
    """Fraction of causal pairs each pattern keeps at length n (the matched-density check)."""
    from codex_lab.nn.moba import moba_density

    out = {}
    for name, spec in specs.items():
        if spec.startswith("moba"):
            _, b, k = spec.split(":")
            out[name] = moba_density(n, int(b), int(k))
        else:
            out[name] = 1.0 if spec == "dense" else parse_pattern(spec).density(n)
    return out


def far_accuracy(acc: dict[str, float], beyond: int) -> float:
    """Mean accuracy over the query distances > ``beyond`` (the far dependencies)."""
    far = [a for d, a in acc.items() if int(d) > beyond]
    if not far:
        raise ValueError(f"no query distance beyond {beyond}; add longer distances to the task")
    return sum(far) / len(far)


def cliff(acc: dict[str, float], chance: float) -> int | None:
    """First distance whose accuracy is below halfway between chance and the nearest distance's
    accuracy (None when accuracy never falls that far, or never rose above chance)."""
    ds = sorted(acc, key=int)
    top = acc[ds[0]]
    if top <= chance:
        return None
    half = chance + (top - chance) / 2
    return next((int(d) for d in ds if acc[d] < half), None)


def claim_verdict(far: dict[str, list[float]], base: str, arm: str, *, paired: bool = True) -> Comparison:
    """compare(): far-distance accuracy of ``arm`` against ``base`` over seeds (paired: same
    seed = same initial weights and batches)."""
    return compare(far[base], far[arm], metric=f"far accuracy, {arm} minus {base}", paired=paired)


def run_arms(arms_: dict[str, Sequence[str]], cfg: RecallConfig) -> dict[str, list[dict[str, float]]]:
    """Accuracy per distance for every arm (one pattern spec per layer) and seed.

    Seed-major order: all arms of seed 0, then of seed 1, ... so a change in machine load
    during the run falls on every arm alike.
    """
    out: dict[str, list[dict[str, float]]] = {name: [] for name in arms_}
    for seed in cfg.seeds:
        for name, patterns in arms_.items():
            out[name].append(train_recall(list(patterns), cfg, seed))
    return out


def mean_by_distance(runs: list[dict[str, float]]) -> dict[str, float]:
    """Mean over seeds of the accuracy at each distance."""
    return {d: sum(r[d] for r in runs) / len(runs) for d in runs[0]}


def reach_table(arms_: dict[str, Sequence[str]], task: RecallTask) -> dict[str, dict[str, float]]:
    """Derived receptive field: for each arm and query distance, the fraction of (binding, query)
    position pairs of the task that the stacked patterns connect (1.0 = every such pair).

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
            src = torch.tensor([4 * k + 2 for k in range(task.n_keys) if 4 * k + 2 + d < n])  # binding values
            row[str(d)] = float(r[src + d, src].float().mean())
        out[name] = row
    return out


def moba_spec_for(density: float, n: int, blocks: tuple[int, ...] = (16, 32, 64)) -> str:
    """The ``moba:B:K`` spec (B in ``blocks``, K >= 1) whose density at length n is closest to ``density``."""
    from codex_lab.nn.moba import moba_density

    best = min(((abs(moba_density(n, b, k) - density), b, k) for b in blocks for k in range(1, n // b)), key=lambda t: t[0])
    return f"moba:{best[1]}:{best[2]}"


if __name__ == "__main__":  # rebuild the shipped warm start: python -m codex_lab.lessons.l02_sparse_attention.experiments
    import json
    import time

    t0 = time.time()
    cfg = replace(fast_config(), warm_from_asset=False)
    model = train_warm(cfg, 0)
    vocab_, _, _, val_ = task_data(cfg.corpus_files)
    acc = evaluate_recall(model, vocab_, val_, cfg)
    save_warm(model.state_dict())
    meta = {"seed": 0, "stages": [[t.seq_len, s, b] for t, s, b in cfg.warm_stages], "accuracy": acc,
            "seconds": round(time.time() - t0, 1), "command": "python -m codex_lab.lessons.l02_sparse_attention.experiments"}
    WARM_ASSET.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta, indent=2))
