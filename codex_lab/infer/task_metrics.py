"""Generated answers of multi-task fine-tuning, scored with each task's metric (lesson 05).

Expensive, at the end of a run: greedy answers (:func:`codex_lab.infer.generate.generate_ids`)
to held-out prompts, scored as: bugfix and translate exact match, completion syntax validity +
exact match, testgen share of generated doctest blocks that *pass* when run against the
function in the sandbox (a separate process with limits, never in this one), docstring
word-overlap F1. The cheap teacher-forced measures are :mod:`codex_lab.training.evaluate`.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from typing import Sequence

from codex_lab.data.doctests import run_doctests
from codex_lab.data.functions import TaskExample
from codex_lab.data.task_batches import encode_example
from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.infer.generate import generate_ids
from codex_lab.nn.model import CodexModel


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
