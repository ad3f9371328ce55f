"""Lesson 04 experiments, shared by the notebook and the report: train small MoE and dense
models on code, follow routing balance during training, and label code tokens by kind
(indentation, names, keywords, strings, ...) to see which experts take them.
"""

from __future__ import annotations

import io
import keyword
import time
import tokenize
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor

from codex_lab.nn.config import ModelConfig
from codex_lab.data.batches import random_batch
from codex_lab.nn.model import CodexModel
from codex_lab.nn.moe import ffn_param_counts, moe_layers_of
from codex_lab.runtime import get_device
from codex_lab.data.tokenizer import CodeTokenizer

CATEGORIES = ("indent", "name", "keyword", "string", "comment", "number", "operator", "other")


@dataclass
class RunResult:
    """One training run: per-step routing history, final validation loss and timing.

    active_params: parameters a token uses (all but the unchosen experts; the tied
    embedding counts once, as the output layer); curve: validation loss vs compute.

    history rows: step, loss (LM, nats/token) and, averaged over MoE layers: max_load
    (busiest expert / mean load; 1.0 = balanced), load_entropy (nats, log E = balanced),
    router_entropy (mean per-token router entropy, nats), drop_rate (share of assignments).
    """

    name: str
    model: CodexModel
    history: list[dict[str, float]] = field(default_factory=list)
    val_loss: float = float("nan")
    train_time_s: float = 0.0
    active_ffn_params: int = 0
    total_ffn_params: int = 0
    active_params: int = 0
    curve: list[dict[str, float]] = field(default_factory=list)


