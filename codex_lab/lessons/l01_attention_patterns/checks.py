"""Lesson 01 exercises: causal attention probabilities, the weight a head puts at each
distance, the share of attention inside a window, and (derived) that share for a reader whose
weight decays with distance.

Each check computes the expected answer with plain code here (not with the package's
analysis functions), and on a wrong answer recognises the usual mistakes (a missing scale,
a reversed mask, softmax over the wrong axis, sums instead of means, off-by-one windows)
and names them.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from codex_lab.course.check_tools import OVERFLOW, as_float, overflow, pure_call, rng
from codex_lab.course.checks import case, exercise
from codex_lab.course.forbid import ATTENTION_BUILTINS

# fp32 probabilities in [0, 1]; learner code may sum in another order: 1e-5 (CONTRIBUTING.md)
ATOL = 1e-5


def _close(a: Any, b: Tensor, atol: float = ATOL) -> bool:
    return isinstance(a, Tensor) and a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=atol, rtol=0)


def _probs(q: Tensor, k: Tensor, scale: float, fill: float = float("-inf"), dim: int = -1, upper: bool = False) -> Tensor:
    """softmax(q k^T * scale) with a causal mask; the options build the usual wrong variants."""
    T = q.shape[-2]
    keep = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T): key j <= query i
    if upper:
        keep = keep.T
    scores = (q @ k.transpose(-2, -1)) * scale  # (H, T, T)
    return torch.softmax(scores.masked_fill(~keep, fill), dim=dim)


@exercise("01", "causal_attention_probs", points=2,
          forbid=("codex_lab.attention_reference", "codex_lab.attention_sdpa") + ATTENTION_BUILTINS)
def check_causal_attention_probs(fn: Callable[..., Any]) -> None:
    """fn(q, k) with q, k (H, T, D) (RoPE already applied) -> (H, T, T) causal probabilities."""
    gen = rng("01.causal_attention_probs")
    runs = []
    for H, T, D in [(2, 6, 16), (3, 9, 4), (1, 1, 8)]:
        q = 2 * torch.randn(H, T, D, generator=gen)  # scores of a few units: a missing scale shows
        k = 2 * torch.randn(H, T, D, generator=gen)
        runs.append((q, k, pure_call(fn, ("q", "k"), q, k)))
    with case(1, "causal rows that sum to 1"):
        for q, k, got in runs:
            (H, T, D) = q.shape
            assert isinstance(got, Tensor), f"return a tensor, got {type(got).__name__}"
            assert got.shape == (H, T, T), f"H={H}, T={T}, D={D}: expected shape {(H, T, T)}, got {tuple(got.shape)}"
            future = torch.ones(T, T, dtype=torch.bool).triu(1)
            if _close(got, _probs(q, k, 1 / math.sqrt(D), upper=True)) and T > 1:
                raise AssertionError("the mask is reversed: a query may read keys at or *before* it (tril), not after it (triu)")
            if bool((got.float()[:, future].abs() > ATOL).any()):
                if _close(got, _probs(q, k, 1 / math.sqrt(D), fill=0.0)):
                    raise AssertionError("future keys still get weight: fill masked scores with -inf (exp(-inf) = 0); "
                                         "a 0 score still gets exp(0) = 1 in the softmax")
                raise AssertionError("a query puts weight on a key after it: mask keys j > i before the softmax")
            if T > 1 and bool((got.float().nan_to_num(0.0).diagonal(dim1=-2, dim2=-1).abs() < 1e-12).all()):
                raise AssertionError("no query attends to itself: keys j <= i are allowed, the diagonal j = i included "
                                     "(mask with triu(diagonal=1), not diagonal=0)")
            if _close(got, _probs(q, k, 1 / math.sqrt(D), dim=-2)) and T > 1:
                raise AssertionError("softmax over the queries (dim=-2); normalise over the keys (dim=-1): each row sums to 1")
            if not torch.allclose(got.float().sum(-1), torch.ones(H, T), atol=1e-4):
                raise AssertionError("rows must sum to 1: mask the scores first, then take the softmax over the keys "
                                     "(zeroing probabilities after the softmax leaves rows that sum to less than 1)")
    with case(1, "the values softmax(q k^T / sqrt(D))"):
        for q, k, got in runs:
            (H, T, D) = q.shape
            # p = softmax over keys j <= i of q_i . k_j / sqrt(D)
            want = _probs(q, k, 1 / math.sqrt(D))  # (H, T, T)
            if _close(got, want):
                continue
            if _close(got, _probs(q, k, 1.0)):
                raise AssertionError("the scores are not scaled: divide q k^T by sqrt(D) (Vaswani et al. 2017)")
            if _close(got, _probs(q, k, 1 / D)):
                raise AssertionError(f"the scores are divided by D = {D}; the scale is 1 / sqrt(D)")
            diff = float((got.float() - want).abs().max()) if isinstance(got, Tensor) and got.shape == want.shape else float("nan")
            raise AssertionError(f"H={H}, T={T}, D={D}: max difference {diff:.3g} from softmax(q k^T / sqrt(D)) with keys "
                                 "after the query masked")
        # large scores (a trained model's, in fp32): a softmax without the row max overflows to inf / NaN
        q = 30 * torch.randn(2, 7, 8, generator=gen)
        k = q + torch.randn(2, 7, 8, generator=gen)  # q_i . k_i ~ |q|^2 / sqrt(D): far past exp's float32 limit 88.7
        got, want = fn(q.clone(), k.clone()), _probs(q, k, 1 / math.sqrt(8))
        assert not overflow(got, want), OVERFLOW
        # tolerance: scores here reach ~2,500, where one float32 rounding is ~3e-4 and a correct
        # solution's order of operations (einsum, or q/sqrt(D) @ k^T) moves a score by up to ~2e-3;
        # a probability moves by at most 1/4 of that (the softmax's slope p(1 - p) <= 1/4): 5e-4.
        # Measured: correct solutions differ by up to 6.1e-5 over 3,000 run seeds (ATOL = 1e-5 failed
        # the reference solution at some seeds); an overflowing or unmasked softmax is off by ~1.
        assert _close(got, want, atol=5e-4), "with large scores (|q . k| / sqrt(D) in the hundreds) the probabilities differ from softmax"


def _causal_map(T: int, gen: torch.Generator) -> Tensor:
    """A random (T, T) attention map: causal rows that sum to 1."""
    scores = torch.randn(T, T, generator=gen)
    return torch.softmax(scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")), -1)


@exercise("01", "distance_profile", forbid=("codex_lab.mass_by_distance",))
def check_distance_profile(fn: Callable[..., Any]) -> None:
    """fn(p) with p (T, T) one head's probabilities -> (T,): entry d is the mean of p[i, i - d]
    over the T - d queries i >= d."""
    gen = rng("01.distance_profile")
    for T in (7, 12, 1):
        p = _causal_map(T, gen)
        # profile[d] = mean_{i >= d} p[i, i - d]
        want = torch.stack([torch.diagonal(p, offset=-d).mean() for d in range(T)])  # (T,)
        got = pure_call(fn, ("p",), p)
        assert isinstance(got, Tensor), f"return a tensor, got {type(got).__name__}"
        got = got.reshape(-1) if got.numel() == T else got
        assert got.shape == want.shape, f"T={T}: expected shape ({T},), got {tuple(got.shape)}"
        if _close(got, want):
            continue
        sums = torch.stack([torch.diagonal(p, offset=-d).sum() for d in range(T)])
        if _close(got, sums):
            raise AssertionError("you summed the weights at distance d; take their mean over the T - d queries that "
                                 "have a key d tokens back")
        if _close(got, sums / T):
            raise AssertionError(f"you divided by T = {T} for every distance; only T - d queries have a key d back")
        if _close(got, torch.stack([torch.diagonal(p, offset=d).mean() for d in range(T)])):
            raise AssertionError("you read p[i, i + d], a key *after* the query (always 0 in causal attention); "
                                 "distance d means the key at i - d")
        if _close(got, p.mean(0)) or _close(got, p.sum(0) / torch.arange(T, 0, -1)):
            raise AssertionError("that is the weight on key *position* d; the distance is i - j, so read the "
                                 "diagonal p[i, i - d]")
        raise AssertionError(f"T={T}: max difference {float((got.float() - want).abs().max()):.3g} from the mean of "
                             "p[i, i - d] over i >= d")


@exercise("01", "window_share", forbid=("codex_lab.share_within",))
def check_window_share(fn: Callable[..., Any]) -> None:
    """fn(p, window, min_query) with p (T, T) -> float: mean over queries i >= min_query of the
    weight on keys with 0 <= i - j < window."""
    gen = rng("01.window_share")
    for T, w, mq in [(20, 4, 8), (16, 1, 3), (10, 3, 3), (12, 12, 11)]:
        p = _causal_map(T, gen)
        i = torch.arange(T)
        dist = i[:, None] - i[None, :]  # (T, T): i - j

        def share(near: Tensor, start: int) -> float:
            # share = mean_{i >= start} sum_{j near i} p[i, j]
            return float((p * near).sum(-1)[start:].mean())

        want = share((dist >= 0) & (dist < w), mq)
        got = as_float(pure_call(fn, ("p", "window", "min_query"), p, w, mq))
        if isinstance(got, Tensor) and got.numel() == 1:
            raise AssertionError("return a Python float (float(x)), not a tensor")
        assert isinstance(got, float), f"return a float, got {type(got).__name__}"
        if abs(got - want) < ATOL:
            continue
        if got > 1 + ATOL:
            raise AssertionError(f"got {got:.3f} > 1: a share is a mean over queries, not a sum")
        if abs(got - share((dist >= 0) & (dist <= w), mq)) < ATOL:
            raise AssertionError(f"window={w} counts {w + 1} keys; the window is the query itself and the "
                                 f"{w - 1} keys before it: 0 <= i - j < window")
        if abs(got - share((dist >= 0) & (dist < w), 0)) < ATOL:
            raise AssertionError(f"average only the queries i >= min_query = {mq}: earlier queries have (almost) "
                                 "all their keys inside the window, so their share is 1 by construction")
        if abs(got - share((dist >= 0) & (dist < w), mq + 1)) < ATOL:
            raise AssertionError(f"queries i >= min_query include i = min_query = {mq} itself; you started one later")
        if abs(got - share((dist >= 0) & (i[None, :] < w), mq)) < ATOL:
            raise AssertionError("that keeps the first `window` key positions (j < window); the window is "
                                 "measured back from each query: i - j < window")
        raise AssertionError(f"T={T}, window={w}, min_query={mq}: got {got:.4f}, expected {want:.4f}")


def _decay_share(T: int, w: int, mq: int, r: float, *, infinite: bool = False, last: bool = False,
                 wide: bool = False) -> float:
    """The reference: mean over i in [mq, T) of (1 - r^min(w, i+1)) / (1 - r^(i+1)); each keyword
    switches on one plausible mistake."""
    qs = [T - 1] if last else range(mq, T)
    out = []
    for i in qs:
        k = min(w + 1 if wide else w, i + 1)
        # share_i = sum_{d < k} r^d / sum_{d <= i} r^d = (1 - r^k) / (1 - r^(i+1))
        out.append((1 - r ** k) if infinite else (1 - r ** k) / (1 - r ** (i + 1)))
    return sum(out) / len(out)


@exercise("01", "decay_share_within", points=2, forbid=("codex_lab.share_within", "codex_lab.uniform_share_within"))
def check_decay_share_within(fn: Callable[..., Any]) -> None:
    """fn(T, window, min_query, r) -> the decaying reader's mean share within ``window``."""
    g = rng("01.decay_share_within")  # drawn for this run: a table of answers fails
    cases = [(256, 64, 128, 0.98), (64, 8, 8, 0.5), (40, 16, 0, 0.9), (300, 32, 100, 0.999), (20, 30, 5, 0.95)]
    for _ in range(3):
        T = int(torch.randint(20, 200, (1,), generator=g))
        cases.append((T, int(torch.randint(1, T, (1,), generator=g)), int(torch.randint(0, T // 2, (1,), generator=g)),
                      float(torch.empty(()).uniform_(0.8, 0.999, generator=g))))
    got = []
    for c in cases:
        x = as_float(fn(*c))
        assert isinstance(x, (float, int)) and not isinstance(x, bool), f"decay_share_within: return a float, got {type(x).__name__}"
        got.append(float(x))

    def agrees(**kw: bool) -> bool:
        # 1e-9: sums of <= 300 float64 terms; a direct weighted sum and the closed form agree to ~1e-13
        return all(abs(x - _decay_share(*c, **kw)) <= 1e-9 for x, c in zip(got, cases))

    if agrees():
        return
    mistakes = {
        "a query at i sees only keys 0..i: normalise by the finite sum (1 - r^(i+1)) / (1 - r), not the infinite "
        "series 1 / (1 - r) (early queries have few keys)": dict(infinite=True),
        "average over every query from min_query on, not only the last": dict(last=True),
        "within `window` means distance d < window (d = 0..window - 1): you counted window + 1 keys": dict(wide=True),
    }
    for msg, kw in mistakes.items():
        if agrees(**kw):
            raise AssertionError(f"decay_share_within: {msg}")
    c, x = cases[0], got[0]
    raise AssertionError(f"decay_share_within{c} returned {x:.6f}, expected {_decay_share(*c):.6f} (per query "
                         "(1 - r^min(w, i+1)) / (1 - r^(i+1)), averaged over queries i >= min_query)")
