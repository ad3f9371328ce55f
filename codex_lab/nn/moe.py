"""Mixture of experts (lesson 04): a router picks ``k`` of ``E`` SwiGLU experts per token.

One MoE feed-forward layer, in the order the data flows:

1. router: ``logits = x W_r^T`` (N, E), ``p = softmax(logits)``;
2. selection: the top-k experts by ``p + b`` (``b`` = the per-expert bias of
   auxiliary-loss-free balancing, zero unless ``moe_router_bias``);
3. weights: the selected ``p`` renormalised to sum to 1 over the k choices (Mixtral);
   the bias never changes a weight, only which experts are chosen;
4. capacity (optional): each expert takes at most ``C = ceil(factor * N * k / E)``
   assignments; first choices are served before second choices, earlier tokens before
   later ones (GShard's priority); the rest are dropped (their term is 0, the token
   still flows on through the residual connection). ``factor=None`` = dropless;
5. dispatch: ``y_n = sum_j w_nj * expert_{e_nj}(x_n)`` (+ always-on shared experts).

Two dispatch implementations compute step 5 and tests hold them equal: ``"reference"``
(a readable loop over tokens and their k choices) and ``"grouped"`` (assignments sorted
by expert, one matmul per expert over its contiguous group, results scattered back with
their weights).

Balancing losses: the Switch load-balancing loss ``E * sum_e f_e P_e`` and the router
z-loss ``mean(logsumexp(logits)^2)``; the layer sets ``self.aux_loss`` to their weighted
sum on every forward. Auxiliary-loss-free balancing (DeepSeek-V3) nudges the selection
bias after each training forward: down for overloaded experts, up for underloaded ones.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.layers import SwiGLU

DISPATCH_IMPLS = ("reference", "grouped")


@dataclass
class Routing:
    """The router's decision for N tokens.

    logits (N, E) float32; probs (N, E) = softmax(logits); expert_idx (N, k) int64 chosen
    experts, best first; weights (N, k) float32 renormalised probabilities (rows sum to 1).
    """

    logits: Tensor
    probs: Tensor
    expert_idx: Tensor
    weights: Tensor


@dataclass
class RoutingStats:
    """What one forward's routing did.

    tokens_per_expert (E,) assignments each expert received (before capacity drops);
    kept_per_expert (E,) assignments it processed; dropped: assignments dropped;
    drop_rate = dropped / (N * k); capacity: per-expert limit (None = dropless);
    load_entropy: entropy (nats) of the load distribution (log E = perfect balance);
    router_entropy: mean entropy (nats) of the per-token router distribution.
    """

    tokens_per_expert: Tensor
    kept_per_expert: Tensor
    dropped: int
    drop_rate: float
    capacity: int | None
    load_entropy: float
    router_entropy: float

    @property
    def max_load_ratio(self) -> float:
        """Busiest expert's load divided by the mean load (1.0 = perfectly balanced)."""
        t = self.tokens_per_expert.float()
        return float(t.max() / t.mean().clamp_min(1e-9))


def route(logits: Tensor, top_k: int, bias: Tensor | None = None) -> Routing:
    """Softmax router with top-k selection and renormalised weights.

    Args:
        logits: router logits (N, E), any float dtype (computed in float32).
        top_k: experts per token, 1 <= top_k <= E.
        bias: optional per-expert selection bias (E,); changes which experts are chosen,
            never their weights.
    """
    if logits.dim() != 2:
        raise ValueError(f"router logits must be (tokens, experts), got shape {tuple(logits.shape)}; flatten batch and time first")
    N, E = logits.shape
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k={top_k} must be in 1..{E} (the number of experts)")
    logits = logits.float()  # (N, E)
    # p_ne = exp(l_ne) / sum_e' exp(l_ne')
    probs = torch.softmax(logits, dim=-1)  # (N, E)
    scores = probs if bias is None else probs + bias.float()  # (N, E) selection scores only
    expert_idx = torch.topk(scores, top_k, dim=-1).indices  # (N, k)
    chosen = probs.gather(-1, expert_idx)  # (N, k)
    # w_nj = p_{n,e_nj} / sum_j' p_{n,e_nj'}
    weights = chosen / chosen.sum(dim=-1, keepdim=True)  # (N, k)
    return Routing(logits=logits, probs=probs, expert_idx=expert_idx, weights=weights)


