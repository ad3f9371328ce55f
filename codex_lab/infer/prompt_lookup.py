"""Prompt-lookup decoding (greedy): draft tokens copied from the context, no draft model.

Code edits repeat their prompt: asked to change one line of a function, the model writes
most of the function again. So the cheapest possible "draft model" is a search: take the
last ``n`` tokens generated, find where they occurred earlier in the prompt (or in what
was generated), and propose the ``num_draft`` tokens that followed there (Saxena, 2023,
"prompt lookup decoding"; the n-gram drafting of Fu et al., 2024). The target checks all
proposals in ONE forward with the greedy rule of :mod:`codex_lab.infer.speculative`:
accept up to the first disagreement, then append the target's own token. Every emitted
token is the target's greedy token, so the output equals plain greedy decoding; when
nothing matches, the round is an ordinary one-token decode step.

It pays when the continuation copies the context (edits, refactors, reformatting, quoting)
and costs a little when it does not (a longer verify forward for guesses that fail).

On the compiled decoder a verify forward is not free: on a 2-core CPU a step over 17 tokens
took 7.4x a one-token step (the matmuls are no longer memory-bound), so verifying every guess
found cost more than the single steps it saved (0.89x FastDecoder, 2026-12-07). There the
round verifies only as many guesses as pay: :func:`draft_length` picks the count that
maximises expected tokens per millisecond, from each verify shape's measured cost
(:func:`verify_costs`) and the acceptance rate seen so far in this generation.
"""

from __future__ import annotations

import statistics
import time
import weakref
from typing import Mapping, Sequence

import torch

from codex_lab.infer.fast_decode import FastDecoder
from codex_lab.infer.generate import cached_logits, make_caches
from codex_lab.infer.speculative import SpecStats, expected_tokens_per_round
from codex_lab.nn.model import CodexModel


def lookup_draft(tokens: Sequence[int], *, max_ngram: int = 3, min_ngram: int = 1, num_draft: int = 8) -> list[int]:
    """The tokens that followed the latest earlier occurrence of the context's last n-gram.

    Tries n = max_ngram down to min_ngram; the most recent match wins (it is the likeliest
    copy). Returns up to ``num_draft`` tokens, or [] when no n-gram matches.
    """
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
    L = len(tokens)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        tail = list(tokens[L - n :])
        # latest start s < L - n with tokens[s : s + n] == tail
        for s in range(L - n - 1, -1, -1):
            if tokens[s] == tail[0] and list(tokens[s : s + n]) == tail:
                return list(tokens[s + n : s + n + num_draft])
    return []


def verify_sizes(num_draft: int) -> list[int]:
    """The guess counts a compiled verify step is built for: powers of two below ``num_draft``,
    then ``num_draft`` itself (16 -> [1, 2, 4, 8, 16]; 6 -> [1, 2, 4, 6]). A round pads its
    guesses to the smallest that holds them: at most twice the work its guesses need, in at most
    log2(num_draft) + 1 shapes."""
    if num_draft < 1:
        raise ValueError(f"num_draft must be >= 1, got {num_draft}")
    sizes, n = [], 1
    while n < num_draft:
        sizes.append(n)
        n *= 2
    return sizes + [num_draft]


# the acceptance estimate a round's draft length is chosen from: Laplace-like pseudo-counts
# (accepted guesses, rejections) before any round, a = 2 / 3, so the first round drafts when a
# verify of a few guesses costs under ~1.5 plain steps (it then learns from what happens); each
# round's counts are added after the old ones decay by ACCEPT_DECAY (an effective memory of ~10
# rounds: a copy that starts or ends mid-generation moves the estimate within a few rounds)
ACCEPT_PRIOR = (2.0, 1.0)
ACCEPT_DECAY = 0.9


