"""Lesson 06 exercises: attention over a preallocated KV cache, top-p (nucleus) filtering,
one admission step of a continuous-batching scheduler with a KV-block budget, and (derived,
not shown) the expected tokens of a speculative round when acceptance changes along the draft.

Each check computes its own reference here (never the package's answer) and, when an answer
is wrong, runs the plausible mistakes on the same inputs so the feedback names the bug.
tests/test_exercises_05_06.py holds those mistakes and asserts each one fails.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from codex_lab.course.check_tools import OVERFLOW, overflow, pyrng, rng
from codex_lab.course.checks import case, exercise
from codex_lab.course.forbid import ATTENTION_BUILTINS, TOP_P_BUILTINS


def _attention(q: Tensor, k: Tensor, v: Tensor, scale: bool = True) -> Tensor:
    # softmax(q k^T / sqrt(D)) v over every key given; no key at all -> zeros
    if k.shape[2] == 0:
        return torch.zeros_like(q)
    s = q @ k.transpose(-2, -1)  # (B, H, 1, S)
    if scale:
        s = s / math.sqrt(q.shape[-1])
    return torch.softmax(s, dim=-1) @ v  # (B, H, 1, D)


# ------------------------------------------------------------------ exercise 1
@exercise("06", "cached_attention", points=2, forbid=(
    "codex_lab.nn.kv_cache.StaticKVCache.update", "codex_lab.nn.kv_cache.DynamicKVCache.update",
    "codex_lab.nn.attention.attention_reference", "codex_lab.nn.attention.attention_sdpa") + ATTENTION_BUILTINS)
def check_cached_attention(fn: Callable[..., Any]) -> None:
    """fn(k_buf, v_buf, length, q, k_new, v_new) writes slot ``length`` and attends to 0..length."""
    with case(1, "writes slot `length` in place"):
        _decode_six(fn, check_output=False)
    with case(1, "attends to slots 0..length"):
        _decode_six(fn, check_output=True)


def _decode_six(fn: Callable[..., Any], check_output: bool) -> None:
    """Six decode steps into a *reused* cache (slots past ``length`` hold an earlier sequence's
    keys and values, as a cache slot handed to a new request does): the writes, or
    (check_output) the attention outputs; then one step with large scores."""
    g = rng("06.cached_attention")
    B, H, L, D = 2, 3, 10, 8
    k_buf, v_buf = torch.randn(B, H, L, D, generator=g), torch.randn(B, H, L, D, generator=g)  # stale contents
    keys, values = torch.randn(B, H, 6, D, generator=g), torch.randn(B, H, 6, D, generator=g)
    stale_k, stale_v = k_buf.clone(), v_buf.clone()
    for t in range(6):  # decode six tokens one at a time
        q = torch.randn(B, H, 1, D, generator=g) * 2
        q0, kn, vn = q.clone(), keys[:, :, t : t + 1].clone(), values[:, :, t : t + 1].clone()
        out = fn(k_buf, v_buf, t, q, kn, vn)
        assert isinstance(out, Tensor) and out.shape == (B, H, 1, D), (
            f"cached_attention: return the attention output of shape (B, H, 1, D) = {(B, H, 1, D)}, got "
            f"{getattr(out, 'shape', type(out).__name__)}")
        assert torch.equal(q, q0), ("cached_attention: your function changed the caller's q in place (e.g. q *= scale): "
                                    "the model still uses it; scale the scores or a new tensor instead")
        assert torch.equal(kn, keys[:, :, t : t + 1]) and torch.equal(vn, values[:, :, t : t + 1]), (
            "cached_attention: your function changed k_new / v_new in place; only k_buf / v_buf are written")
        if not check_output:
            if not (torch.equal(k_buf[:, :, t], keys[:, :, t]) and torch.equal(v_buf[:, :, t], values[:, :, t])):
                if t + 1 < L and torch.equal(k_buf[:, :, t + 1], keys[:, :, t]):
                    raise AssertionError(f"cached_attention: step {t} wrote slot {t + 1}; slot `length` = {t} is the next free one (positions start at 0)")
                raise AssertionError(f"cached_attention: step {t} did not write the new key/value into slot {t} of k_buf/v_buf in place "
                                     "(assign into the buffer, e.g. k_buf[:, :, length] = ...; a new tensor is lost after the call)")
            assert torch.equal(k_buf[:, :, t + 1 :], stale_k[:, :, t + 1 :]) and torch.equal(v_buf[:, :, t + 1 :], stale_v[:, :, t + 1 :]), (
                "cached_attention: write only slot `length`; later slots must stay as they were")
            continue
        # fp32, outputs O(1): another summation order differs by ~1e-7
        want = _attention(q, keys[:, :, : t + 1], values[:, :, : t + 1])
        if torch.allclose(out, want, atol=1e-5):
            continue
        nonzero = (stale_k.abs().sum(-1) != 0)[0, 0]  # a reused cache's later slots are not zero
        mistakes = {
            f"the query attended to all {L} slots, including ones past `length` that hold an earlier sequence's keys: "
            "use only slots 0..length (k_buf[:, :, :length + 1]); a slot is not empty because it is zero":
                _attention(q, k_buf, v_buf),
            "the new token is left out: attend to slots 0..length inclusive (the new key is its own first key)":
                _attention(q, keys[:, :, :t], values[:, :, :t]),
            "the scores are not scaled: divide q k^T by sqrt(D), D the head width":
                _attention(q, keys[:, :, : t + 1], values[:, :, : t + 1], scale=False),
            "the softmax runs over the wrong axis: normalise over the keys (the last axis of the scores)":
                torch.softmax(q @ keys[:, :, : t + 1].transpose(-2, -1) / math.sqrt(D), dim=-2) @ values[:, :, : t + 1],
        }
        for msg, val in mistakes.items():
            if torch.allclose(out, val, atol=1e-5):
                raise AssertionError(f"cached_attention, step {t}: {msg}")
        if bool(nonzero.all()):
            raise AssertionError(f"cached_attention, step {t}: the output is not softmax(q k^T / sqrt(D)) v over slots "
                                 f"0..{t}; this cache is reused, so slots past `length` hold old keys, not zeros: find "
                                 "the valid slots from `length`, never from the buffer's contents")
        raise AssertionError(f"cached_attention, step {t}: the output is not softmax(q k^T / sqrt(D)) v over slots 0..{t}")
    if check_output:  # large scores (a trained model's): a softmax without the row max overflows
        k_big, v_big = torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8)
        k_big[:, :, :2] = 30 * torch.randn(1, 1, 2, 8, generator=g)
        q = 30 * torch.randn(1, 1, 1, 8, generator=g)
        kn, vn = q.clone(), torch.randn(1, 1, 1, 8, generator=g)  # q . k_new = |q|^2 / sqrt(D): far past 88.7
        want = _attention(q, torch.cat([k_big[:, :, :2], kn], 2), torch.cat([v_big[:, :, :2], vn], 2))
        out = fn(k_big, v_big, 2, q.clone(), kn.clone(), vn.clone())
        assert not overflow(out, want), f"cached_attention: {OVERFLOW}"


# ------------------------------------------------------------------ exercise 2
def _top_p_keep(logits: Tensor, p: float, *, cross: bool = True, keep_top: bool = True, descending: bool = True) -> Tensor:
    """Kept mask (B, V) of the smallest top set with mass >= p (the variants switch one rule off)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=descending)  # (B, V)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(-1) - probs  # mass strictly before each token
    keep_sorted = before < p if cross else probs.cumsum(-1) <= p
    if keep_top:
        keep_sorted[:, 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


@exercise("06", "nucleus_filter", points=2,
          forbid=("codex_lab.infer.sampling.top_p_filter", "codex_lab.infer.sampling.sample_next") + TOP_P_BUILTINS)
def check_nucleus_filter(fn: Callable[..., Any]) -> None:
    """fn(logits (B, V), p) keeps the smallest set of most likely tokens with mass >= p."""
    g = rng("06.nucleus_filter")
    rand = torch.randn(5, 50, generator=g) * 3
    with case(1, "one hand-checked row"):  # probs ~ .64 .09 .24 .03
        _check_nucleus(fn, [(torch.tensor([[3.0, 1.0, 2.0, 0.0]]), p) for p in (0.7, 0.5, 0.9, 1.0)])
    with case(1, "five random rows"):
        _check_nucleus(fn, [(rand, p) for p in (0.3, 0.8, 0.95)])


def _check_nucleus(fn: Callable[..., Any], cases: list[tuple[Tensor, float]]) -> None:
    """Kept sets for each (logits, p); on a mismatch, the mistake consistent with every case."""
    kept = []
    for logits, p in cases:
        before = logits.clone()
        out = fn(logits, p)
        assert torch.equal(logits, before), ("nucleus_filter: your function changed the caller's logits in place "
                                             "(masked_fill_ or an indexed assignment): return a new tensor")
        assert isinstance(out, Tensor) and out.shape == logits.shape, (
            f"nucleus_filter: return filtered logits of the same shape {tuple(logits.shape)}, got {getattr(out, 'shape', type(out).__name__)}")
        if not torch.isinf(out).any() and bool((out == 0).any()) and not bool((logits == 0).any()):
            raise AssertionError(f"nucleus_filter, p={p}: set dropped tokens to -inf (so softmax gives them probability 0), not to 0")
        got = ~torch.isinf(out)
        if torch.equal(got, _top_p_keep(logits, p)) and not torch.equal(out[got], logits[got]):
            if torch.equal(out, torch.sort(out, dim=-1, descending=True).values):  # rows come out sorted
                raise AssertionError("nucleus_filter: the result is still in sorted order: scatter the filtered logits back to their original token positions")
            raise AssertionError("nucleus_filter: the kept logits must be unchanged (only the others become -inf)")
        kept.append(got)
    if all(torch.equal(k, _top_p_keep(lg, p)) for k, (lg, p) in zip(kept, cases)):
        return

    def sorted_order(lg: Tensor, p: float) -> Tensor:  # filtered but never scattered back
        s = torch.sort(lg, dim=-1, descending=True).values
        return _top_p_keep(s, p)

    mistakes = {
        "the kept set stops before the token that crosses p, so its mass is below p (and with p below the top probability "
        "nothing is left): keep a token while the mass BEFORE it is < p; the most likely token is always kept":
            lambda lg, p: _top_p_keep(lg, p, cross=False, keep_top=False),
        "the kept set stops before the token that crosses p, so its mass is below p: keep a token while the mass BEFORE it is < p":
            lambda lg, p: _top_p_keep(lg, p, cross=False),
        "you kept the LEAST likely tokens: sort in descending order of probability":
            lambda lg, p: _top_p_keep(lg, p, descending=False),
        "the result is still in sorted order: scatter the filtered logits back to their original token positions":
            sorted_order,
        "each row is its own distribution: sort and accumulate per row (dim=-1), not over the whole batch flattened":
            lambda lg, p: _top_p_keep(lg.reshape(1, -1), p).reshape(lg.shape),
    }
    for msg, variant in mistakes.items():
        if all(torch.equal(k, variant(lg, p)) for k, (lg, p) in zip(kept, cases)):
            raise AssertionError(f"nucleus_filter: {msg}")
    i = next(i for i, (k, (lg, p)) in enumerate(zip(kept, cases)) if not torch.equal(k, _top_p_keep(lg, p)))
    lg, p = cases[i]
    raise AssertionError(f"nucleus_filter, p={p} on a {tuple(lg.shape)} batch: kept {int(kept[i].sum())} tokens, expected "
                         f"{int(_top_p_keep(lg, p).sum())} (the smallest set of most likely tokens whose probabilities add up to >= p)")


# ------------------------------------------------------------------ exercise 3
def _admit(waiting: list, n_running: int, free_blocks: int, max_batch: int, block_size: int, *,
           ceil: bool = True, decrement: bool = True, overtake: bool = False, count_running: bool = True,
           fits_strict: bool = False) -> list[int]:
    """The reference admission rule; each keyword switches on one plausible mistake."""
    admitted: list[int] = []
    for rid, tokens in waiting:
        need = -(-tokens // block_size) if ceil else tokens // block_size  # blocks = ceil(tokens / block_size)
        busy = (n_running if count_running else 0) + len(admitted)
        if busy >= max_batch:
            break
        if need > free_blocks or (fits_strict and need == free_blocks):
            if overtake:
                continue
            break
        if decrement:
            free_blocks -= need
        admitted.append(rid)
    return admitted


@exercise("06", "schedule_step", points=2, forbid=("codex_lab.infer.engine.scheduler.admit", "codex_lab.nn.kv_cache.PagedKVPool.blocks_for"))
def check_schedule_step(fn: Callable[..., Any]) -> None:
    """fn(waiting, n_running, free_blocks, max_batch, block_size) -> rids admitted this step."""
    # waiting: (rid, prompt tokens + max new tokens) in arrival order
    cases = [
        ([(1, 16), (2, 17), (3, 5)], 0, 10, 8, 16),
        ([(1, 16), (2, 17), (3, 5)], 0, 3, 8, 16),
        ([(1, 40), (2, 4)], 0, 2, 8, 16),
        ([(1, 4), (2, 4), (3, 4)], 6, 99, 8, 16),
        ([], 0, 5, 8, 16),
        ([(7, 33), (8, 1)], 1, 4, 4, 16),
        ([(1, 20), (2, 20), (3, 20)], 0, 4, 8, 16),
        ([(1, 10), (2, 10)], 0, 1, 8, 16),
    ]
    r = pyrng("06.schedule_step")  # drawn for this run: a table of the cases above fails
    for _ in range(4):  # each admits at least its first request: an empty answer cannot pass
        waiting = [(rid, r.randint(1, 70)) for rid in r.sample(range(1, 100), r.randint(2, 6))]
        block = r.choice([8, 16])
        first = -(-waiting[0][1] // block)
        cases.append((waiting, r.randint(0, 2), first + r.randint(0, 10), r.randint(3, 8), block))
    got_all = []
    for args in cases:
        got = fn(list(args[0]), *args[1:])
        assert isinstance(got, (list, tuple)), f"schedule_step: return a list of rids, got {type(got).__name__}"
        got_all.append(list(got))
    wrong = [(c, g) for c, g in zip(cases, got_all) if g != _admit(*c)]
    if not wrong:
        return
    mistakes = {
        "free blocks are not used up: subtract each admitted request's blocks from free_blocks before checking the next one":
            dict(decrement=False),
        "blocks are ceil(tokens / block_size): a partly filled block is still a whole block (you rounded down)":
            dict(ceil=False),
        "a request that does not fit was skipped and later ones admitted: stop at the first one that does not fit (no overtaking)":
            dict(overtake=True),
        "only max_batch - n_running batch slots are free: count the running requests too":
            dict(count_running=False),
        "a request that needs exactly the free blocks fits: refuse only when it needs MORE than free_blocks":
            dict(fits_strict=True),
    }
    for msg, kw in mistakes.items():
        if all(g == _admit(*c, **kw) for c, g in zip(cases, got_all)):
            raise AssertionError(f"schedule_step: {msg}")
    (c, g), = wrong[:1]
    raise AssertionError(f"schedule_step{c} returned {g}, expected {_admit(*c)} "
                         "(first come, first served; ceil(tokens / block_size) blocks each; stop at the first that does not fit)")


# ------------------------------------------------------------------ exercise 4
def _expected_tokens(p: Tensor, q: Tensor, *, bonus: bool = True, same_rate: bool = False, own: bool = False,
                     product: bool = False) -> float:
    """The reference: E = sum_{j=0..gamma} prod_{i<j} beta_i, beta_i = sum_x min(p_i, q_i); each
    keyword switches on one plausible mistake."""
    p64, q64 = p.double(), q.double()
    # beta_i = sum_x min(p_i(x), q_i(x)): the chance guess i is accepted
    beta = (p64[:-1] * q64).sum(-1) if product else torch.minimum(p64[:-1], q64).sum(-1)
    if same_rate:  # the lesson's constant-rate formula at the mean rate
        a, gamma = float(beta.mean()), beta.numel()
        return float(gamma + 1) if a == 1.0 else (1 - a ** (gamma + 1)) / (1 - a)
    if own:  # each guess's own rate, added: as if a rejection did not end the round
        return 1.0 + float(beta.sum()) - (0.0 if bonus else 1.0)
    # E = sum_{j=0..gamma} prod_{i<j} beta_i: the j = 0 term is the token every round emits
    total, alive = 1.0, 1.0
    for b in beta.tolist():
        alive *= b
        total += alive
    return total - (0.0 if bonus else 1.0)


def _spec_case(g: torch.Generator, gamma: int, V: int, drift: float) -> tuple[Tensor, Tensor]:
    p = torch.softmax(torch.randn(gamma + 1, V, generator=g) * 2, -1)  # (gamma + 1, V)
    q = torch.stack([torch.softmax(torch.log(p[i]) + drift * (i + 1) * torch.randn(V, generator=g), -1)
                     for i in range(gamma)])  # (gamma, V): drifts further from p along the draft
    return p, q


@exercise("06", "expected_tokens", points=2, forbid=("codex_lab.infer.speculative.expected_tokens_per_round",
                                                     "codex_lab.infer.speculative.expected_speedup"))
def check_expected_tokens(fn: Callable[..., Any]) -> None:
    """fn(p (gamma + 1, V), q (gamma, V)) -> expected tokens one verification round emits."""
    g = rng("06.expected_tokens")  # drawn for this run: a table of answers fails
    cases = [_spec_case(g, gamma, V, drift) for gamma, V, drift in ((4, 12, 0.6), (1, 5, 0.3), (6, 30, 0.4),
                                                                    (3, 8, 1.5), (5, 16, 0.0))]
    p1 = torch.softmax(torch.randn(3, 7, generator=g), -1)
    cases.append((p1, p1[:2].clone()))  # a draft equal to the target: every guess accepted, gamma + 1 tokens
    got = []
    for p, q in cases:
        before = (p.clone(), q.clone())
        out = fn(p, q)
        assert torch.equal(p, before[0]) and torch.equal(q, before[1]), "expected_tokens: your function changed p or q in place"
        try:
            got.append(float(out))
        except (TypeError, ValueError):
            raise AssertionError(f"expected_tokens: return a number (a float), got {type(out).__name__}") from None
    # 1e-5: the reference sums in float64; a float32 answer over <= 7 rows of <= 30 terms is within ~1e-6
    ok = [abs(x - _expected_tokens(p, q)) <= 1e-5 for x, (p, q) in zip(got, cases)]
    if all(ok):
        return
    mistakes = {
        "a round always emits one token besides the accepted guesses (the correction after a rejection, or the "
        "bonus token after all gamma): add it": dict(bonus=False),
        "the acceptance rate changes along the draft here: the constant-rate formula at the mean rate is not it; "
        "multiply the rates of the guesses before each one": dict(same_rate=True),
        "guess j counts only when every guess before it was accepted too: multiply the rates (prod_{i<=j}), do "
        "not add them": dict(own=True),
        "a guess x ~ q is accepted with probability min(1, p(x)/q(x)), so P(accept) = sum_x min(p, q), not "
        "sum_x p q": dict(product=True),
    }
    for msg, kw in mistakes.items():
        if all(abs(x - _expected_tokens(p, q, **kw)) <= 1e-5 for x, (p, q) in zip(got, cases)):
            raise AssertionError(f"expected_tokens: {msg}")
    i = ok.index(False)
    p, q = cases[i]
    raise AssertionError(f"expected_tokens on a gamma = {q.shape[0]} draft returned {got[i]:.6f}, expected "
                         f"{_expected_tokens(p, q):.6f} (sum over j = 0..gamma of the product of the acceptance "
                         "rates of guesses 0..j-1)")