def expert_capacity(n_tokens: int, n_experts: int, top_k: int, capacity_factor: float | None) -> int | None:
    """Per-expert capacity ``ceil(factor * N * k / E)`` in assignments; None = dropless."""
    if capacity_factor is None:
        return None
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor={capacity_factor} must be > 0 (or None for dropless)")
    # C = ceil(factor * N * k / E)
    return math.ceil(capacity_factor * n_tokens * top_k / n_experts)


def capacity_keep_mask(expert_idx: Tensor, n_experts: int, capacity: int | None) -> Tensor:
    """Which assignments an expert with ``capacity`` slots accepts: bool (N, k).

    Priority: all first choices (slot 0) in token order, then all second choices, ...
    ``capacity=None`` keeps everything (dropless).
    """
    N, k = expert_idx.shape
    if capacity is None:
        return torch.ones(N, k, dtype=torch.bool, device=expert_idx.device)
    order = expert_idx.t().reshape(-1)  # (k*N,) slot-major priority order
    onehot = F.one_hot(order, n_experts)  # (k*N, E)
    # queue position of an assignment = assignments to the same expert before it
    position = (onehot.cumsum(dim=0) - 1).gather(1, order[:, None]).squeeze(1)  # (k*N,)
    keep = position < capacity  # (k*N,)
    return keep.view(k, N).t()  # (N, k)


def dispatch_reference(x: Tensor, routing: Routing, experts: nn.ModuleList, keep: Tensor) -> Tensor:
    """Readable dispatch: for every token and each of its k choices, run that expert.

    x (N, d); keep (N, k) bool -> (N, d). Slow on purpose (N * k tiny matmuls).
    """
    y = torch.zeros_like(x)  # (N, d)
    N, k = routing.expert_idx.shape
    for n in range(N):
        for j in range(k):
            if not keep[n, j]:
                continue  # dropped: over capacity
            e = int(routing.expert_idx[n, j])
            # y_n += w_nj * expert_e(x_n)
            y[n] = y[n] + routing.weights[n, j].to(x.dtype) * experts[e](x[n : n + 1])[0]
    return y


def dispatch_grouped(x: Tensor, routing: Routing, experts: nn.ModuleList, keep: Tensor) -> Tensor:
    """Grouped dispatch: sort kept assignments by expert, one matmul chain per expert.

    Without gradients the experts run over their stacked weights (gate and up fused, one
    grouped matmul each for gate|up and down, cached until a weight changes); with
    gradients, a loop over the non-empty experts (autograd through each module).

    x (N, d); keep (N, k) bool -> (N, d). Equal to :func:`dispatch_reference`.
    """
    N, k = routing.expert_idx.shape
    flat_expert = routing.expert_idx.reshape(-1)  # (N*k,)
    flat_token = torch.arange(N, device=x.device).repeat_interleave(k)  # (N*k,)
    flat_weight = routing.weights.reshape(-1)  # (N*k,)
    kept = keep.reshape(-1)  # (N*k,)
    if not bool(kept.all()):
        flat_expert, flat_token, flat_weight = flat_expert[kept], flat_token[kept], flat_weight[kept]
    order = torch.argsort(flat_expert, stable=True)  # (A,) assignments grouped by expert
    token_sorted = flat_token[order]  # (A,)
    counts_t = torch.bincount(flat_expert, minlength=len(experts))  # (E,) group sizes
    x_sorted = x[token_sorted]  # (A, d) gathered once
    w_sorted = flat_weight[order].to(x.dtype)[:, None]  # (A, 1)
    if not torch.is_grad_enabled() and x_sorted.shape[0]:
        # inference: all experts at once over stacked weights, no Python loop per expert
        y_sorted = _stacked_experts(x_sorted, counts_t, experts) * w_sorted  # (A, d) weighted
        # back to (token, choice) slots by a gather (CPU index_add_ is a slow serial scatter):
        # slot s of the N*k reads assignment src[s], or the zero row A when s was dropped
        A = y_sorted.shape[0]
        slot = torch.arange(N * k, device=x.device) if bool(kept.all()) else torch.nonzero(kept).flatten()  # (A,)
        src = torch.full((N * k,), A, dtype=torch.long, device=x.device)  # (N*k,)
        src[slot[order]] = torch.arange(A, device=x.device)
        y_ext = torch.cat([y_sorted, y_sorted.new_zeros(1, y_sorted.shape[1])])  # (A+1, d)
        # y_n = sum_j (w_nj expert_nj(x_n))
        return y_ext[src].view(N, k, -1).sum(1)  # (N, d)
    else:
        counts = counts_t.tolist()
        outs = []
        start = 0
        for e, count in enumerate(counts):
            if count:
                outs.append(experts[e](x_sorted[start : start + count]))  # (count, d)
            start += count
        if not outs:
            return torch.zeros_like(x)
        y_sorted = torch.cat(outs)  # (A, d)
    # y_n = sum over the assignments of token n of w * expert(x_n)
    return torch.zeros_like(x).index_add_(0, token_sorted, y_sorted * w_sorted)  # (N, d)