def draft_length(found: int, acceptance: float, costs: Mapping[int, float]) -> tuple[int, int]:
    """How many of the ``found`` guesses one round verifies, and the verify size it pads them to.

    ``costs``: milliseconds of one target call by guess count (0: a plain one-token step, s > 0:
    a verify over s guesses + 1, padded guesses included). With each guess accepted with
    probability ``acceptance``, a verify of g guesses emits (1 - a^(g+1)) / (1 - a) tokens on
    average; the round takes the size s (and g = min(s, found) guesses) with the most expected
    tokens per millisecond, or (0, 0), a plain step, when none beats 1 / costs[0]. Nothing here
    changes the tokens emitted (every one is the target's greedy token), only how fast.
    """
    if 0 not in costs:
        raise ValueError("costs needs the plain step's cost at key 0")
    if found < 0 or not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"need found >= 0 and acceptance in [0, 1], got {found}, {acceptance}")
    best, pick = 1.0 / costs[0], (0, 0)  # a plain step: one token per its cost
    for s in sorted(k for k in costs if k > 0):
        g = min(s, found)
        if g == 0:
            continue
        # tokens per ms = E[tokens of a round with g guesses] / the cost of verify size s
        rate = expected_tokens_per_round(acceptance, g) / costs[s]
        if rate > best:
            best, pick = rate, (g, s)
    return pick


_COSTS: "weakref.WeakKeyDictionary[FastDecoder, dict[tuple[int, ...], dict[int, float]]]" = weakref.WeakKeyDictionary()


@torch.no_grad()
def verify_costs(decoder: FastDecoder, sizes: Sequence[int], calls: int = 31) -> dict[int, float]:
    """Milliseconds of one call of ``decoder``'s plain step (key 0) and of its verify step at each
    of ``sizes`` guesses (the median of ``calls`` calls, the sizes taking turns, after one call each
    that builds or loads the package), measured once per decoder and sizes and then remembered.
    The calls write the cache's first slots, which the next prefill overwrites (call it between
    generations, not inside one)."""
    key = tuple(sizes)
    got = _COSTS.setdefault(decoder, {})
    if key in got:
        return got[key]
    dev = decoder.slots.device
    if max(key) + 1 > decoder.max_len:
        raise ValueError(f"a verify of {max(key)} guesses needs {max(key) + 1} slots; the decoder has {decoder.max_len}")
    fns = {0: lambda: decoder.decode_step(torch.tensor([[1]], device=dev), torch.tensor([0], device=dev))}
    for s in key:
        fns[s] = (lambda n: lambda: decoder.verify(torch.ones(1, n, dtype=torch.long, device=dev),
                                                   torch.arange(n, device=dev)))(s + 1)
    for fn in fns.values():
        fn()  # builds or loads the package
    times: dict[int, list[float]] = {s: [] for s in fns}
    for _ in range(calls):  # interleaved: a slow spell of the machine falls on every size alike
        for s, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[s].append(time.perf_counter() - t0)
    costs = {s: statistics.median(ts) * 1000.0 for s, ts in times.items()}
    got[key] = costs
    return costs


@torch.no_grad()
def accept_greedy(guesses: Sequence[int], preds: Sequence[int], stats: SpecStats) -> tuple[list[int], int]:
    """One verify round's greedy rule: accept the guesses up to the first that differs from the
    target's token there, then append the target's own token. ``preds[i]``: the target's greedy
    token after the context + ``guesses[:i]`` (``len(guesses) + 1`` of them). Counts the round in
    ``stats``; returns (the tokens to emit, how many guesses were accepted)."""
    stats.target_calls += 1
    k = 0
    while k < len(guesses) and guesses[k] == preds[k]:
        k += 1
    new = list(guesses[:k]) + [preds[k]]
    if guesses:
        stats.rounds += 1
        stats.drafted += len(guesses)
        stats.accepted += k
        stats.rejections += k < len(guesses)
        stats.emitted += len(new)
    return new, k


