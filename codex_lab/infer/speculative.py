"""Speculative decoding (greedy): a cheap draft model guesses, the target model checks.

Each round the draft proposes ``gamma`` tokens one by one; the target runs ONE forward over
the last accepted token plus the ``gamma`` guesses and so knows its own greedy choice after
each prefix. Guesses are accepted up to the first disagreement, and the target's own token
at that point is appended (a correction, or a bonus token when all guesses were right).
Every emitted token is the target's greedy token, so the output is exactly the target's
greedy output; only the number of target forwards changes.

If each guess is accepted with probability ``a`` independently, one round emits on average
``(1 - a^(gamma+1)) / (1 - a)`` tokens (Leviathan et al., 2023). Caches are rolled back
with :meth:`~codex_lab.nn.kv_cache.StaticKVCache.truncate` after a rejection.

Drafts: any :class:`CodexModel` with the target's vocabulary. The lesson's are the untrained
early exit (:func:`codex_lab.nn.surgery.truncated_draft`) and the draft distilled from the
target (:mod:`codex_lab.lessons.l06_inference.draft`: one block trained to match the target's next-token
distribution, shipped with the package, :func:`codex_lab.lessons.l06_inference.draft.load_draft`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from codex_lab.infer.generate import cached_logits, make_caches
from codex_lab.nn.model import CodexModel


def expected_tokens_per_round(a: float, gamma: int) -> float:
    """Tokens one round emits on average when each guess is accepted with probability ``a``:
    (1 - a^(gamma+1)) / (1 - a), which is gamma + 1 at a = 1."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance rate must be in [0, 1], got {a}")
    if a == 1.0:
        return float(gamma + 1)
    # E[tokens] = sum_{i=0..gamma} a^i
    return (1 - a ** (gamma + 1)) / (1 - a)


def expected_speedup(a: float, gamma: int, c: float, verify_cost: float = 1.0) -> float:
    """Expected wall-clock speedup over plain decoding: E[tokens] / (gamma * c + verify_cost).

    ``c``: one draft forward in target decode steps; ``verify_cost``: the target forward over
    gamma + 1 tokens in target decode steps (about 1 when decoding is memory-bound; the
    paper's Theorem 3.8 assumes exactly 1, Leviathan et al., 2023). Below 1 = slower.
    """
    if c < 0 or verify_cost <= 0:
        raise ValueError(f"need c >= 0 and verify_cost > 0, got c={c}, verify_cost={verify_cost}")
    # speedup = (1 - a^(gamma+1)) / ((1 - a) (gamma c + verify_cost))
    return expected_tokens_per_round(a, gamma) / (gamma * c + verify_cost)


@dataclass
class SpecStats:
    """Counts of one speculative generation.

    rounds: verification forwards of the target with a full ``gamma`` guesses;
    target_calls: every target forward (prefill and short final rounds included);
    drafted / accepted: guesses made / accepted in full rounds; rejections: full rounds
    that stopped at a wrong guess; emitted: tokens emitted by full rounds; no_match: rounds
    whose draft had nothing to propose (prompt lookup: no n-gram of the context matched).
    """

    gamma: int
    rounds: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    emitted: int = 0
    no_match: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Per-guess acceptance a = accepted / (accepted + rejections): of the guesses the
        target judged (those up to the first wrong one), the share it accepted."""
        judged = self.accepted + self.rejections
        return self.accepted / judged if judged else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Measured tokens emitted per full round (compare :func:`expected_tokens_per_round`)."""
        return self.emitted / self.rounds if self.rounds else 0.0


@torch.no_grad()
def speculative_generate(
    target: CodexModel,
    draft: CodexModel,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int = 64,
    gamma: int = 4,
    eos_id: int | None = None,
) -> tuple[list[int], str, SpecStats]:
    """Greedy generation of ``target`` sped up by ``draft`` guessing ``gamma`` tokens a round.

    Returns (new ids, finish reason, stats); the ids equal
    ``generate_ids(target, prompt_ids, max_new_tokens=..., eos_id=...)``.
    """
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    if not prompt_ids:
        raise ValueError("the prompt is empty; give at least one token")
    if draft.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"draft vocab {draft.cfg.vocab_size} != target vocab {target.cfg.vocab_size}; they must share a tokenizer")
    T = len(prompt_ids)
    total = T + max_new_tokens
    if total > min(target.cfg.max_seq_len, draft.cfg.max_seq_len):
        raise ValueError(f"prompt {T} + {max_new_tokens} new tokens is past max_seq_len")
    stats = SpecStats(gamma=gamma)
    if max_new_tokens == 0:
        return [], "length", stats
    dev = next(target.parameters()).device
    # caches that can roll back: no rolling buffers (a rejected guess may have overwritten a slot)
    t_cache = make_caches(target, 1, total, "static", rolling=False)
    d_cache = make_caches(draft, 1, total, "static", rolling=False)

    def run(model: CodexModel, caches: list, ids: list[int], start: int, last_only: bool = True) -> torch.Tensor:
        x = torch.tensor([ids], device=dev)  # (1, n)
        pos = torch.arange(start, start + len(ids), device=dev)[None]  # (1, n)
        return cached_logits(model, x, pos, caches, last_only=last_only)[0]  # (n or 1, V)

    tokens = list(prompt_ids)
    first = int(run(target, t_cache, tokens, 0)[-1].argmax())
    stats.target_calls += 1
    if T > 1:  # the draft holds all but the last token, which its first round feeds
        run(draft, d_cache, tokens[:-1], 0)
        stats.draft_calls += 1
    d_len = T - 1
    if eos_id is not None and first == eos_id:
        return [], "stop", stats
    tokens.append(first)
    while len(tokens) - T < max_new_tokens:
        L = len(tokens)  # the target cache holds positions 0 .. L-2
        g = min(gamma, max_new_tokens - (L - T) - 1)  # never emit past max_new_tokens
        guesses: list[int] = []
        for _ in range(g):
            feed = tokens[d_len:] + guesses[-1:] if guesses else tokens[d_len:]
            nxt = int(run(draft, d_cache, feed, d_len)[-1].argmax())
            stats.draft_calls += 1
            d_len += len(feed)
            guesses.append(nxt)
        # one target forward checks every guess: preds[i] = target's token after guess i
        preds = run(target, t_cache, [tokens[-1]] + guesses, L - 1, last_only=False).argmax(dim=-1).tolist()  # (g + 1,)
        stats.target_calls += 1
        k = 0
        while k < g and guesses[k] == preds[k]:
            k += 1
        new = guesses[:k] + [preds[k]]
        if g == gamma:
            stats.rounds += 1
            stats.drafted += g
            stats.accepted += k
            stats.rejections += k < g
            stats.emitted += len(new)
        for tok in new:
            if eos_id is not None and tok == eos_id:
                return tokens[T:], "stop", stats
            tokens.append(tok)
        # roll back: keep cached positions < len(tokens) - 1 (the newest token is fed next round)
        keep = len(tokens) - 1
        for c in t_cache:
            c.truncate(keep)
        d_len = min(d_len, keep)
        for c in d_cache:
            c.truncate(d_len)
    return tokens[T:], "length", stats