_STACKED: "weakref.WeakKeyDictionary[nn.ModuleList, tuple[tuple, Tensor, Tensor]]" = weakref.WeakKeyDictionary()


def _stacked_weights(experts: nn.ModuleList) -> tuple[Tensor, Tensor]:
    """(E, d, 2h) gate|up and (E, h, d) down weights of the experts, rebuilt only when a
    parameter changed (its version counter or storage), so inference pays the copy once."""
    params = [p for e in experts for p in (e.gate_proj.weight, e.up_proj.weight, e.down_proj.weight)]
    key = tuple((p.data_ptr(), p._version) for p in params)
    hit = _STACKED.get(experts)
    if hit is not None and hit[0] == key:
        return hit[1], hit[2]
    with torch.no_grad():
        # x @ [W_gate^T | W_up^T]: one matmul gives both halves
        w_gu = torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight]).t() for e in experts]).contiguous()  # (E, d, 2h)
        w_d = torch.stack([e.down_proj.weight.t() for e in experts]).contiguous()  # (E, h, d)
    _STACKED[experts] = (key, w_gu, w_d)
    return w_gu, w_d


def _grouped_mm(x: Tensor, w: Tensor, counts: Tensor, offs: Tensor | None) -> Tensor:
    """Row group e of x (A, i) times w[e] (i, o) -> (A, o): torch's grouped matmul where it
    runs, else one matmul per non-empty group."""
    if offs is not None:
        try:
            return torch._grouped_mm(x, w, offs=offs)
        except (RuntimeError, AttributeError):  # strides not 16-byte aligned, or no kernel here
            pass
    out = x.new_empty(x.shape[0], w.shape[-1])
    start = 0
    for e, c in enumerate(counts.tolist()):
        if c:
            torch.mm(x[start : start + c], w[e], out=out[start : start + c])
        start += c
    return out


def _stacked_experts(x_sorted: Tensor, counts: Tensor, experts: nn.ModuleList) -> Tensor:
    """SwiGLU of every expert on its contiguous group of x_sorted (A, d) -> (A, d)."""
    if not all(isinstance(e, SwiGLU) for e in experts):
        raise TypeError("stacked dispatch needs SwiGLU experts")
    w_gu, w_d = _stacked_weights(experts)
    h = w_d.shape[1]
    offs = torch.cumsum(counts, 0).to(torch.int32) if hasattr(torch, "_grouped_mm") else None  # (E,) group ends
    gu = _grouped_mm(x_sorted, w_gu, counts, offs)  # (A, 2h)
    # SwiGLU: silu(x W_gate^T) * (x W_up^T)
    hidden = F.silu(gu[:, :h]) * gu[:, h:]  # (A, h)
    return _grouped_mm(hidden, w_d, counts, offs)  # (A, d)


