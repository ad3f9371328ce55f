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
by expert, one matmul chain per expert over its contiguous group, results added back to
their tokens with their weights); both live in :mod:`codex_lab.nn.moe_dispatch`.

Balancing losses: the Switch load-balancing loss ``E * sum_e f_e P_e`` and the router
z-loss ``mean(logsumexp(logits)^2)``; the layer sets ``self.aux_loss`` to their weighted
sum on every forward. Auxiliary-loss-free balancing (DeepSeek-V3) nudges the selection
bias after each training forward: down for overloaded experts, up for underloaded ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.layers import SwiGLU
# step 5 lives in moe_dispatch (reference loop beside the grouped fast path)
from codex_lab.nn.moe_dispatch import DISPATCH_IMPLS, dispatch_grouped, dispatch_reference


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
    top = torch.topk(scores, top_k, dim=-1)
    expert_idx = top.indices  # (N, k)
    chosen = top.values if bias is None else probs.gather(-1, expert_idx)  # (N, k) chosen p
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


def routing_stats(routing: Routing, keep: Tensor | None, n_experts: int, capacity: int | None) -> RoutingStats:
    """Tokens per expert, drops, and entropies of one routing decision (no gradient).

    keep (N, k) bool from :func:`capacity_keep_mask`; None = every assignment kept.
    """
    with torch.no_grad():
        idx = routing.expert_idx
        if keep is None:
            keep = torch.ones_like(idx, dtype=torch.bool)  # (N, k)
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
    :class:`Routing`) and ``last_stats`` (:class:`RoutingStats`, computed on first read).
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
        # grouped inference on a CPU in fp32: None = the fused native kernel where it builds,
        # False = the torch path (the bench times both), True = native or an error
        self.native: bool | None = None
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(cfg.d_model, hidden) for _ in range(cfg.n_experts))
        self.shared_experts = nn.ModuleList(SwiGLU(cfg.d_model, hidden) for _ in range(cfg.n_shared_experts))
        self.register_buffer("expert_bias", torch.zeros(cfg.n_experts))  # (E,)
        self.aux_loss: Tensor = torch.zeros(())
        self.last_routing: Routing | None = None
        self._stats: RoutingStats | None = None
        self._stats_of: tuple[Tensor | None, int | None] | None = None  # (keep, capacity) of last_routing

    @property
    def last_stats(self) -> RoutingStats | None:
        """:class:`RoutingStats` of the last forward (None before the first), computed when
        first read: the bincounts, entropies and host syncs stay out of every forward."""
        if self._stats_of is not None and self.last_routing is not None:
            keep, capacity = self._stats_of
            self._stats = routing_stats(self.last_routing, keep, self.n_experts, capacity)
            self._stats_of = None
        return self._stats

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
        # (N, k) bool, or None when dropless (nothing to mask)
        keep = None if capacity is None else capacity_keep_mask(routing.expert_idx, self.n_experts, capacity)
        if self.impl == "grouped":
            y = dispatch_grouped(xf, routing, self.experts, keep, native=self.native)  # (N, d)
        else:
            y = dispatch_reference(xf, routing, self.experts, keep)  # (N, d)
        for shared in self.shared_experts:
            y = y + shared(xf)  # (N, d) always-on experts
        aux = x.new_zeros((), dtype=torch.float32)
        if self.aux_loss_coef:
            aux = aux + self.aux_loss_coef * load_balancing_loss(routing.probs, routing.expert_idx)
        if self.z_loss_coef:
            aux = aux + self.z_loss_coef * router_z_loss(routing.logits)
        self.aux_loss = aux
        self.last_routing = Routing(*(t.detach() for t in (routing.logits, routing.probs, routing.expert_idx, routing.weights)))
        self._stats, self._stats_of = None, (keep, capacity)  # last_stats computes them when read
        if self.use_bias and self.training and torch.is_grad_enabled():
            stats = self.last_stats
            assert stats is not None
            with torch.no_grad():
                # b_e <- b_e + rate * sign(mean load - load_e), once per training forward
                self.expert_bias += bias_update(stats.tokens_per_expert.to(self.expert_bias.device), self.bias_update_rate)
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
