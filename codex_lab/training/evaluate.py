"""Per-task evaluation for multi-task fine-tuning (lesson 05).

Two kinds of measurement on held-out functions:
- teacher-forced, cheap, every few steps: mean loss over each task's valid (answer)
  tokens and the share of answer tokens predicted exactly (greedy, top-1);
- generated, expensive, at the end: greedy answers scored with a task metric:
  bugfix and translate exact match, completion syntax validity + exact match, testgen
  share of generated doctest blocks that *pass* when run against the function in the
  sandbox (a separate process with limits, never in this one), docstring word-overlap F1.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from typing import Sequence

import torch
from torch import Tensor

from codex_lab.training.balancing import task_stats, token_losses
from codex_lab.infer.generate import generate_ids
from codex_lab.nn.model import CodexModel
from codex_lab.data.tasks import Encoded, TaskExample, collate, encode_example, run_doctests
from codex_lab.data.tokenizer import CodeTokenizer


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


def generate_answer(model: CodexModel, tok: CodeTokenizer, ex: TaskExample, *, max_new_tokens: int = 256) -> str:
    """Greedy answer to one example's prompt, stopped at end-of-text."""
    enc = encode_example(tok, ex, 0)
    ctx = model.cfg.max_seq_len - len(enc.prompt_ids)
    if ctx <= 0:
        raise ValueError(f"prompt of {ex.id} has {len(enc.prompt_ids)} tokens, past max_seq_len={model.cfg.max_seq_len}")
    ids, _ = generate_ids(model, enc.prompt_ids, max_new_tokens=min(max_new_tokens, ctx), temperature=0.0, eos_id=tok.eot_id)
    return tok.decode(ids)


def exact_match(pred: str, ref: str) -> bool:
    """Equal after stripping surrounding whitespace of every line and of the whole text."""
    norm = lambda s: "\n".join(line.rstrip() for line in s.strip().splitlines())  # noqa: E731
    return norm(pred) == norm(ref)


def completion_parses(prompt: str, body: str) -> bool:
    """True when signature + docstring + generated body is valid Python."""
    try:
        ast.parse(prompt + body)
    except (SyntaxError, ValueError):
        return False
    return True


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")


def overlap_f1(pred: str, ref: str) -> float:
    """Word-overlap F1 between two texts (bag of identifier-like words, case-folded)."""
    p, r = Counter(w.lower() for w in _WORD.findall(pred)), Counter(w.lower() for w in _WORD.findall(ref))
    common = sum((p & r).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(p.values()), common / sum(r.values())
    # F1 = 2 P R / (P + R)
    return 2 * precision * recall / (precision + recall)


def score_answers(examples: Sequence[TaskExample], answers: Sequence[str]) -> dict[str, float]:
    """Task metrics of generated answers (all examples must be of one task).

    Returns for completion: syntax, exact; bugfix/translate: exact; testgen: pass (share of
    generated doctest blocks with >= 1 example that all pass in the sandbox); docstring: f1.
    """
    if len(examples) != len(answers):
        raise ValueError(f"{len(examples)} examples but {len(answers)} answers")
    if not examples:
        return {}
    tasks = {e.task for e in examples}
    if len(tasks) != 1:
        raise ValueError(f"score one task at a time, got {sorted(tasks)}")
    task, n = tasks.pop(), len(examples)
    exact = sum(exact_match(a, e.answer) for e, a in zip(examples, answers)) / n
    if task == "completion":
        return {"syntax": sum(completion_parses(e.prompt, a) for e, a in zip(examples, answers)) / n, "exact": exact}
    if task == "testgen":
        ok = run_doctests([(e.context, a) for e, a in zip(examples, answers)])
        return {"pass": sum(ok) / n, "exact": exact}
    if task == "docstring":
        return {"f1": sum(overlap_f1(a, e.answer) for e, a in zip(examples, answers)) / n}
    return {"exact": exact}


def evaluate_generation(
    model: CodexModel, tok: CodeTokenizer, per_task: dict[str, list[TaskExample]], *, n_per_task: int = 8, max_new_tokens: int = 256
) -> dict[str, dict[str, float]]:
    """Generate answers for the first ``n_per_task`` held-out examples of each task and score them."""
    out: dict[str, dict[str, float]] = {}
    for task, exs in per_task.items():
        exs = list(exs)[:n_per_task]
        answers = [generate_answer(model, tok, e, max_new_tokens=max_new_tokens) for e in exs]
        out[task] = {**score_answers(exs, answers), "n": float(len(exs))}
    return out