@torch.no_grad()
def val_loss(model: CodexModel, batches: Sequence[tuple[Tensor, Tensor]]) -> float:
    """Mean LM loss (nats/token) over fixed batches, in eval mode."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    out = sum(float(model(x.to(dev), y.to(dev)).loss) for x, y in batches) / len(batches)
    model.train(was)
    return out


def ffn_counts(cfg: ModelConfig) -> tuple[int, int]:
    """(active, total) feed-forward parameters per token, summed over layers."""
    active = total = 0
    for i in range(cfg.n_layer):
        if i in cfg.moe_layers:
            c = ffn_param_counts(cfg)
            active, total = active + c["active"], total + c["total"]
        else:
            assert cfg.ffn_hidden is not None
            n = 3 * cfg.d_model * cfg.ffn_hidden
            active, total = active + n, total + n
    return active, total


def train_run(name: str, cfg: ModelConfig, train_tokens: Tensor, val_batches: Sequence[tuple[Tensor, Tensor]], *,
              steps: int, batch_size: int, seq_len: int, lr: float = 3e-3, seed: int = 0,
              bias_update_rate: float = 1e-3, eval_every: int | None = None,
              device: torch.device | str | None = None) -> RunResult:
    """Train ``cfg`` from scratch with AdamW (constant ``lr`` after 10 warm-up steps).

    LM loss + the MoE layers' weighted aux losses; routing stats recorded every step.
    With ``eval_every``, ``curve`` gets (step, train_flops, val_loss) rows, where
    train_flops ~= 6 * active parameters * tokens seen (evaluation time is not counted
    in ``train_time_s``). ``device`` defaults to :func:`codex_lab.runtime.get_device`.
    """
    torch.manual_seed(seed)
    dev = torch.device(device) if device is not None else get_device()
    model = CodexModel(cfg).to(dev)
    for m in moe_layers_of(model):
        m.bias_update_rate = bias_update_rate
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    active, total = ffn_counts(cfg)
    res = RunResult(name=name, model=model, active_ffn_params=active, total_ffn_params=total,
                    active_params=model.num_params() - (total - active))
    model.train()
    t0, eval_s = time.perf_counter(), 0.0
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 10)
        x, y = random_batch(train_tokens, batch_size, seq_len, gen)  # (B, T) each
        out = model(x.to(dev), y.to(dev))
        opt.zero_grad(set_to_none=True)
        (out.loss + out.aux_loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        row = {"step": step + 1, "loss": float(out.loss.detach())}
        layers = moe_layers_of(model)
        if layers:
            stats = [m.last_stats for m in layers if m.last_stats is not None]
            row["max_load"] = sum(s.max_load_ratio for s in stats) / len(stats)
            row["load_entropy"] = sum(s.load_entropy for s in stats) / len(stats)
            row["router_entropy"] = sum(s.router_entropy for s in stats) / len(stats)
            row["drop_rate"] = sum(s.drop_rate for s in stats) / len(stats)
        res.history.append(row)
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            e0 = time.perf_counter()
            # training compute ~ 6 FLOPs per active parameter per token (forward + backward)
            flops = 6.0 * res.active_params * (step + 1) * batch_size * seq_len
            res.curve.append({"step": step + 1, "train_flops": flops, "val_loss": val_loss(model, val_batches)})
            eval_s += time.perf_counter() - e0
    res.train_time_s = time.perf_counter() - t0 - eval_s
    res.val_loss = val_loss(model, val_batches)
    if eval_every:
        res.curve.append({"step": steps, "train_flops": 6.0 * res.active_params * steps * batch_size * seq_len,
                          "val_loss": res.val_loss})
    model.eval()
    return res


def char_categories(source: str) -> list[str]:
    """A category from :data:`CATEGORIES` for every character of Python ``source``.

    Uses Python's own tokenizer: keywords vs other names, strings, comments, numbers,
    operators; leading whitespace of a line is "indent". Unparseable text -> "other".
    """
    cats = ["other"] * len(source)
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    for i, ch in enumerate(source):
        if ch in " \t\n":
            cats[i] = "indent"
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.STRING:
                kind = "string"
            elif tok.type == tokenize.COMMENT:
                kind = "comment"
            elif tok.type == tokenize.NUMBER:
                kind = "number"
            elif tok.type == tokenize.OP:
                kind = "operator"
            elif tok.type == tokenize.NAME:
                kind = "keyword" if keyword.iskeyword(tok.string) or keyword.issoftkeyword(tok.string) else "name"
            else:
                continue
            a = starts[tok.start[0] - 1] + tok.start[1]
            b = starts[tok.end[0] - 1] + tok.end[1]
            for i in range(a, min(b, len(source))):
                cats[i] = kind
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return cats


def token_categories(tokenizer: CodeTokenizer, source: str) -> tuple[list[int], list[str]]:
    """Token ids of ``source`` and each token's category.

    A token made only of whitespace is "indent"; otherwise it takes the category of its
    first non-whitespace character.
    """
    enc = tokenizer.tok.encode(source)
    chars = char_categories(source)
    cats = []
    for a, b in enc.offsets:
        piece = source[a:b]
        j = next((i for i in range(a, b) if not source[i].isspace()), None)
        cats.append("indent" if j is None or not piece.strip() else chars[j])
    return list(enc.ids), cats


@torch.no_grad()
def expert_by_category(model: CodexModel, layer: int, ids: Sequence[int], cats: Sequence[str], *,
                       window: int | None = None) -> Tensor:
    """Counts (C, E): how often tokens of each category pick each expert as first choice.

    The text is run in windows of ``window`` tokens (default: the model's max_seq_len);
    ``layer`` indexes the model's layers.
    """
    window = window or model.cfg.max_seq_len
    ffn = model.layers[layer].ffn
    E = model.cfg.n_experts
    counts = torch.zeros(len(CATEGORIES), E, dtype=torch.long)
    cat_idx = torch.tensor([CATEGORIES.index(c) for c in cats])  # (N,)
    ids_t = torch.tensor(list(ids), device=next(model.parameters()).device)  # (N,)
    model.eval()
    for s in range(0, len(ids_t), window):
        chunk = ids_t[s : s + window][None]  # (1, w)
        model(chunk)
        assert ffn.last_routing is not None, f"layer {layer} is not an MoE layer"
        first = ffn.last_routing.expert_idx[:, 0].cpu()  # (w,)
        # counts[c, e] += 1 for each token of category c whose first choice is e
        counts.index_put_((cat_idx[s : s + window], first), torch.ones_like(first), accumulate=True)
    return counts


def mutual_information(counts: Tensor) -> float:
    """I(category; expert) in nats from a (C, E) count table (0 = routing ignores kind)."""
    p = counts.double() / counts.sum()  # (C, E) joint
    pc, pe = p.sum(1, keepdim=True), p.sum(0, keepdim=True)  # (C, 1), (1, E)
    nz = p > 0
    # I = sum p(c, e) log(p(c, e) / (p(c) p(e)))
    return float((p[nz] * (p[nz] / (pc @ pe)[nz]).log()).sum())


def shuffled_mutual_information(counts: Tensor, seed: int = 0) -> float:
    """MI after randomly re-pairing categories and experts (the chance level for this N)."""
    cat = torch.repeat_interleave(torch.arange(counts.shape[0]), counts.sum(1))  # (N,)
    exp = torch.repeat_interleave(torch.arange(counts.shape[1]).repeat(counts.shape[0]), counts.reshape(-1))  # (N,)
    perm = torch.randperm(len(exp), generator=torch.Generator().manual_seed(seed))
    shuffled = torch.zeros_like(counts)
    shuffled.index_put_((cat, exp[perm]), torch.ones_like(cat), accumulate=True)
    return mutual_information(shuffled)


__all__ = [
    "CATEGORIES", "RunResult", "char_categories", "expert_by_category", "ffn_counts",
    "mutual_information", "shuffled_mutual_information", "token_categories", "train_run", "val_loss",
]
