"""Lesson 00's measurement, shared by the notebook and the report: how often the model's
generated functions parse, over enough prompts to give the rate an interval.

:func:`syntax_rate` generates greedily for every prompt through the continuous-batching
engine (lesson 06; its greedy tokens equal the plain generator's, which the engine's tests
hold), cuts each completion where the function ends and parses prompt + body: the same rule
as :func:`codex_lab.infer.syntax.syntax_validity` (the plain one-prompt-at-a-time
reference), which ``tests/test_lesson_text.py`` holds it to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.sampling import SamplingParams
from codex_lab.infer.syntax import cut_function, parses
from codex_lab.nn.model import CodexModel
from codex_lab.stats import Proportion, wilson_interval


@dataclass
class SyntaxRate:
    """``share``: functions that parse of those generated, with its Wilson 95% interval;
    ``samples``: (prompt, body, parses) per prompt, in prompt order."""

    share: Proportion
    samples: list[tuple[str, str, bool]]

    def verdict(self) -> str:
        """Where the interval lies against one half, in words (computed, not assumed)."""
        if self.share.hi < 0.5:
            return "fewer than half of its functions parse (the whole interval lies below 50%)"
        if self.share.lo > 0.5:
            return "most of its functions parse (the whole interval lies above 50%)"
        return "about half of its functions parse (the interval includes 50%)"


def syntax_rate(model: CodexModel, tokenizer: CodeTokenizer, prompts: Sequence[str], *, max_new_tokens: int = 96,
                max_batch_size: int = 16) -> SyntaxRate:
    """Greedy completions of ``prompts`` (batched by the engine) scored as in ``syntax_validity``.

    A completion counts only when it adds at least one non-blank line to the function.
    """
    if not prompts:
        raise ValueError("no prompts to score; pass at least one (codex_lab.function_prompts makes them)")
    engine = Engine(model, tokenizer, max_batch_size=max_batch_size)
    rids = [engine.submit(tokenizer.encode(p), SamplingParams(max_tokens=max_new_tokens)) for p in prompts]
    done = {f.rid: f for f in engine.run_until_done()}
    samples = []
    for prompt, rid in zip(prompts, rids):
        body = cut_function(done[rid].text)
        # an empty body would "parse" after a docstring; it must write at least one line
        samples.append((prompt, body, bool(body.strip()) and parses(prompt + body)))
    k = sum(ok for _, _, ok in samples)
    return SyntaxRate(wilson_interval(k, len(samples)), samples)
