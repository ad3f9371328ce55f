"""Does generated code parse? Function prompts from held-out files, completions cut at the
end of the function, and the share that ``ast.parse`` accepts."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Sequence

from tqdm.auto import tqdm

from codex_lab.infer.generate import generate
from codex_lab.nn.model import CodexModel
from codex_lab.data.tokenizer import CodeTokenizer


def function_prompts(texts: Sequence[str], n: int, max_chars: int = 400) -> list[str]:
    """Up to ``n`` prompts: a top-level function's signature and docstring (if any).

    Taken from ``texts`` in order, evenly spread over all candidates, deterministic.
    """
    cands: list[str] = []
    for text in texts:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines(keepends=True)
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not node.body:
                continue
            first = node.body[0]
            has_doc = isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) and isinstance(first.value.value, str)
            end = (first.end_lineno or first.lineno) if has_doc else first.lineno - 1
            # no trailing newline: "\n" + indentation is usually ONE token in training text,
            # so a prompt that ends in "\n" forces a split the model has rarely seen
            prompt = "".join(lines[node.lineno - 1 : end]).rstrip("\n")
            if has_doc and len(node.body) < 2:
                continue  # docstring-only function: nothing to complete
            if 0 < len(prompt) <= max_chars:
                cands.append(prompt)
    if n <= 0 or not cands:
        return []
    step = max(len(cands) / n, 1.0)
    return [cands[int(i * step)] for i in range(min(n, len(cands)))]


def cut_function(completion: str) -> str:
    """Keep the completion up to the first non-blank line at column 0 (the function ended).

    The text before the completion's first newline continues the prompt's last line and
    is always kept.
    """
    first, nl, rest = completion.partition("\n")
    kept: list[str] = [first + nl]
    for line in rest.splitlines(keepends=True):
        if line.strip() and not line[0].isspace():
            break
        kept.append(line)
    return "".join(kept)


def parses(code: str) -> bool:
    """True when ``code`` is valid Python syntax."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


@dataclass
class SyntaxReport:
    """rate = parsed / n over prompt + cut completion; samples = (prompt, completion, ok)."""

    rate: float
    n: int
    samples: list[tuple[str, str, bool]]


def syntax_validity(
    model: CodexModel,
    tokenizer: CodeTokenizer,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 96,
    temperature: float = 0.0,
    seed: int = 0,
    progress: bool = True,
) -> SyntaxReport:
    """Generate a body for each prompt and measure how often prompt + body parses.

    A completion counts only when it adds at least one non-blank line to the function.
    """
    samples = []
    for i, prompt in enumerate(tqdm(prompts, desc="syntax check", disable=not progress)):
        g = generate(model, tokenizer, prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + i)
        body = cut_function(g.text)
        # an empty body would "parse" after a docstring; it must write at least one line
        samples.append((prompt, body, bool(body.strip()) and parses(prompt + body)))
    n = len(samples)
    # rate = functions that parse / functions generated
    rate = sum(ok for _, _, ok in samples) / n if n else 0.0
    return SyntaxReport(rate=rate, n=n, samples=samples)
