"""Lesson 08 project checks: the learner's candidate design, and its config.

``my_design`` is scored on the stated scorecard (:mod:`codex_lab.lessons.l08_capstone.scorecard`):
an invalid design fails with one message per problem (nothing is trained); a valid one is
converted, given the same brief pre-training as the plain baseline and measured (the
notebook's measurement is reused when the check runs in the same kernel), and earns the
points of each criterion it meets. That takes about 15 s of CPU in fast mode: within the
grader's default 30 s per exercise on a quiet machine; on a loaded one pass ``--timeout 120``.

``design_to_config`` is compared with :func:`~codex_lab.lessons.l08_capstone.scorecard.design_config`
on designs the check makes up (its own oracle, forbidden to the learner's code).
"""

from __future__ import annotations

from typing import Any, Callable

from codex_lab.course.checks import case, exercise
from codex_lab.lessons.l08_capstone import scorecard as sc


def _base_cfg() -> Any:
    from codex_lab.training.checkpoint import load_pretrained

    return load_pretrained().model.cfg


@exercise("08", "my_design", points=sum(c.points for c in sc.CRITERIA))
def check_my_design(fn: Callable[..., Any]) -> None:
    """fn() -> design dict; valid, then scored criterion by criterion."""
    design = fn()
    problems = sc.validate_design(design, _base_cfg())
    assert not problems, "the design is not valid, so nothing was trained: " + "; ".join(problems)
    results = sc.score(sc.measure(design, mode=sc.scoring_mode()))
    for r in results:
        with case(r.max_points, r.key):
            assert r.passed, f"{r.key}: {r.detail}"


_DESIGNS = (
    {"sparse_layers": [3], "pattern": "window:128+blockstride:64:2", "n_kv_head": 2, "moe_layers": [3],
     "n_experts": 4, "top_k": 2, "balance": "coba"},
    {"sparse_layers": [1, 3], "pattern": "window:64", "n_kv_head": 1, "moe_layers": [0, 2], "n_experts": 8,
     "top_k": 1, "balance": "task_token"},
    {"sparse_layers": [2, 3], "pattern": "window:64+blockstride:64:4", "n_kv_head": 2, "moe_layers": [2, 3],
     "n_experts": 6, "top_k": 3, "balance": "token"},
)


@exercise("08", "design_to_config", points=3, forbid=("codex_lab.lessons.l08_capstone.scorecard.design_config",
                                                      "codex_lab.capstone_config"))
def check_design_to_config(fn: Callable[..., Any]) -> None:
    """fn(base_cfg, design) -> ModelConfig with the design's per-layer choices."""
    from codex_lab.nn.config import ModelConfig

    base = _base_cfg()
    for design in _DESIGNS:
        want = sc.design_config(base, design)
        got = fn(base, dict(design))
        assert isinstance(got, ModelConfig), f"return a ModelConfig (ModelConfig.from_dict(...)), got {type(got).__name__}"
        n = base.n_layer
        pats = [got.pattern_for(i) for i in range(n)]
        want_pats = [want.pattern_for(i) for i in range(n)]
        for step, where in ((1, "later"), (-1, "earlier")):
            moved = [i + step for i in design["sparse_layers"] if 0 <= i + step < n]
            shifted = [sc.design_config(base, {**design, "sparse_layers": moved}).pattern_for(i) for i in range(n)]
            if pats != want_pats and pats == shifted:
                raise AssertionError(f"sparse_layers {design['sparse_layers']} are 0-based layer indices, but your patterns "
                                     f"{pats} put the sparse pattern one layer {where}")
        assert pats == want_pats, (
            f"design {design}: per-layer attention patterns {pats}, expected {want_pats}: layer i gets the design's "
            "pattern if i is in sparse_layers, else 'dense'")
        assert got.n_kv_head == want.n_kv_head, (
            f"n_kv_head is {got.n_kv_head}, the design asks for {design['n_kv_head']}: set n_kv_head (grouped-query attention)")
        assert sorted(got.moe_layers) == want.moe_layers, (
            f"moe_layers {got.moe_layers}, expected {want.moe_layers}: the MoE layers are the design's moe_layers, "
            "independent of which layers are sparse")
        assert got.n_experts == want.n_experts, f"n_experts {got.n_experts}, the design asks for {design['n_experts']}"
        assert got.moe_top_k == want.moe_top_k, (
            f"moe_top_k is {got.moe_top_k}, the design's top_k is {design['top_k']}: the config field is moe_top_k")
        assert got.attn_impl == "blocks", (
            f"attn_impl {got.attn_impl!r}: the sparse layers must train through the 'blocks' kernel (it has a CPU backward)")
        for f in ("vocab_size", "d_model", "n_layer", "n_head", "ffn_hidden", "max_seq_len", "tie_embeddings"):
            assert getattr(got, f) == getattr(base, f), (
                f"{f} changed from {getattr(base, f)} to {getattr(got, f)}: the candidate keeps the base model's shape "
                "(start from base_cfg.to_dict())")
        assert (got.moe_ffn_hidden or got.ffn_hidden) == base.ffn_hidden, (
            "the experts are copies of the dense FFN (upcycling): leave moe_ffn_hidden unset")


