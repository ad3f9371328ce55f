"""Lesson 04 exercises: top-k routing, the load-balancing loss, capacity-limited dispatch, and
(derived, not shown) the expected share of tokens a capacity limit drops under balanced routing.

Each check computes the expected answer with plain code here (the package's ``route``,
``load_balancing_loss`` and ``capacity_keep_mask`` are the answers, so the checks do not
lean on them; tests hold these references equal to ``codex_lab.nn.moe``), and on a wrong
answer recognises the usual mistake and names it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from codex_lab.course.check_tools import OVERFLOW, overflow, pure_call, rng
from codex_lab.course.checks import case, exercise


def _scatter(idx: Tensor, w: Tensor, E: int) -> Tensor:
    """(N, E) weight per expert, so two answers compare whatever the order of the k columns."""
    return torch.zeros(idx.shape[0], E).scatter(1, idx.long(), w.float())


@exercise("04", "top_k_route", points=4, forbid=("codex_lab.route",))
def check_top_k_route(fn: Callable[..., Any]) -> None:
    """fn(logits (N, E), k) -> (expert_idx (N, k) int64, weights (N, k) float), weights renormalised."""
    gen = rng("04.top_k_route")
    logits = 2 * torch.randn(12, 6, generator=gen)
    probs = torch.softmax(logits, dim=-1)  # (N, E)
    outs = {k: pure_call(fn, ("logits", "k"), logits, k) for k in (1, 2, 4)}
    with case(1, "int64 (N, k) indices and (N, k) weights"):
        for k, out in outs.items():
            assert isinstance(out, tuple) and len(out) == 2, "return a tuple (expert_idx, weights)"
            idx, w = out
            assert isinstance(idx, Tensor) and isinstance(w, Tensor), "return two tensors (expert_idx, weights)"
            assert tuple(idx.shape) == (12, k) and tuple(w.shape) == (12, k), (
                f"expert_idx and weights must be (N, k) = (12, {k}), got {tuple(idx.shape)} and {tuple(w.shape)}")
            assert idx.dtype == torch.long, (
                f"expert_idx has dtype {idx.dtype}; return int64 (torch.long) indices: gather, scatter, index_add_ "
                "and bincount in the dispatch need them (torch.topk's .indices already are)")
    with case(1, "the k most probable experts"):
        for k, (idx, _) in outs.items():
            got = idx.long().sort(-1).values
            if not torch.equal(got, probs.topk(k, dim=-1).indices.sort(-1).values):
                if torch.equal(got, torch.softmax(logits, dim=0).topk(k, dim=-1).indices.sort(-1).values):
                    raise AssertionError(f"k={k}: the softmax ran over the tokens (dim=0); each token's logits are "
                                         "normalised over the experts (dim=-1)")
                if torch.equal(got, probs.topk(k, dim=-1, largest=False).indices.sort(-1).values):
                    raise AssertionError(f"k={k}: you chose the k *least* probable experts; take the largest (torch.topk default)")
                raise AssertionError(f"k={k}: wrong experts chosen; take the k largest softmax probabilities per token (torch.topk)")
    with case(1, "renormalised weights, aligned with their experts"):
        for k, (idx, w) in outs.items():
            top = probs.topk(k, dim=-1)  # values, indices (N, k)
            # w_nj = p_{n,e_nj} / sum_j' p_{n,e_nj'}
            want = top.values / top.values.sum(-1, keepdim=True)  # (N, k)
            if torch.allclose(_scatter(idx, w, 6), _scatter(top.indices, want, 6), atol=1e-5):
                continue
            if torch.allclose(_scatter(idx, w, 6), _scatter(top.indices, top.values, 6), atol=1e-5) and k < 6:
                raise AssertionError(f"k={k}: the weights are the raw probabilities; divide the k chosen probabilities "
                                     "by their sum so each token's weights add up to 1")
            if not torch.allclose(w.float().sum(-1), torch.ones(12), atol=1e-5):
                raise AssertionError(f"k={k}: each token's k weights must sum to 1 (they sum to "
                                     f"{float(w.float().sum(-1)[0]):.3f} for token 0)")
            if torch.allclose(w.float().sort(-1).values, want.sort(-1).values, atol=1e-5):
                raise AssertionError(f"k={k}: the right weights in the wrong columns: weights[n, j] must belong to "
                                     "expert_idx[n, j] (keep topk's values and indices together)")
            raise AssertionError(f"k={k}: weights differ from the renormalised softmax probabilities p_e / sum_(chosen) p")
        # large router logits: a softmax without the row max overflows
        big = 60 * torch.randn(5, 6, generator=gen)
        big[:, 0] = 200.0  # exp(200) overflows float32
        idx, w = fn(big.clone(), 2)
        top = torch.softmax(big, -1).topk(2, dim=-1)
        assert not overflow(w, top.values), OVERFLOW
    with case(1, "the weights keep the router's graph"):
        leaf = logits.clone().requires_grad_(True)
        idx, w = fn(leaf, 2)
        assert isinstance(w, Tensor) and w.requires_grad, (
            "the weights are detached from the router logits (.detach(), .item(), torch.no_grad or a new tensor built "
            "from numbers): the MoE loss could not train the router; compute them with tensor ops on the logits")
        (got,) = torch.autograd.grad((w * torch.arange(1.0, 3.0)).sum(), leaf)
        ref = logits.clone().requires_grad_(True)
        top = torch.softmax(ref, -1).topk(2, dim=-1)
        # same weighted sum through the reference weights; columns matched by expert index
        order = (idx.long().unsqueeze(-1) == top.indices.unsqueeze(-2)).float()  # (N, k_got, k_ref)
        coef = torch.einsum("nij,j->ni", order.transpose(-1, -2), torch.arange(1.0, 3.0))  # (N, k_ref)
        (want,) = torch.autograd.grad((top.values / top.values.sum(-1, keepdim=True) * coef).sum(), ref)
        assert torch.allclose(got, want, atol=1e-5), (
            "the gradient of the weights w.r.t. the logits is not that of the renormalised softmax: keep the weights "
            "one tensor computation from the logits (softmax, topk values, divide by their sum)")


def _switch(probs: Tensor, idx: Tensor, *, per_token: bool = False, times_e: bool = True, f_from_probs: bool = False) -> Tensor:
    """E * sum_e f_e P_e; the keyword options build the usual wrong variants."""
    N, E = probs.shape
    counts = torch.bincount(idx.reshape(-1), minlength=E).to(probs.dtype)  # (E,)
    f = counts / (N if per_token else idx.numel())  # (E,) share of the N*k assignments
    P = probs.mean(dim=0)  # (E,) mean router probability
    if f_from_probs:
        f = P
    # L = E * sum_e f_e * P_e
    return (E if times_e else 1) * (f * P).sum()


@exercise("04", "balancing_loss", points=3, forbid=("codex_lab.load_balancing_loss",))
def check_balancing_loss(fn: Callable[..., Any]) -> None:
    """fn(probs (N, E), expert_idx (N, k)) -> scalar E * sum_e f_e * P_e (f over N*k assignments)."""
    logits = torch.randn(20, 5, generator=rng("04.balancing_loss"), requires_grad=True)
    probs = torch.softmax(logits, -1)  # (N, E)
    idx = probs.topk(2, -1).indices  # (N, 2)
    loss = pure_call(fn, ("probs", "expert_idx"), probs, idx)
    with case(2, "the value E * sum_e f_e P_e"):
        assert isinstance(loss, Tensor) and loss.numel() == 1, "return a scalar tensor"
        want = _switch(probs.detach(), idx)
        got = float(loss.detach())
        if abs(got - float(want)) > 1e-5:
            pd = probs.detach()
            if abs(got - float(_switch(pd, idx, per_token=True))) < 1e-5:
                raise AssertionError(f"got {got:.4f} = k times the answer: f_e is the share of all N*k assignments "
                                     "(divide the counts by expert_idx.numel(), not by N)")
            if abs(got - float(_switch(pd, idx[:, :1]))) < 1e-5:
                raise AssertionError(f"got {got:.4f}: f_e counted only the first choices; count all k choices of every "
                                     "token (expert_idx.reshape(-1))")
            if abs(got - float(_switch(pd, idx, times_e=False))) < 1e-5:
                raise AssertionError(f"got {got:.4f}: multiply by E = {pd.shape[1]} so that perfect balance gives 1.0")
            if abs(got - float(_switch(pd, idx, f_from_probs=True))) < 1e-5:
                raise AssertionError("f_e must count the assignments in expert_idx (bincount), not the mean probability: "
                                     "E * sum P_e^2 ignores which experts were chosen")
            if abs(got - float(_switch(pd, idx)) * pd.shape[0]) < 1e-4:
                raise AssertionError("P_e is the *mean* router probability over the N tokens, not the sum")
            raise AssertionError(f"got {got:.5f}, expected {float(want):.5f} = E * sum_e f_e * P_e")
        E = 4
        uniform = torch.full((8, E), 1 / E)
        got = float(fn(uniform, torch.arange(16).view(8, 2) % E))
        assert abs(got - 1.0) < 1e-5, f"perfect balance must give 1.0, got {got:.4f}"
        collapsed = torch.zeros(8, E)
        collapsed[:, 0] = 1.0
        got = float(fn(collapsed, torch.zeros(8, 1, dtype=torch.long)))
        assert abs(got - E) < 1e-5, f"everything on one expert must give E = {E}, got {got:.4f}"
    with case(1, "the gradient reaches the router"):
        assert isinstance(loss, Tensor) and loss.requires_grad, (
            "return a tensor that keeps the graph through P (the mean probabilities), so the router learns")
        (grad,) = torch.autograd.grad(loss.sum(), logits, retain_graph=True)  # the reference below reuses the softmax
        # dL/dP_e = E * f_e (f has no gradient): compare through the softmax
        want_grad = torch.autograd.grad(_switch(probs, idx), logits)[0]
        assert torch.allclose(grad, want_grad, atol=1e-5), (
            "the gradient differs from E * f_e through P_e: keep f a count (no gradient) and P the mean of probs")


def _keep(idx: Tensor, E: int, capacity: int, *, token_major: bool = False, latest_first: bool = False) -> Tensor:
    """Capacity mask; slot-major, earliest token first unless the options say otherwise."""
    N, k = idx.shape
    used = [0] * E
    keep = torch.zeros(N, k, dtype=torch.bool)
    tokens = list(range(N))[::-1] if latest_first else list(range(N))
    order = [(n, j) for n in tokens for j in range(k)] if token_major else [(n, j) for j in range(k) for n in tokens]
    for n, j in order:
        e = int(idx[n, j])
        if used[e] < capacity:  # a free slot left at expert e
            used[e] += 1
            keep[n, j] = True
    return keep


@exercise("04", "capacity_mask", points=3, forbid=("codex_lab.capacity_keep_mask",))
def check_capacity_mask(fn: Callable[..., Any]) -> None:
    """fn(expert_idx (N, k), n_experts, capacity) -> bool (N, k): first choices served first."""
    g = rng("04.capacity_mask")
    cases = [(torch.tensor([[0, 1], [1, 0], [0, 1]]), 2, 1)]
    cases += [(torch.stack([torch.randperm(6, generator=g)[:2] for _ in range(15)]), 6, cap) for cap in (1, 3, 5)]
    outs = [pure_call(fn, ("expert_idx", "n_experts", "capacity"), idx, E, cap) for idx, E, cap in cases]
    with case(1, "a bool (N, k) mask"):
        for (idx, _, _), got in zip(cases, outs):
            assert isinstance(got, Tensor) and got.dtype == torch.bool and got.shape == idx.shape, (
                f"return a bool tensor of shape (N, k) = {tuple(idx.shape)}")
    with case(1, "each expert fills exactly min(demand, capacity) slots"):
        for (idx, E, cap), got in zip(cases, outs):
            counts = torch.bincount(idx[got.bool()], minlength=E)  # kept assignments per expert
            demand = torch.bincount(idx.reshape(-1), minlength=E)
            if int(counts.max()) > cap:
                e = int(counts.argmax())
                hint = " (off by one: keep while used < capacity, not <=)" if int(counts.max()) == cap + 1 else ""
                raise AssertionError(f"capacity {cap}: expert {e} kept {int(counts.max())} assignments{hint}")
            short = (counts < torch.clamp(demand, max=cap)).nonzero().flatten().tolist()
            if short:
                raise AssertionError(f"capacity {cap}: expert {short[0]} had a free slot but dropped an assignment; "
                                     "count the slots used per expert (a separate counter for each expert)")
    with case(1, "first choices before second choices, earlier tokens first"):
        for (idx, E, cap), got in zip(cases, outs):
            want = _keep(idx, E, cap)
            got = got.bool()
            if torch.equal(got, want):
                continue
            if torch.equal(got, _keep(idx, E, cap, token_major=True)):
                raise AssertionError(f"capacity {cap}: you served token by token (token 0's choices, then token 1's); "
                                     "serve every token's first choice before any second choice (slot by slot)")
            if torch.equal(got, _keep(idx, E, cap, latest_first=True)):
                raise AssertionError(f"capacity {cap}: within a slot, earlier tokens are served first")
            raise AssertionError(f"capacity {cap}: {int((got != want).sum())} assignments differ from the expected mask "
                                 "(slot by slot, tokens in order within a slot)")


# ------------------------------------------------------------------ exercise 4
def _drop_fraction(N: int, E: int, C: int, *, jensen: bool = False, no_experts: bool = False,
                   strict: bool = False, per_expert: bool = False) -> float:
    """The reference: E x sum_{n > C} P(n) (n - C) / N, n ~ Binomial(N, 1/E); each keyword
    switches on one plausible mistake."""
    if jensen:  # max(0, E[n] - C): the expectation moved inside the max
        return max(0.0, N / E - C) * E / N
    p = 1.0 / E
    # over = sum_{n > C} P(n) (n - C), P(n) = comb(N, n) p^n (1 - p)^(N - n): one expert's expected drops
    over = sum(math.comb(N, n) * p ** n * (1 - p) ** (N - n) * (n - C) for n in range(C + 1, N + 1))
    if strict:  # a load of exactly C counted as dropping one (n - C + 1 from C on)
        over = sum(math.comb(N, n) * p ** n * (1 - p) ** (N - n) * (n - C + 1) for n in range(C, N + 1))
    if per_expert:  # the expected number of tokens dropped, not a share of the tokens
        return E * over
    if no_experts:  # one expert's drops taken as the whole: not multiplied by E
        return over / N
    return E * over / N


@exercise("04", "expected_drop_fraction", points=2, forbid=("codex_lab.capacity_keep_mask",))
def check_expected_drop_fraction(fn: Callable[..., Any]) -> None:
    """fn(n_tokens, n_experts, capacity) -> expected share of tokens dropped (uniform top-1 routing)."""
    g = rng("04.expected_drop_fraction")  # drawn for this run: a table of answers fails
    cases = [(64, 8, 8), (64, 8, 10), (32, 4, 8), (100, 10, 15), (16, 16, 1), (20, 2, 20), (50, 5, 0)]
    for _ in range(3):
        E = int(torch.randint(2, 12, (1,), generator=g))
        N = E * int(torch.randint(2, 12, (1,), generator=g))
        cases.append((N, E, int(torch.randint(1, N // E + 4, (1,), generator=g))))
    got = []
    for N, E, C in cases:
        out = fn(N, E, C)
        try:
            got.append(float(out))
        except (TypeError, ValueError):
            raise AssertionError(f"expected_drop_fraction: return a number (a float), got {type(out).__name__}") from None
    # 1e-9 absolute + 1e-6 relative: an exact sum of at most ~100 binomial terms in float64 agrees far closer; the
    # relative part admits the same sum in another order or through lgamma
    ok = [abs(x - _drop_fraction(*c)) <= 1e-9 + 1e-6 * _drop_fraction(*c) for x, c in zip(got, cases)]
    if all(ok):
        return
    mistakes = {
        "the expectation went inside the max: E[max(0, n - C)] is not max(0, E[n] - C) (at capacity factor 1 that "
        "gives 0, yet a load above C happens often); sum over the distribution of one expert's load": dict(jensen=True),
        "every expert drops alike: multiply one expert's expected drops by the number of experts": dict(no_experts=True),
        "return a share of the tokens (divide the expected drops of all experts by n_tokens)": dict(per_expert=True),
        "an expert with exactly `capacity` tokens drops none: it drops n - C only when n > C": dict(strict=True),
    }
    for msg, kw in mistakes.items():
        if all(abs(x - _drop_fraction(*c, **kw)) <= 1e-9 + 1e-6 * abs(_drop_fraction(*c, **kw)) for x, c in zip(got, cases)):
            raise AssertionError(f"expected_drop_fraction: {msg}")
    i = ok.index(False)
    raise AssertionError(f"expected_drop_fraction{cases[i]} returned {got[i]:.6f}, expected {_drop_fraction(*cases[i]):.6f} "
                         "(one expert's load is Binomial(n_tokens, 1/n_experts); it drops max(0, n - capacity))")