def load_balancing_loss(probs: Tensor, expert_idx: Tensor) -> Tensor:
    """Switch-Transformer load-balancing loss, 1.0 at perfect balance.

    probs (N, E) router probabilities; expert_idx (N, k) selected experts -> scalar.
    f_e = share of the N*k assignments that went to e (no gradient), P_e = mean router
    probability of e. (Hugging Face's ``load_balancing_loss_func`` sums f over the k slots
    separately, which equals k times this value.)
    """
    N, E = probs.shape
    counts = torch.bincount(expert_idx.reshape(-1), minlength=E).to(probs.dtype)  # (E,)
    f = counts / expert_idx.numel()  # (E,) sums to 1
    P = probs.mean(dim=0)  # (E,)
    # L_aux = E * sum_e f_e * P_e
    return E * (f * P).sum()


def router_z_loss(logits: Tensor) -> Tensor:
    """Router z-loss (ST-MoE): mean over tokens of logsumexp(logits)^2; logits (N, E)."""
    # L_z = mean_n (log sum_e exp(l_ne))^2
    return torch.logsumexp(logits.float(), dim=-1).pow(2).mean()


def routing_stats(routing: Routing, keep: Tensor, n_experts: int, capacity: int | None) -> RoutingStats:
    """Tokens per expert, drops, and entropies of one routing decision (no gradient)."""
    with torch.no_grad():
        idx = routing.expert_idx
        tpe = torch.bincount(idx.reshape(-1), minlength=n_experts)  # (E,)
        kept = torch.bincount(idx[keep], minlength=n_experts)  # (E,)
        dropped = int(idx.numel() - int(keep.sum()))
        load = tpe.float() / max(1, idx.numel())  # (E,)
        # H(load) = -sum_e q_e log q_e
        load_entropy = float(-(load * load.clamp_min(1e-12).log()).sum())
        p = routing.probs
        # H(p_n) = -sum_e p_ne log p_ne, averaged over tokens
        router_entropy = float(-(p * p.clamp_min(1e-12).log()).sum(-1).mean()) if p.numel() else 0.0
    return RoutingStats(tokens_per_expert=tpe.cpu(), kept_per_expert=kept.cpu(), dropped=dropped,
                        drop_rate=dropped / max(1, idx.numel()), capacity=capacity,
                        load_entropy=load_entropy, router_entropy=router_entropy)


def bias_update(tokens_per_expert: Tensor, rate: float) -> Tensor:
    """DeepSeek-V3 auxiliary-loss-free step: ``rate * sign(mean load - load_e)`` (E,).

    Overloaded experts get a negative step (chosen less), underloaded a positive one.
    """
    load = tokens_per_expert.float()  # (E,)
    # delta_e = rate * sign(mean(load) - load_e)
    return rate * torch.sign(load.mean() - load)