# ------------------------------------------------------------------ Part 2b (derive it)
def _weights_read(cfg: Any, *, all_experts: bool = False, no_router: bool = False, embed_twice: bool = False,
                  no_norms: bool = False, full_kv: bool = False) -> int:
    """The reference, read off the model's own parameters: what one decode step at batch 1 reads
    (every weight it uses once: a MoE layer's router, its top-k routed experts and its shared
    experts; the tied embedding once, as the output layer, or one embedding row plus the output
    layer when untied). Each keyword switches on one plausible mistake."""
    import torch

    from codex_lab.nn.model import CodexModel

    with torch.device("meta"):  # shapes only: nothing allocated
        model = CodexModel(cfg)
    d, total = cfg.d_model, 0
    kv_dim = (cfg.n_kv_head or cfg.n_head) * (d // cfg.n_head)
    for name, p in model.named_parameters():
        n = p.numel()
        if name == "embed.weight":
            # tied: the output layer reads all V x d (and the lookup's row is one of them); untied: one row, d
            total += n + (d if embed_twice else 0) if cfg.tie_embeddings else d
        elif ".experts." in name and ".shared_experts." not in name:
            # routed experts: k of the E alike, so k / E of their weights (exact: E equal blocks)
            total += n if all_experts else n * cfg.moe_top_k // cfg.n_experts
        elif name.endswith("router.weight"):
            total += 0 if no_router else n
        elif "norm" in name:
            total += 0 if no_norms else n
        elif full_kv and (".k_proj." in name or ".v_proj." in name):
            total += n * d // kv_dim  # as if every query head kept its own K/V head
        else:
            total += n
    return total


def _derive_cfgs(r: Any) -> list[Any]:
    """Small configs drawn for this run, each with a grouped-query layer and a MoE layer."""
    from codex_lab.nn.config import ModelConfig

    out = []
    for i in range(4):
        n_head = r.choice((4, 8))
        d = n_head * r.choice((4, 8))
        n_layer = r.choice((2, 3, 4))
        n_experts = r.choice((4, 8))
        out.append(ModelConfig(vocab_size=r.randrange(50, 300), d_model=d, n_layer=n_layer, n_head=n_head,
                               n_kv_head=n_head // r.choice((2, 4)), ffn_hidden=r.choice((2, 3, 4)) * d,
                               moe_layers=sorted(r.sample(range(n_layer), r.randrange(1, n_layer))), n_experts=n_experts,
                               moe_top_k=r.choice((1, 2)), n_shared_experts=r.choice((0, 1)),
                               moe_ffn_hidden=r.choice((None, d)), tie_embeddings=i % 2 == 0, qkv_bias=i == 3))
    return out


@exercise("08", "weights_read_per_token", points=2)
def check_weights_read_per_token(fn: Callable[..., Any]) -> None:
    """fn(cfg: ModelConfig) -> parameters one batch-1 decode step reads (int)."""
    from codex_lab.course.check_tools import pyrng

    cfgs = _derive_cfgs(pyrng("08.weights_read_per_token"))  # drawn for this run: a table of answers fails
    mistakes = {
        "a MoE layer reads only the top-k routed experts a token is sent to (and its shared experts), not all of "
        "them": dict(all_experts=True),
        "the router is read too: one d x n_experts matrix per MoE layer": dict(no_router=True),
        "a tied embedding is one matrix: the output layer reads it all, and the token's row is one of its rows "
        "(count it once)": dict(embed_twice=True),
        "the norms' gains are weights too (d per norm)": dict(no_norms=True),
        "with grouped-query attention k_proj and v_proj have n_kv_head x head_dim outputs, not d_model": dict(full_kv=True),
    }
    for cfg in cfgs:
        got = fn(cfg)
        assert isinstance(got, int) and not isinstance(got, bool), (
            f"return a whole number of parameters (int), got {type(got).__name__}")
        want = _weights_read(cfg)
        if got == want:
            continue
        for msg, kw in mistakes.items():
            if got == _weights_read(cfg, **kw) != want:
                raise AssertionError(f"weights_read_per_token: {msg}")
        raise AssertionError(f"weights_read_per_token on {cfg.n_layer} layers, d={cfg.d_model}, moe_layers "
                             f"{cfg.moe_layers} (top-{cfg.moe_top_k} of {cfg.n_experts}), tied={cfg.tie_embeddings}: "
                             f"returned {got}, expected {want}")
