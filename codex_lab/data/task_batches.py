"""Task examples as tokens and padded batches (lesson 05).

Prompt format (token level): ``<|task|> prompt <|answer|> answer <|endoftext|>``. Only the
answer and the end-of-text token carry loss ("valid tokens"); see :func:`collate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.data.functions import TaskExample


@dataclass(frozen=True)
class Encoded:
    """An example as token ids: ``prompt_ids`` (tag..<|answer|>) and ``answer_ids`` (..<|endoftext|>)."""

    prompt_ids: list[int]
    answer_ids: list[int]
    task: int
    id: str


def encode_example(tok: CodeTokenizer, ex: TaskExample, task_index: int) -> Encoded:
    """Token ids of one example; prompt and answer are encoded apart so the boundary is exact."""
    p = tok.encode(ex.input_text())
    a = tok.encode(ex.answer) + [tok.eot_id]
    return Encoded(p, a, task_index, ex.id)


def encode_tasks(tok: CodeTokenizer, per_task: dict[str, list[TaskExample]], task_names: Sequence[str], max_len: int) -> dict[str, list[Encoded]]:
    """Encode each task's examples, dropping those longer than ``max_len`` tokens in all."""
    out: dict[str, list[Encoded]] = {}
    for name in task_names:
        k = list(task_names).index(name)
        enc = [encode_example(tok, e, k) for e in per_task.get(name, [])]
        out[name] = [e for e in enc if len(e.prompt_ids) + len(e.answer_ids) <= max_len]
    return out


@dataclass
class Batch:
    """x (B, T) inputs, y (B, T) next-token targets with -100 on prompt and padding,
    task (B,) task index of each row, valid (B,) loss-bearing tokens per row."""

    x: Tensor
    y: Tensor
    task: Tensor
    valid: Tensor


def collate(items: Sequence[Encoded], pad_id: int) -> Batch:
    """Right-pad a list of examples into one batch; only answer tokens carry targets.

    For the sequence s = prompt + answer (length n): x = s[:-1], y = s[1:], and
    y[t] = -100 wherever s[t + 1] is a prompt token or padding.
    """
    if not items:
        raise ValueError("collate needs at least one example")
    T = max(len(e.prompt_ids) + len(e.answer_ids) for e in items) - 1
    x = torch.full((len(items), T), pad_id, dtype=torch.long)  # (B, T)
    y = torch.full((len(items), T), -100, dtype=torch.long)  # (B, T)
    for i, e in enumerate(items):
        s = e.prompt_ids + e.answer_ids
        n, p = len(s), len(e.prompt_ids)
        x[i, : n - 1] = torch.tensor(s[:-1])
        # targets s[p:] (the answer) sit at positions p-1 .. n-2
        y[i, p - 1 : n - 1] = torch.tensor(s[p:])
    task = torch.tensor([e.task for e in items], dtype=torch.long)  # (B,)
    valid = (y != -100).sum(dim=1)  # (B,)
    return Batch(x, y, task, valid)