class MoEFeedForward(nn.Module):
    """Mixture-of-experts feed-forward: (B, T, d) -> (B, T, d).

    Args:
        cfg: model config; uses d_model, n_experts, moe_top_k, n_shared_experts,
            moe_ffn_hidden (or ffn_hidden), moe_capacity_factor, moe_aux_loss_coef,
            moe_z_loss_coef and moe_router_bias.
        impl: dispatch implementation, "grouped" (default) or "reference".
        bias_update_rate: step of the selection bias per training forward when
            ``cfg.moe_router_bias`` (DeepSeek-V3 used 0.001).

    After every forward: ``aux_loss`` (weighted scalar), ``last_routing`` (detached
    :class:`Routing`) and ``last_stats`` (:class:`RoutingStats`).
    """

    def __init__(self, cfg: ModelConfig, *, impl: str = "grouped", bias_update_rate: float = 1e-3) -> None:
        super().__init__()
        if impl not in DISPATCH_IMPLS:
            raise ValueError(f"impl={impl!r}; choose one of {DISPATCH_IMPLS}")
        hidden = cfg.moe_ffn_hidden or cfg.ffn_hidden
        assert hidden is not None
        self.n_experts, self.top_k = cfg.n_experts, cfg.moe_top_k
        self.capacity_factor = cfg.moe_capacity_factor
        self.aux_loss_coef, self.z_loss_coef = cfg.moe_aux_loss_coef, cfg.moe_z_loss_coef
        self.use_bias, self.bias_update_rate, self.impl = cfg.moe_router_bias, bias_update_rate, impl
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(cfg.d_model, hidden) for _ in range(cfg.n_experts))
        self.shared_experts = nn.ModuleList(SwiGLU(cfg.d_model, hidden) for _ in range(cfg.n_shared_experts))
        self.register_buffer("expert_bias", torch.zeros(cfg.n_experts))  # (E,)
        self.aux_loss: Tensor = torch.zeros(())
        self.last_routing: Routing | None = None
        self.last_stats: RoutingStats | None = None

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, d) -> (B, T, d); sets aux_loss, last_routing, last_stats."""
        if x.dim() != 3 or x.shape[-1] != self.router.in_features:
            raise ValueError(
                f"MoEFeedForward expects (batch, tokens, {self.router.in_features}), got {tuple(x.shape)}; "
                "add a batch dimension with x[None] or check d_model"
            )
        B, T, d = x.shape
        xf = x.reshape(B * T, d)  # (N, d)
        logits = self.router(xf)  # (N, E)
        routing = route(logits, self.top_k, self.expert_bias if self.use_bias else None)
        capacity = expert_capacity(B * T, self.n_experts, self.top_k, self.capacity_factor)
        keep = capacity_keep_mask(routing.expert_idx, self.n_experts, capacity)  # (N, k)
        fn = dispatch_grouped if self.impl == "grouped" else dispatch_reference
        y = fn(xf, routing, self.experts, keep)  # (N, d)
        for shared in self.shared_experts:
            y = y + shared(xf)  # (N, d) always-on experts
        aux = x.new_zeros((), dtype=torch.float32)
        if self.aux_loss_coef:
            aux = aux + self.aux_loss_coef * load_balancing_loss(routing.probs, routing.expert_idx)
        if self.z_loss_coef:
            aux = aux + self.z_loss_coef * router_z_loss(routing.logits)
        self.aux_loss = aux
        self.last_stats = routing_stats(routing, keep, self.n_experts, capacity)
        self.last_routing = Routing(*(t.detach() for t in (routing.logits, routing.probs, routing.expert_idx, routing.weights)))
        if self.use_bias and self.training and torch.is_grad_enabled():
            with torch.no_grad():
                # b_e <- b_e + rate * sign(mean load - load_e), once per training forward
                self.expert_bias += bias_update(self.last_stats.tokens_per_expert.to(self.expert_bias.device), self.bias_update_rate)
        return y.view(B, T, d)


def set_dispatch_impl(model: nn.Module, impl: str) -> None:
    """Switch every MoE layer of ``model`` to dispatch ``impl`` ("reference" or "grouped")."""
    if impl not in DISPATCH_IMPLS:
        raise ValueError(f"impl={impl!r}; choose one of {DISPATCH_IMPLS}")
    for m in model.modules():
        if isinstance(m, MoEFeedForward):
            m.impl = impl


def moe_layers_of(model: nn.Module) -> list[MoEFeedForward]:
    """The MoE feed-forward modules of a model, in layer order."""
    return [m for m in model.modules() if isinstance(m, MoEFeedForward)]


def ffn_param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Feed-forward parameters of one MoE layer: total, active per token, and the router.

    An expert has 3 * d * h weights; a token uses the router, k routed experts and the
    shared experts. Forward FLOPs per token of the layer ~= 2 * active.
    """
    h = cfg.moe_ffn_hidden or cfg.ffn_hidden
    assert h is not None
    expert = 3 * cfg.d_model * h
    router = cfg.d_model * cfg.n_experts
    total = router + (cfg.n_experts + cfg.n_shared_experts) * expert
    # active = router + (k + shared) experts
    active = router + (cfg.moe_top_k + cfg.n_shared_experts) * expert
    return {"total": total, "active": active, "router": router, "expert": expert}
