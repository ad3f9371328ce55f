"""Lesson 04 experiments, shared by the notebook and the report: train small MoE and dense
models on code, follow routing balance during training, and label code tokens by kind
(indentation, names, keywords, strings, ...) to see which experts take them.

The quality protocol (MoE vs dense at equal active compute and at equal total parameters,
trained to a plateau) is :mod:`codex_lab.lessons.l04_moe.protocol`.
"""

from __future__ import annotations

import io
import keyword
import tokenize
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor

from codex_lab.data.batches import random_batch
from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.nn.accounting import ffn_counts
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.nn.moe import moe_layers_of
from codex_lab.runtime import get_device
from codex_lab.training.evaluate import val_loss
from codex_lab.training.loop import LoopConfig, adamw, held_tail, run_loop

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


def train_run(name: str, cfg: ModelConfig, train_tokens: Tensor, val_batches: Sequence[tuple[Tensor, Tensor]], *,
              steps: int, batch_size: int, seq_len: int, lr: float = 3e-3, seed: int = 0,
              bias_update_rate: float = 1e-3, eval_every: int | None = None, min_lr: float | None = None,
              warmup: int = 10, device: torch.device | str | None = None, flat_share: float = 0.0) -> RunResult:
    """Train ``cfg`` from scratch with the one training loop (AdamW, ``warmup`` linear warm-up
    steps, then constant ``lr``, or a cosine decay to ``min_lr`` when given; gradient norm
    clipped at 1). The cosine ends at ``steps x (1 - flat_share)`` and ``min_lr`` is held over
    the last ``flat_share`` of the steps (0: it ends at the last step; a curve whose rate is
    still falling keeps improving to the end whatever the budget, so the training-state rule
    reads a held tail, as :func:`codex_lab.training.curves.train_curve` does).

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
    loop, tail = held_tail(LoopConfig(steps=steps, lr=lr, min_lr=min_lr, warmup=warmup, weight_decay=0.0,
                                      grad_clip=1.0, eval_every=eval_every or 0), flat_share)
    opt = adamw(model, loop)
    gen = torch.Generator().manual_seed(seed)
    active, total = ffn_counts(cfg)
    res = RunResult(name=name, model=model, active_ffn_params=active, total_ffn_params=total,
                    active_params=model.num_params() - (total - active))

    def loss_fn(_: int) -> tuple[Tensor, dict[str, float]]:
        x, y = random_batch(train_tokens, batch_size, seq_len, gen)  # (B, T) each
        out = model(x.to(dev), y.to(dev))
        row = {"loss": float(out.loss.detach())}
        stats = [m.last_stats for m in moe_layers_of(model) if m.last_stats is not None]
        if stats:  # means over the MoE layers
            row["max_load"] = sum(s.max_load_ratio for s in stats) / len(stats)
            row["load_entropy"] = sum(s.load_entropy for s in stats) / len(stats)
            row["router_entropy"] = sum(s.router_entropy for s in stats) / len(stats)
            row["drop_rate"] = sum(s.drop_rate for s in stats) / len(stats)
        return out.loss + out.aux_loss, row

    def on_eval(step: int, _: dict[str, float]) -> None:
        if step < steps and step % (eval_every or steps) == 0:  # on the grid; the last point is added after training
            # training compute ~ 6 FLOPs per active parameter per token (forward + backward)
            flops = 6.0 * res.active_params * step * batch_size * seq_len
            res.curve.append({"step": step, "train_flops": flops, "val_loss": val_loss(model, val_batches)})

    model.train()
    done = run_loop(loss_fn, opt, loop, eval_fn=on_eval if eval_every else None)
    rows, secs = list(done.rows), done.train_time_s
    if tail is not None:  # the held tail: the same optimiser (its moments carry on), lr = min_lr
        more = run_loop(loss_fn, opt, tail, eval_fn=on_eval if eval_every else None, start_step=loop.steps)
        rows, secs = rows + list(more.rows), secs + more.train_time_s
    res.history = [{k: v for k, v in r.items() if k != "lr"} for r in rows]
    res.train_time_s = secs
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


__all__ = ["CATEGORIES", "RunResult", "char_categories", "expert_by_category", "mutual_information",
    "shuffled_mutual_information", "token_categories", "train_run"]
