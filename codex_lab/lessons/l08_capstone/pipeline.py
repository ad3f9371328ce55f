"""The capstone recipe (lesson 08): one model with every optimisation of the course.

The candidate is built from a trained plain model (the shipped checkpoint) and compared with
that plain model given the same training budget:

1. architecture (:func:`capstone_config`): dense attention in the first layers, a sparse
   pattern (local window + block-granular stride, lesson 02) in the deeper ones, grouped-query
   attention (lesson 03) and mixture-of-experts feed-forwards in the deep layers (lesson 04);
2. conversion (:func:`convert`): K/V heads mean-pooled (:func:`codex_lab.lessons.l03_gqa.experiments.mha_to_gqa`),
   every expert a copy of the layer's dense FFN ("sparse upcycling", Komatsuzaki et al. 2022),
   so an MoE layer computes exactly its dense FFN until training moves the experts apart;
3. brief pre-training of both models on the same batches (:func:`codex_lab.lessons.l03_gqa.experiments.uptrain`; the
   sparse layers train through the ``"blocks"`` kernel, which has a CPU backward);
4. multi-task fine-tuning of both with the same balancer (:func:`codex_lab.training.finetune.finetune`);
5. release gates (:mod:`codex_lab.serve.gates`): the candidate must be no worse than the baseline;
6. a temporary registry and a live canary (:mod:`codex_lab.serve.registry`, :mod:`codex_lab.serve.canary`).

Each stage is a plain function here (:func:`build_models`, :func:`pretrain_stage`,
:func:`finetune_stage`, :func:`gate_stage`, :func:`canary_release`; :func:`run_capstone`
chains stages 1-5); the notebook and the report call them, :func:`summary_table` lays the
measured numbers side by side and :func:`capstone_claims` turns them into seed-claim verdicts.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor

from codex_lab.nn.config import ModelConfig
from codex_lab.lessons.l03_gqa.experiments import kv_bytes_per_token, mha_to_gqa
from codex_lab.nn.model import CodexModel, SwiGLU
from codex_lab.nn.moe import MoEFeedForward, ffn_param_counts
from codex_lab.nn.patterns import parse_pattern

# Deep-layer pattern: a 64-token local window (the seed's 64-128) plus every 4th 64-token key
# block (a block-granular stride: whole tiles a block-sparse kernel can skip, lesson 02).
DEFAULT_SPARSE = "window:64+blockstride:64:4"
# The balancer the capstone fine-tunes with (``codex_lab.training.balancing.STRATEGIES``): the article's
# dynamic weights from convergence speed, as built and compared in lesson 05.
DEFAULT_BALANCE = "coba"


def capstone_config(
    base: ModelConfig,
    *,
    dense_layers: int | None = None,
    sparse: str = DEFAULT_SPARSE,
    n_kv_head: int | None = None,
    moe_layers: Sequence[int] | None = None,
    n_experts: int = 8,
    top_k: int = 2,
    attn_impl: str = "blocks",
) -> ModelConfig:
    """The candidate's config: ``base``'s shape with every optimisation switched on.

    Args:
        base: the plain model's config (dense, usually MHA, no MoE).
        dense_layers: how many first layers keep dense attention (default: half of them).
        sparse: pattern spec of the deeper layers (see :func:`codex_lab.nn.patterns.parse_pattern`).
        n_kv_head: K/V heads (default: ``n_head // 2``, group size 2; must divide ``n_head``).
        moe_layers: layers whose FFN becomes a mixture of experts (default: the sparse ones).
        n_experts: experts per MoE layer (the seed recommends 8-16).
        top_k: experts per token (the seed recommends 2-4).
        attn_impl: kernel of the sparse layers ("blocks" trains on CPU; "flex" is inference-only there).
    """
    n = base.n_layer
    dense_layers = n // 2 if dense_layers is None else dense_layers
    if not 0 <= dense_layers <= n:
        raise ValueError(f"dense_layers={dense_layers} must be in 0..n_layer={n}")
    if parse_pattern(sparse).is_dense:
        raise ValueError(f"sparse={sparse!r} is a dense pattern; give a window/stride spec such as {DEFAULT_SPARSE!r}")
    kv = max(1, base.n_head // 2) if n_kv_head is None else n_kv_head
    moe = list(range(dense_layers, n)) if moe_layers is None else sorted(set(moe_layers))
    d = copy.deepcopy(base.to_dict())
    d.update(
        attn_patterns=["dense"] * dense_layers + [parse_pattern(sparse).spec] * (n - dense_layers),
        attn_impl=attn_impl, n_kv_head=kv, moe_layers=moe, n_experts=n_experts, moe_top_k=top_k,
        moe_ffn_hidden=None,
    )
    return ModelConfig.from_dict(d)


@torch.no_grad()
def convert(model: CodexModel, cfg: ModelConfig, *, seed: int = 0) -> CodexModel:
    """A new model of config ``cfg`` initialised from the trained plain ``model``.

    K/V projections are mean-pooled to ``cfg.n_kv_head`` heads (lesson 03); each expert of an
    MoE layer gets a copy of that layer's dense SwiGLU weights (sparse upcycling), the router
    a fresh small random init (``seed``); everything else is copied. Attention patterns
    need no weights. ``model`` is not modified.

    Exactness: with copies, the renormalised top-k weights sum to 1, so an MoE layer equals
    the dense FFN it came from; with ``n_kv_head`` unchanged and all layers dense the new
    model equals ``model``.
    """
    src_cfg = model.cfg
    for f in ("vocab_size", "d_model", "n_layer", "n_head", "ffn_hidden", "max_seq_len", "rope_theta", "tie_embeddings", "qkv_bias"):
        if getattr(src_cfg, f) != getattr(cfg, f):
            raise ValueError(f"convert keeps the model's shape: {f} is {getattr(src_cfg, f)} in the model but "
                             f"{getattr(cfg, f)} in the target config; change only patterns, n_kv_head and MoE fields")
    if src_cfg.moe_layers:
        raise ValueError(f"convert starts from a dense-FFN model; this one has MoE layers {src_cfg.moe_layers}")
    if (cfg.moe_ffn_hidden or cfg.ffn_hidden) != src_cfg.ffn_hidden:
        raise ValueError("upcycled experts copy the dense FFN: leave moe_ffn_hidden unset (= ffn_hidden)")
    ref = next(model.parameters())
    with torch.random.fork_rng(devices=[]):  # seeded inits without touching the caller's RNG state
        torch.manual_seed(seed)
        pooled = mha_to_gqa(model, cfg.n_kv_head) if cfg.n_kv_head != src_cfg.n_kv_head else model  # type: ignore[arg-type]
        new = CodexModel(cfg).to(device=ref.device, dtype=ref.dtype)
    src = pooled.state_dict()
    for i, layer in enumerate(new.layers):
        if isinstance(layer.ffn, MoEFeedForward):
            for expert in layer.ffn.experts:
                assert isinstance(expert, SwiGLU)
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    getattr(expert, proj).weight.copy_(src[f"layers.{i}.ffn.{proj}.weight"])
    dst = new.state_dict()
    for name, t in dst.items():
        if name.startswith("layers.") and ".ffn." in name and int(name.split(".")[1]) in cfg.moe_layers:
            continue  # experts set above; router and selection bias keep their fresh init
        t.copy_(src[name])
    new.train(model.training)
    return new


def active_params(model: CodexModel) -> int:
    """Parameters one token uses (tied weights once): the total minus the experts it skips."""
    n = model.num_params()
    cfg = model.cfg
    if cfg.moe_layers:
        c = ffn_param_counts(cfg)
        # active = total - per MoE layer (total FFN - active FFN)
        n -= len(cfg.moe_layers) * (c["total"] - c["active"])
    return n


def attention_density(cfg: ModelConfig, n: int) -> float:
    """Mean over layers of the share of the N(N+1)/2 causal pairs each layer attends to."""
    return sum(parse_pattern(cfg.pattern_for(i)).density(n) for i in range(cfg.n_layer)) / cfg.n_layer


def describe(model: CodexModel, *, seq_len: int) -> dict[str, Any]:
    """Architecture numbers of one model: params (total, active per token), KV bytes per token
    (fp32), mean attention density at ``seq_len`` tokens, and the per-layer layout."""
    cfg = model.cfg
    return {
        "params": model.num_params(), "active_params": active_params(model),
        "kv_bytes_per_token": kv_bytes_per_token(cfg), f"attn_density@{seq_len}": attention_density(cfg, seq_len),
        "layers": [f"{cfg.pattern_for(i)}{' +MoE' if i in cfg.moe_layers else ''}" for i in range(cfg.n_layer)],
        "n_kv_head": cfg.n_kv_head,
    }


@torch.no_grad()
def max_logit_gap(a: CodexModel, b: CodexModel, idx: Tensor) -> float:
    """max |logits_a - logits_b| over token ids ``idx`` (B, T), both in eval mode."""
    was_a, was_b = a.training, b.training
    a.eval(), b.eval()
    gap = float((a(idx).logits - b(idx).logits).abs().max())  # (B, T, V) -> scalar
    a.train(was_a), b.train(was_b)
    return gap


@dataclass
class StageLog:
    """Per-model numbers gathered stage by stage (a name -> value dict per model)."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)

    def put(self, model: str, **values: Any) -> None:
        """Record values for one model (``"baseline"`` or ``"candidate"``)."""
        self.rows.setdefault(model, {}).update(values)

    def timed(self, stage: str, t0: float) -> float:
        """Record the wall time of ``stage`` since ``t0`` (perf_counter seconds); return it."""
        self.times[stage] = time.perf_counter() - t0
        return self.times[stage]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def summary_table(log: StageLog, *, markdown: bool = False) -> str:
    """The numbers of both models side by side (plain text, or a Markdown table)."""
    models = list(log.rows)
    keys: list[str] = []
    for m in models:
        keys += [k for k in log.rows[m] if k not in keys]
    if markdown:
        lines = ["| measure | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
        lines += ["| " + k + " | " + " | ".join(_fmt(log.rows[m].get(k, "-")) for m in models) + " |" for k in keys]
        return "\n".join(lines)
    w = max(len(k) for k in keys) if keys else 8
    cw = max([len(m) for m in models] + [14])
    lines = [f"{'measure':<{w}}  " + "  ".join(f"{m:>{cw}}" for m in models)]
    for k in keys:
        lines.append(f"{k:<{w}}  " + "  ".join(f"{_fmt(log.rows[m].get(k, '-')):>{cw}}" for m in models))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The whole recipe, stages 3-5 (training and gates), and stage 6 (registry + canary)
# ---------------------------------------------------------------------------------------


@dataclass
class CapstoneSizes:
    """Budgets of one capstone run (both models get the same).

    Args:
        pretrain_steps, batch_size, seq_len, lr: brief pre-training (tokens = steps * batch * seq_len).
        val_batches: fixed validation batches of ``batch_size`` x ``seq_len`` tokens.
        ft_steps, ft_batch, ft_max_len, ft_eval_every, val_per_task, ft_lr: multi-task fine-tuning.
        tasks: fine-tuning tasks (``codex_lab.data.tasks.TASKS``).
        task_fraction: share of corpus files the tasks are built from (doctest files always kept).
        gate_tokens: tokens generated per gate problem.
        pretrain_files: first corpus train files tokenized for pre-training (``None`` = all).
    """

    pretrain_steps: int = 200
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 3e-4
    val_batches: int = 8
    ft_steps: int = 200
    ft_batch: int = 16
    ft_max_len: int = 320
    ft_eval_every: int = 20
    val_per_task: int = 32
    ft_lr: float = 1e-4
    tasks: tuple[str, ...] = ("completion", "bugfix", "testgen")
    task_fraction: float = 0.1
    gate_tokens: int = 48
    pretrain_files: int | None = None


def default_sizes() -> CapstoneSizes:
    """Full-mode sizes, or the fast-mode ones (seconds per stage on 2 CPU cores)."""
    from codex_lab.runtime import fast_mode

    if not fast_mode():
        return CapstoneSizes()
    return CapstoneSizes(pretrain_steps=4, batch_size=4, seq_len=128, val_batches=2, ft_steps=4, ft_batch=4,
                         ft_max_len=192, ft_eval_every=2, val_per_task=4, task_fraction=0.01,
                         pretrain_files=40)


@dataclass
class CapstoneResult:
    """Both trained models, their logs and the gate verdict."""

    log: StageLog
    baseline: CodexModel
    candidate: CodexModel
    finetune: dict[str, Any]  # name -> FinetuneResult
    gates: dict[str, Any]  # name -> GateReport
    passed: bool
    reasons: list[str]


def build_models(base: CodexModel, cfg: ModelConfig | None = None, *, seed: int = 0, log: StageLog | None = None) -> dict[str, CodexModel]:
    """Stage 1-2: ``{"baseline": deep copy of base, "candidate": convert(base, cfg)}``;
    architecture numbers go to ``log`` (density at ``base.cfg.max_seq_len`` tokens)."""
    cand_cfg = cfg or capstone_config(base.cfg)
    models = {"baseline": copy.deepcopy(base), "candidate": convert(base, cand_cfg, seed=seed)}
    if log is not None:
        for name, m in models.items():
            log.put(name, **{k: v for k, v in describe(m, seq_len=base.cfg.max_seq_len).items() if k != "layers"})
    return models


def pretrain_stage(models: dict[str, CodexModel], tokenizer: Any, corpus: Any, sz: CapstoneSizes, log: StageLog, *,
                   seed: int = 0) -> None:
    """Stage 3: the same brief pre-training (same batches) for every model, in place;
    logs validation loss (nats/token) before and after."""
    from codex_lab.data.batches import fixed_batches, tokenize_texts
    from codex_lab.lessons.l03_gqa.experiments import uptrain, val_loss

    t0 = time.perf_counter()
    train_tokens = tokenize_texts(tokenizer, corpus.texts("train")[: sz.pretrain_files])
    val = fixed_batches(tokenize_texts(tokenizer, corpus.texts("val")), sz.batch_size, sz.seq_len, sz.val_batches)
    for name, m in models.items():
        log.put(name, val_loss_start=val_loss(m, val))
        losses = uptrain(m, train_tokens, steps=sz.pretrain_steps, batch_size=sz.batch_size, seq_len=sz.seq_len, lr=sz.lr, seed=seed)
        log.put(name, pretrain_tokens=sz.pretrain_steps * sz.batch_size * sz.seq_len,
                train_loss_last=losses[-1] if losses else float("nan"), val_loss_pretrained=val_loss(m, val))
    log.timed("pretrain", t0)


def finetune_stage(models: dict[str, CodexModel], tokenizer: Any, corpus: Any, sz: CapstoneSizes, log: StageLog, *,
                   balance: str = DEFAULT_BALANCE, seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Stage 4: the same multi-task fine-tuning (tasks, batches, balancer) for every model,
    in place; returns ``{name: FinetuneResult}`` and logs per-task validation loss."""
    from codex_lab.training.finetune import FinetuneConfig, finetune
    from codex_lab.data.tasks import build_tasks, task_files

    t0 = time.perf_counter()
    taskset = build_tasks(task_files(corpus, sz.task_fraction), sz.tasks, val_fraction=0.2)
    # CoBa needs `window` evaluations before it moves the weights; a short run fits 2
    opts = {"window": 2} if balance == "coba" and sz.ft_steps // sz.ft_eval_every < 3 else {}
    fcfg = FinetuneConfig(tasks=sz.tasks, balance=balance, steps=sz.ft_steps, batch_size=sz.ft_batch, max_len=sz.ft_max_len,
                          eval_every=sz.ft_eval_every, val_per_task=sz.val_per_task, lr=sz.ft_lr,
                          warmup=max(1, sz.ft_steps // 10), seed=seed, balance_options=opts)
    out = {}
    for name, m in models.items():
        out[name] = finetune(m, tokenizer, taskset, fcfg, progress=progress)
        log.put(name, **{f"ft_val_{t}": float(out[name].final[k]) for k, t in enumerate(sz.tasks)},
                ft_gain_spread=out[name].improvement_spread)
    log.timed("finetune", t0)
    return out


def gate_stage(models: dict[str, CodexModel], tokenizer: Any, sz: CapstoneSizes, log: StageLog) -> tuple[dict[str, Any], bool, list[str]]:
    """Stage 5: the lesson 07 gates for every model; the candidate against the baseline.
    Returns ({name: GateReport}, passed, reasons)."""
    from codex_lab.serve.gates import engine_completer, gate_decision, run_gates

    t0 = time.perf_counter()
    reports = {}
    for name, m in models.items():
        m.eval()
        reports[name] = run_gates(engine_completer(m, tokenizer), max_tokens=sz.gate_tokens)
        log.put(name, **{f"gate_{k}": v for k, v in reports[name].scores().items()})
    passed, reasons = gate_decision(reports["candidate"].scores(), reports["baseline"].scores())
    log.timed("gates", t0)
    return reports, passed, reasons


def run_capstone(
    base: CodexModel,
    tokenizer: Any,
    corpus: Any,
    *,
    cfg: ModelConfig | None = None,
    sizes: CapstoneSizes | None = None,
    balance: str = DEFAULT_BALANCE,
    seed: int = 0,
    progress: bool = False,
) -> CapstoneResult:
    """Stages 1-5 on copies of ``base``: convert, pre-train both, fine-tune both, gate.

    ``corpus`` is a :class:`codex_lab.data.corpus.Corpus` (train/val texts and task functions).
    ``base`` itself is not modified; the baseline is a deep copy given the same budget.
    """
    sz = sizes or default_sizes()
    log = StageLog()
    t0 = time.perf_counter()
    models = build_models(base, cfg, seed=seed, log=log)
    log.timed("convert", t0)
    pretrain_stage(models, tokenizer, corpus, sz, log, seed=seed)
    fts = finetune_stage(models, tokenizer, corpus, sz, log, balance=balance, seed=seed, progress=progress)
    reports, passed, reasons = gate_stage(models, tokenizer, sz, log)
    return CapstoneResult(log, models["baseline"], models["candidate"], fts, reports, passed, reasons)


def ablation_configs(base: ModelConfig, cand: ModelConfig) -> dict[str, ModelConfig]:
    """One config per optimisation of ``cand`` switched on alone over ``base``, plus all of them."""
    dense = sum(cand.pattern_for(i) == "dense" for i in range(cand.n_layer))
    sparse = next((cand.pattern_for(i) for i in range(cand.n_layer) if cand.pattern_for(i) != "dense"), DEFAULT_SPARSE)
    common = dict(sparse=sparse, n_experts=cand.n_experts, top_k=cand.moe_top_k, attn_impl=cand.attn_impl)
    n = base.n_layer
    return {
        "plain": base,
        f"GQA (n_kv_head={cand.n_kv_head})": capstone_config(base, dense_layers=n, n_kv_head=cand.n_kv_head, moe_layers=[], **common),
        f"sparse layers {dense}..{n - 1}": capstone_config(base, dense_layers=dense, n_kv_head=base.n_kv_head, moe_layers=[], **common),
        f"MoE layers {cand.moe_layers}": capstone_config(base, dense_layers=n, n_kv_head=base.n_kv_head, moe_layers=cand.moe_layers, **common),
        "all": cand,
    }


def speed_ablation(base: CodexModel, cand_cfg: ModelConfig, *, batches: Sequence[int] = (1, 8), prompt_len: int = 64,
                   new_tokens: int = 16, repeats: int = 3) -> list[dict[str, Any]]:
    """Cached greedy decode speed (tokens/s, :func:`codex_lab.lessons.l03_gqa.experiments.decode_tokens_per_s`) of
    ``base`` converted to each config of :func:`ablation_configs`, per batch size.

    Speed does not depend on the weights' values, so untrained conversions are timed.
    Returns one record per (variant, batch): variant, batch, tokens_per_s, kv_bytes_per_token.
    """
    from codex_lab.lessons.l03_gqa.experiments import decode_tokens_per_s

    out = []
    for name, cfg in ablation_configs(base.cfg, cand_cfg).items():
        m = (base if cfg is base.cfg else convert(base, cfg)).eval()
        for b in batches:
            tps = decode_tokens_per_s(m, batch=b, prompt_len=prompt_len, new_tokens=new_tokens, repeats=repeats)
            out.append({"variant": name, "batch": b, "tokens_per_s": tps, "kv_bytes_per_token": kv_bytes_per_token(cfg),
                        "active_params": active_params(m)})
    return out


def canary_release(
    baseline: CodexModel,
    candidate: CodexModel,
    tokenizer: Any,
    registry_root: str,
    *,
    gates: dict[str, Any] | None = None,
    share: float = 0.3,
    min_requests: int = 5,
    promote_after: int = 10,
    requests: int = 40,
    max_tokens: int = 16,
    timeout_s: float = 120.0,
    serve_refused: bool = False,
) -> dict[str, Any]:
    """Register both models, serve the baseline, send ``share`` of live traffic to the candidate.

    The baseline becomes the registry's current version; the candidate is added with its
    gate results (``gates``) and served as a canary while 4 streaming clients send
    ``requests`` requests; the :class:`~codex_lab.serve.canary.CanaryController` promotes or rolls
    it back from the live metrics. Returns the decision, both windows, the client summary,
    the registry table and the versions.

    A candidate whose ``gates["passed"]`` is False gets no traffic (the seed's rule) unless
    ``serve_refused=True``, which exists only to show that the live canary check reaches its
    own verdict; the refusal stays recorded in the registry either way.
    """
    if gates is not None and gates.get("passed") is False and not serve_refused:
        raise ValueError("the candidate failed its release gates, so it gets no traffic; fix it and gate it again "
                         "(serve_refused=True only to demonstrate the live canary check)")
    from codex_lab.serve.canary import CanaryController, CanaryPolicy
    from codex_lab.serve.loadtest import run_load
    from codex_lab.serve.registry import Registry
    from codex_lab.serve.app import ModelServer, ServerConfig, serve_in_background

    reg = Registry(registry_root)
    v_base = reg.add(baseline, tokenizer, note="capstone baseline: plain dense MHA, same training budget")
    reg.promote(v_base)
    v_cand = reg.add(candidate, tokenizer, gates=gates or {}, note="capstone candidate: sparse deep layers, GQA, MoE")
    server = ModelServer(tokenizer, ServerConfig(model_name="codex-lab-capstone", max_batch_size=8, max_waiting=64))
    server.add_version(v_base, reg.load(v_base).model)
    bg = serve_in_background(server)
    try:
        policy = CanaryPolicy(share=share, min_requests=min_requests, promote_after=promote_after)
        ctl = CanaryController(server, policy, registry=reg)
        ctl.start(v_cand, reg.load(v_cand).model)  # loaded back: its checksum is verified first
        ctl.watch(interval_s=0.2, timeout_s=timeout_s)
        load = run_load(bg.url, concurrency=4, requests=requests, max_tokens=max_tokens, duration_s=timeout_s)
        decision = ctl.join(timeout_s)
        if decision is None or decision.action == "wait":
            decision = ctl.step()  # one last look once the traffic has ended
        return {"baseline": v_base, "candidate": v_cand, "action": decision.action, "reasons": decision.reasons,
                "canary": decision.canary, "primary": decision.primary, "load": load.summary(),
                "serving": server.primary, "registry_current": reg.current(), "registry": reg.table()}
    finally:
        bg.stop()
        server.close()


# ---------------------------------------------------------------------------------------
# Seed claims, as measured by one capstone run
# ---------------------------------------------------------------------------------------

VERDICTS = ("holds", "holds with a correction", "does not hold", "not reproduced at this scale")


def capstone_claims(
    *,
    models: dict[str, CodexModel],
    log: StageLog,
    finetunes: dict[str, Any],
    reports: dict[str, Any],
    passed: bool,
    reasons: Sequence[str],
    ablation: Sequence[dict[str, Any]],
    rollout: dict[str, Any] | None = None,
    kv_tokens: int = 512,
) -> list[dict[str, str]]:
    """The seed claims one capstone run measures: ``{"claim", "measured", "verdict"}`` each,
    the verdict computed from the numbers (one of :data:`VERDICTS`).

    ``ablation`` comes from :func:`speed_ablation` (needs the "plain" and "all" variants at a
    common batch size); ``rollout`` from :func:`canary_release` (optional).
    """
    from codex_lab.lessons.l03_gqa.experiments import measured_cache_bytes

    cand = models["candidate"]
    cfg = cand.cfg
    out: list[dict[str, str]] = []

    def add(claim: str, measured: str, verdict: str) -> None:
        assert verdict in VERDICTS, verdict
        out.append({"claim": claim, "measured": measured, "verdict": verdict})

    sparse = next(cfg.pattern_for(i) for i in range(cfg.n_layer) if cfg.pattern_for(i) != "dense")
    pat = parse_pattern(sparse)
    # growth exponent of the attended pairs between N and 4N: log(pairs ratio) / log(4)
    growth = math.log(pat.pairs(4096) / pat.pairs(1024)) / math.log(4)
    add("Sparse attention: O(N^2) -> O(N sqrt N)",
        f"{pat.spec}: attended pairs grow like N^{growth:.2f} from N=1024 to 4096 (N sqrt N: 1.50); density {pat.density(1024):.2f} at 1024",
        "holds" if growth <= 1.5 + 0.05 else "holds with a correction")
    kv = {n: measured_cache_bytes(m, 1, kv_tokens) for n, m in models.items()}
    save = 1 - kv["candidate"] / kv["baseline"]
    g = cfg.group_size
    add("GQA cuts the KV cache by about 40%",
        f"group size {g}: {kv['baseline']:,} -> {kv['candidate']:,} bytes at {kv_tokens} tokens = {save:.0%} (1 - 1/g = {1 - 1 / g:.0%})",
        "holds" if abs(save - 0.4) < 0.05 else "holds with a correction")
    speeds = {(r["variant"], r["batch"]): r["tokens_per_s"] for r in ablation}
    b = max(bb for (v, bb) in speeds if v == "all")
    ratio = speeds[("all", b)] / speeds[("plain", b)]
    moe_name = next((v for (v, _) in speeds if v.startswith("MoE")), None)
    moe_ratio = speeds[(moe_name, b)] / speeds[("plain", b)] if moe_name else math.nan
    total, active = log.rows["candidate"]["params"], log.rows["candidate"]["active_params"]
    add("MoE: the capacity of a big model at the compute of a small one",
        f"{total:,} params, {active:,} active per token ({total / active:.1f}x); decode speed at batch {b}: MoE alone "
        f"{moe_ratio:.2f}x, full candidate {ratio:.2f}x the plain model on this machine",
        "holds" if moe_ratio >= 1.0 else "holds with a correction")
    tasks = list(finetunes["candidate"].config.tasks)
    small = min(tasks, key=lambda t: finetunes["candidate"].train_sizes[t])
    gains = {n: float(r.rel_improvement[tasks.index(small)]) for n, r in finetunes.items()}
    add("Balanced multi-task fine-tuning scores 8-15% higher on HumanEval",
        f"{finetunes['candidate'].config.balance} balancing, {len(finetunes['candidate'].steps)} steps; val-loss gain on the smallest "
        f"task ({small}): baseline {gains['baseline']:.1%}, candidate {gains['candidate']:.1%}; no HumanEval at this scale",
        "not reproduced at this scale")
    ms = {n: (r.ttft_p95_s * 1000, r.tbt_p95_s * 1000) for n, r in reports.items()}
    add("TTFT < 100 ms and TBT < 20 ms",
        f"{len(reports['baseline'].samples)} gate prompts at once, p95: baseline {ms['baseline'][0]:.0f} / {ms['baseline'][1]:.1f} ms, "
        f"candidate {ms['candidate'][0]:.0f} / {ms['candidate'][1]:.1f} ms",
        "holds" if ms["baseline"][0] < 100 and ms["baseline"][1] < 20 else "does not hold")
    refused = "; ".join(r.split(":")[0] for r in reasons)
    if rollout is None:
        add("A new version must be no worse than the baseline on every gate",
            f"gates {'passed' if passed else 'refused it on ' + refused}", "holds")
    else:
        agree = passed == (rollout["action"] == "promote")
        add("A new version must be no worse than the baseline on every gate before its traffic grows",
            f"gates {'passed' if passed else 'refused it on ' + refused}; live canary ({rollout['canary']['n']:.0f} requests): "
            f"{rollout['action']}, {rollout['load']['errors']} client errors",
            "holds" if agree and rollout["load"]["errors"] == 0 else "holds with a correction")
    return out
