"""Teacher-forced evaluation during training: the one validation loss of the package.

- :func:`val_loss`: mean next-token cross-entropy over fixed validation batches (pre-training,
  GQA uptraining, the MoE experiments, the capstone);
- :func:`task_losses`: per task of multi-task fine-tuning (lesson 05), the mean loss over each
  task's valid (answer) tokens and the share of answer tokens predicted exactly (top-1).

Generated answers scored with task metrics (expensive, at the end) are measured by
:mod:`codex_lab.infer.task_metrics`: generation belongs to ``infer``, which training never imports.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from codex_lab.training.balancing import task_stats, token_losses
from codex_lab.nn.model import CodexModel
from codex_lab.data.task_batches import Encoded, collate


@torch.no_grad()
def val_loss(model: torch.nn.Module, batches: Sequence[tuple[Tensor, Tensor]], device: torch.device | None = None) -> float:
    """Mean next-token cross-entropy (nats/token) over fixed validation ``batches`` of
    (x, y) token ids (B, T) each, in eval mode (the model's mode is restored after).

    ``device``: where the batches go (default: the model's parameters' device).
    """
    if not batches:
        raise ValueError("no validation batches; give at least one (x, y) pair")
    dev = device if device is not None else next(model.parameters()).device
    was = model.training
    model.eval()
    # L = (1 / n_batches) * sum_b mean-token cross-entropy of batch b
    losses = [float(model(x.to(dev), y.to(dev)).loss) for x, y in batches]
    model.train(was)
    return sum(losses) / len(losses)


@torch.no_grad()
def task_losses(
    model: CodexModel, encoded: dict[str, list[Encoded]], task_names: Sequence[str], *, pad_id: int, batch_size: int = 16
) -> tuple[Tensor, Tensor]:
    """Validation loss (nats per valid token) and top-1 answer-token accuracy per task, (K,) each.

    ``encoded[task]`` are the task's held-out examples; a task without examples gets NaN.
    """
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    K = len(task_names)
    loss_sum, tokens, correct = torch.zeros(K), torch.zeros(K), torch.zeros(K)
    items = [e for name in task_names for e in encoded.get(name, [])]
    for i in range(0, len(items), batch_size):
        b = collate(items[i : i + batch_size], pad_id)
        y = b.y.to(device)
        logits = model(b.x.to(device)).logits  # (B, T, V)
        tl = token_losses(logits, y)  # (B, T)
        s = task_stats(tl, y, b.task.to(device), K)
        loss_sum += s.loss_sum.cpu()
        tokens += s.tokens.cpu()
        hit = ((logits.argmax(-1) == y) & (y != -100)).sum(dim=1).float().cpu()  # (B,)
        correct += torch.nn.functional.one_hot(b.task, K).float().T @ hit
    model.train(was)
    nan = torch.full((K,), float("nan"))
    # L_k = sum of valid-token losses / valid tokens; acc_k = exact next-token hits / valid tokens
    return torch.where(tokens > 0, loss_sum / tokens.clamp(min=1), nan), torch.where(tokens > 0, correct / tokens.clamp(min=1), nan)


@torch.no_grad()
def heldout_loss(model: CodexModel, tokens: Tensor, seq_len: int = 256, batch_size: int = 32) -> tuple[float, int]:
    """Mean next-token cross-entropy (nats/token) over ALL of ``tokens`` (1-D ids), cut into
    non-overlapping windows of ``seq_len`` + 1; returns (loss, tokens scored).

    Unlike :func:`val_loss` (a few fixed batches, cheap enough to run during training) this
    scores every held-out token once, so two checkpoints compare on exactly the same text.
    """
    windows = heldout_window_losses(model, tokens, seq_len, batch_size)  # (n_win,)
    # every window holds seq_len scored tokens, so the mean over tokens = the mean of window means
    return float(windows.double().mean()), windows.numel() * seq_len


@torch.no_grad()
def heldout_window_losses(model: CodexModel, tokens: Tensor, seq_len: int = 256, batch_size: int = 32) -> Tensor:
    """The mean next-token loss (nats/token) of each window of :func:`heldout_loss`: (n_win,),
    window ``i`` = tokens ``i * seq_len .. (i + 1) * seq_len``. Their mean is the held-out loss
    (equal windows); two checkpoints with one tokenizer are compared window by window (paired)."""
    n_win = (tokens.numel() - 1) // seq_len
    if n_win < 1:
        raise ValueError(f"only {tokens.numel()} tokens, need more than seq_len + 1 = {seq_len + 1}")
    dev = next(model.parameters()).device
    was = model.training
    model.eval()
    out = []
    for s in range(0, n_win, batch_size):
        idx = torch.arange(s, min(s + batch_size, n_win)) * seq_len  # (b,) window starts
        w = tokens[idx[:, None] + torch.arange(seq_len + 1)[None, :]]  # (b, T+1)
        logits = model(w[:, :-1].to(dev)).logits.float()  # (b, T, V)
        # per-token loss = -log p(next token); per window: their mean
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), w[:, 1:].to(dev), reduction="none")  # (b, T)
        out.append(nll.mean(dim=1).cpu())
    model.train(was)
    return torch.cat(out)  # (n_win,)