def prompt_lookup_generate(
    target: CodexModel | FastDecoder,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int = 64,
    num_draft: int = 8,
    max_ngram: int = 3,
    min_ngram: int = 1,
    eos_id: int | None = None,
    draft_costs: Mapping[int, float] | None = None,
) -> tuple[list[int], str, SpecStats]:
    """Greedy generation of ``target`` with drafts copied from the context.

    ``target``: a model (its forward over a static cache, rolled back after a rejection: every
    guess found is verified), or a :class:`~codex_lab.infer.fast_decode.FastDecoder` (its
    compiled steps: :func:`_on_decoder`, each round verifying as many guesses as pay,
    :func:`draft_length`). ``draft_costs``: the decoder's call costs in ms by guess count (0: a
    plain step; the keys must be 0 and :func:`verify_sizes` ``(num_draft)``); None measures them
    (:func:`verify_costs`). Returns (new ids, finish reason, stats) where the ids equal
    ``generate_ids(model, prompt_ids, max_new_tokens=..., eos_id=...)``. ``stats.rounds``
    counts verify forwards that carried at least one guess; ``acceptance_rate`` is over them.
    """
    if num_draft < 1:
        raise ValueError(f"num_draft must be >= 1, got {num_draft}")
    if not prompt_ids:
        raise ValueError("the prompt is empty; give at least one token")
    draft = dict(max_new_tokens=max_new_tokens, num_draft=num_draft, max_ngram=max_ngram, min_ngram=min_ngram,
                 eos_id=eos_id)
    if isinstance(target, FastDecoder):
        return _on_decoder(target, prompt_ids, costs=draft_costs, **draft)
    if draft_costs is not None:
        raise ValueError("draft_costs cut the drafts on a FastDecoder; a model's forward verifies every guess found")
    return _on_model(target, prompt_ids, **draft)


def _on_model(target: CodexModel, prompt_ids: Sequence[int], *, max_new_tokens: int, num_draft: int, max_ngram: int,
              min_ngram: int, eos_id: int | None) -> tuple[list[int], str, SpecStats]:
    """:func:`prompt_lookup_generate` on a model's forward over a static cache."""
    T = len(prompt_ids)
    total = T + max_new_tokens
    if total > target.cfg.max_seq_len:
        raise ValueError(f"prompt {T} + {max_new_tokens} new tokens is past max_seq_len {target.cfg.max_seq_len}")
    stats = SpecStats(gamma=num_draft)
    if max_new_tokens == 0:
        return [], "length", stats
    dev = next(target.parameters()).device
    caches = make_caches(target, 1, total, "static", rolling=False)  # rolled back after a rejection

    def run(ids: list[int], start: int, last_only: bool) -> torch.Tensor:
        x = torch.tensor([ids], device=dev)  # (1, n)
        pos = torch.arange(start, start + len(ids), device=dev)[None]  # (1, n)
        return cached_logits(target, x, pos, caches, last_only=last_only)[0]  # (n or 1, V)

    tokens = list(prompt_ids)
    first = int(run(tokens, 0, True)[-1].argmax())
    stats.target_calls += 1
    if eos_id is not None and first == eos_id:
        return [], "stop", stats
    tokens.append(first)
    while len(tokens) - T < max_new_tokens:
        L = len(tokens)  # the cache holds positions 0 .. L-2
        room = max_new_tokens - (L - T) - 1  # never emit past max_new_tokens
        guesses = lookup_draft(tokens, max_ngram=max_ngram, min_ngram=min_ngram, num_draft=min(num_draft, room)) if room else []
        stats.no_match += bool(room) and not guesses
        # one forward: preds[i] = the target's greedy token after tokens + guesses[:i]
        preds = run([tokens[-1]] + guesses, L - 1, last_only=False).argmax(dim=-1).tolist()  # (g + 1,)
        new, k = accept_greedy(guesses, preds, stats)
        for tok in new:
            if eos_id is not None and tok == eos_id:
                return tokens[T:], "stop", stats
            tokens.append(tok)
        if k < len(guesses):  # roll back the rejected guesses' keys/values
            for c in caches:
                c.truncate(len(tokens) - 1)
    return tokens[T:], "length", stats


