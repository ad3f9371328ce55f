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