def _on_decoder(decoder: FastDecoder, prompt_ids: Sequence[int], *, max_new_tokens: int, num_draft: int,
                max_ngram: int, min_ngram: int, eos_id: int | None,
                costs: Mapping[int, float] | None) -> tuple[list[int], str, SpecStats]:
    """:func:`prompt_lookup_generate` on :class:`~codex_lab.infer.fast_decode.FastDecoder`'s
    static cache, its compiled steps (``compile="aot"``: one package for a single token, one per
    verify shape). Each round verifies the guesses that pay (:func:`draft_length`, from
    ``costs`` and the acceptance so far: the decayed counts of :data:`ACCEPT_PRIOR`), padded to
    one of :func:`verify_sizes` (1, 2, 4, 8, ... up to ``num_draft``), so a round that keeps 3
    guesses verifies 5 tokens, not ``num_draft + 1``, and the compiled shapes stay few. A round
    with no guess kept is a plain decode step (which still judges the first guess found, so the
    estimate recovers when a copy begins). Nothing is rolled
    back after a rejection: the slots past the accepted tokens are overwritten before any query
    reads them (:meth:`~codex_lab.infer.fast_decode.FastDecoder.verify`). The decoder's
    ``max_len`` must hold the prompt, the new tokens and ``num_draft`` more (the padded guesses'
    slots); batch 1.
    """
    if decoder.batch != 1:
        raise ValueError(f"prompt lookup decodes one sequence; the decoder was built for batch={decoder.batch}")
    T = len(prompt_ids)
    if T + max_new_tokens + num_draft > decoder.max_len:
        raise ValueError(f"prompt {T} + {max_new_tokens} new tokens + {num_draft} guess slots is past the decoder's "
                         f"max_len {decoder.max_len}: build it with max_len >= {T + max_new_tokens + num_draft}")
    stats = SpecStats(gamma=num_draft)
    if max_new_tokens == 0:
        return [], "length", stats
    sizes = verify_sizes(num_draft)
    if costs is None:
        costs = verify_costs(decoder, sizes)  # before the prefill: its calls write slots the prefill overwrites
    elif set(costs) != {0, *sizes}:
        raise ValueError(f"draft_costs has keys {sorted(costs)}; give 0 (a plain step) and each of {sizes}")
    ok, bad = ACCEPT_PRIOR  # the acceptance estimate's pseudo-counts: accepted guesses, rejections
    dev = decoder.slots.device
    nxt, _ = decoder.prefill(torch.tensor([list(prompt_ids)], device=dev))
    first = int(nxt[0])
    stats.target_calls += 1
    if eos_id is not None and first == eos_id:
        return [], "stop", stats
    tokens = list(prompt_ids) + [first]
    while len(tokens) - T < max_new_tokens:
        L = len(tokens)  # the cache holds positions 0 .. L-2
        room = max_new_tokens - (L - T) - 1  # never emit past max_new_tokens
        found = lookup_draft(tokens, max_ngram=max_ngram, min_ngram=min_ngram, num_draft=min(num_draft, room)) if room else []
        stats.no_match += bool(room) and not found
        # a = accepted / (accepted + rejections): the per-guess acceptance, decayed counts
        keep, size = draft_length(len(found), ok / (ok + bad), costs)
        guesses = found[:keep]
        if guesses:
            padded = guesses + [guesses[-1]] * (size - len(guesses))
            x = torch.tensor([[tokens[-1]] + padded], device=dev)  # (1, size + 1)
            # preds[i] = the target's greedy token after tokens + guesses[:i]
            preds = decoder.verify(x, torch.arange(L - 1, L + size, device=dev))[0, : len(guesses) + 1].tolist()
        else:
            preds = [int(decoder.decode_step(torch.tensor([[tokens[-1]]], device=dev),
                                             torch.tensor([L - 1], device=dev))[0])]
        new, k = accept_greedy(guesses, preds, stats)
        if guesses:
            ok, bad = ACCEPT_DECAY * ok + k, ACCEPT_DECAY * bad + (k < len(guesses))
        elif found:  # a plain step still judges the first guess found, for free: the estimate keeps learning
            ok, bad = ACCEPT_DECAY * ok + (found[0] == new[0]), ACCEPT_DECAY * bad + (found[0] != new[0])
        for tok in new:
            if eos_id is not None and tok == eos_id:
                return tokens[T:], "stop", stats
            tokens.append(tok)
    return tokens[T:], "length", stats
