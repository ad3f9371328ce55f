"""The capstone recipe (lesson 08): one model with every optimisation of the course.

The candidate is built from a trained plain model (the shipped checkpoint) and compared with
that plain model given the same training budget:

1. architecture (:func:`~codex_lab.lessons.l08_capstone.architecture.capstone_config`): dense
   attention in the first layers, a sparse pattern (local window + block-granular stride,
   lesson 02) in the deeper ones, grouped-query attention (lesson 03) and mixture-of-experts
   feed-forwards in the deep layers (lesson 04);
2. conversion (:func:`codex_lab.nn.surgery.convert`): K/V heads mean-pooled
   (:func:`codex_lab.nn.surgery.mha_to_gqa`), every expert a copy of the layer's dense FFN
   ("sparse upcycling", Komatsuzaki et al. 2022), so an MoE layer computes exactly its dense
   FFN until training moves the experts apart;
3. brief pre-training of both models on the same batches (:func:`codex_lab.training.pretrain.uptrain`,
   the one training loop; the sparse layers train through the ``"blocks"`` kernel, which has a
   CPU backward);
4. multi-task fine-tuning of both with the same balancer (:func:`codex_lab.training.finetune.finetune`);
5. release gates (:mod:`codex_lab.serve.gates`): the candidate must be shown no worse than the
   baseline on every gate (paired intervals at declared margins);
6. a temporary registry and a live canary (:mod:`~codex_lab.lessons.l08_capstone.release`).

This module holds the stages (:func:`build_models`, :func:`pretrain_stage`,
:func:`finetune_stage`, :func:`gate_stage`; :func:`run_capstone` chains stages 1-5) and the
speed ablation; the notebook and the report reach every capstone name through it.
:mod:`~codex_lab.lessons.l08_capstone.results` lays the measured numbers side by side and
:mod:`~codex_lab.lessons.l08_capstone.claims` turns them into seed-claim verdicts.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from codex_lab.lessons.l08_capstone.architecture import ablation_configs, capstone_config, describe
from codex_lab.lessons.l08_capstone.results import StageLog
from codex_lab.nn.accounting import active_params, kv_bytes_per_token
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.nn.surgery import convert
from codex_lab.training.finetune import FinetuneConfig

# The balancer the capstone fine-tunes with (``codex_lab.training.balancing.STRATEGIES``): the article's
# dynamic weights from convergence speed, as built and compared in lesson 05.
DEFAULT_BALANCE = "coba"


@dataclass
class CapstoneSizes:
    """Budgets of one capstone run (both models get the same).

    Args:
        pretrain_steps, batch_size, seq_len, lr: brief pre-training (tokens = steps * batch * seq_len).
        val_batches: fixed validation batches of ``batch_size`` x ``seq_len`` tokens.
        finetune: the multi-task fine-tuning (tasks, steps, batch, lengths, lr, warm-up); the
            stage sets its balancer and seed.
        task_fraction: share of corpus files the tasks are built from (doctest files always kept).
        gate_tokens: tokens generated per gate problem.
        pretrain_files: first corpus train files tokenized for pre-training (``None`` = all).
    """

    pretrain_steps: int = 200
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 3e-4
    val_batches: int = 8
    finetune: FinetuneConfig = field(default_factory=lambda: FinetuneConfig(
        tasks=("completion", "bugfix", "testgen"), steps=200, batch_size=16, max_len=320, eval_every=20,
        val_per_task=32, lr=1e-4, warmup=20))
    task_fraction: float = 0.1
    gate_tokens: int = 48
    pretrain_files: int | None = None

    @property
    def tasks(self) -> tuple[str, ...]:
        """The fine-tuning tasks (``finetune.tasks``)."""
        return self.finetune.tasks


def default_sizes(mode: str) -> CapstoneSizes:
    """Full-mode sizes, or the laptop ones for fast and standard mode (seconds per stage on 2 CPU cores)."""
    if mode not in ("fast", "standard", "full"):
        raise ValueError(f"mode {mode!r} is not understood; use fast, standard or full")
    if mode == "full":
        return CapstoneSizes()
    ft = FinetuneConfig(tasks=("completion", "bugfix", "testgen"), steps=4, batch_size=4, max_len=192, eval_every=2,
                        val_per_task=4, lr=1e-4, warmup=1)
    return CapstoneSizes(pretrain_steps=4, batch_size=4, seq_len=128, val_batches=2, finetune=ft, task_fraction=0.01,
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
    logs validation loss (nats/token) before and after, and each model's held-out curve
    (``log.curves``, for the training-state rule)."""
    from codex_lab.data.batches import fixed_batches, tokenize_texts
    from codex_lab.training.evaluate import val_loss

    t0 = time.perf_counter()
    train_tokens = tokenize_texts(tokenizer, corpus.texts("train")[: sz.pretrain_files])
    val = fixed_batches(tokenize_texts(tokenizer, corpus.texts("val")), sz.batch_size, sz.seq_len, sz.val_batches)
    for name, m in models.items():
        losses, curve = train_with_curve(m, train_tokens, val, steps=sz.pretrain_steps, batch_size=sz.batch_size,
                                         seq_len=sz.seq_len, lr=sz.lr, seed=seed)
        log.curves[name] = curve
        log.put(name, val_loss_start=curve[0][1], pretrain_tokens=sz.pretrain_steps * sz.batch_size * sz.seq_len,
                train_loss_last=losses[-1] if losses else float("nan"), val_loss_pretrained=val_loss(m, val))
    log.timed("pretrain", t0)


def train_with_curve(model: CodexModel, tokens: Any, val: Any, *, steps: int, batch_size: int, seq_len: int, lr: float,
                     seed: int = 0, evals: int = 8) -> tuple[list[float], list[tuple[float, float]]]:
    """:func:`codex_lab.training.pretrain.uptrain`'s brief pre-training (AdamW without weight
    decay, constant ``lr``, gradient norm clipped at 1, LM + MoE aux loss, random windows of
    the 1-D ``tokens`` from a generator seeded by ``seed``) with a held-out curve: validation
    loss (nats/token) on the fixed ``val`` batches at step 0 and every ``max(1, steps // evals)``
    steps (and the last), for the training-state rule. Returns (training losses, curve)."""
    from codex_lab.data.batches import random_batch
    from codex_lab.training.evaluate import val_loss
    from codex_lab.training.loop import LoopConfig, adamw, run_loop

    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    every = max(1, steps // evals)
    loop = LoopConfig(steps=steps, lr=lr, warmup=0, weight_decay=0.0, grad_clip=1.0, eval_every=every)
    opt = adamw(model, loop)
    curve = [(0.0, val_loss(model, val))]

    def loss_fn(_: int) -> tuple[Any, dict[str, float]]:
        x, y = random_batch(tokens, batch_size, seq_len, gen)  # (B, T) each
        out = model(x.to(device), y.to(device))
        return out.loss + out.aux_loss, {"loss": float(out.loss.detach())}

    def eval_fn(step: int, _: dict[str, float]) -> None:
        curve.append((float(step), val_loss(model, val)))

    model.train()
    res = run_loop(loss_fn, opt, loop, eval_fn=eval_fn)
    model.eval()
    return res.losses, curve


def finetune_stage(models: dict[str, CodexModel], tokenizer: Any, corpus: Any, sz: CapstoneSizes, log: StageLog, *,
                   balance: str = DEFAULT_BALANCE, seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Stage 4: the same multi-task fine-tuning (tasks, batches, balancer) for every model,
    in place; returns ``{name: FinetuneResult}`` and logs per-task validation loss."""
    from codex_lab.data.tasks import build_tasks, task_files
    from codex_lab.training.finetune import finetune

    t0 = time.perf_counter()
    taskset = build_tasks(task_files(corpus, sz.task_fraction), sz.tasks, val_fraction=0.2)
    ft = sz.finetune
    # CoBa needs `window` evaluations before it moves the weights; a short run fits 2
    opts = {"window": 2} if balance == "coba" and ft.steps // ft.eval_every < 3 else {}
    fcfg = dataclasses.replace(ft, balance=balance, seed=seed, balance_options={**ft.balance_options, **opts})
    out = {}
    for name, m in models.items():
        out[name] = finetune(m, tokenizer, taskset, fcfg, progress=progress)
        log.put(name, **{f"ft_val_{t}": float(out[name].final[k]) for k, t in enumerate(sz.tasks)},
                ft_gain_spread=out[name].improvement_spread)
    log.timed("finetune", t0)
    return out


def gate_stage(models: dict[str, CodexModel], tokenizer: Any, sz: CapstoneSizes, log: StageLog) -> tuple[dict[str, Any], bool, list[str]]:
    """Stage 5: the lesson 07 gates for every model; the candidate against the baseline with
    intervals at the declared margins (:func:`codex_lab.serve.gates.release_decision`: each
    quality gate must be shown no worse, paired over the same problems). Returns
    ({name: GateReport}, passed, reasons); the comparisons go to ``log.gates``."""
    from codex_lab.serve.gates import engine_completer, release_decision, run_gates

    t0 = time.perf_counter()
    reports = {}
    for name, m in models.items():
        m.eval()
        reports[name] = run_gates(engine_completer(m, tokenizer), max_tokens=sz.gate_tokens)
        log.put(name, **{f"gate_{k}": v for k, v in reports[name].scores().items()})
    passed, reasons, comps = release_decision(reports["candidate"], reports["baseline"])
    log.gates = comps
    log.timed("gates", t0)
    return reports, passed, reasons


def run_capstone(
    base: CodexModel,
    tokenizer: Any,
    corpus: Any,
    *,
    cfg: ModelConfig | None = None,
    sizes: CapstoneSizes,
    balance: str = DEFAULT_BALANCE,
    seed: int = 0,
    progress: bool = False,
) -> CapstoneResult:
    """Stages 1-5 on copies of ``base``: convert, pre-train both, fine-tune both, gate.

    ``corpus`` is a :class:`codex_lab.data.corpus.Corpus` (train/val texts and task functions).
    ``base`` itself is not modified; the baseline is a deep copy given the same budget.
    """
    sz = sizes
    log = StageLog()
    t0 = time.perf_counter()
    models = build_models(base, cfg, seed=seed, log=log)
    log.timed("convert", t0)
    pretrain_stage(models, tokenizer, corpus, sz, log, seed=seed)
    fts = finetune_stage(models, tokenizer, corpus, sz, log, balance=balance, seed=seed, progress=progress)
    reports, passed, reasons = gate_stage(models, tokenizer, sz, log)
    return CapstoneResult(log, models["baseline"], models["candidate"], fts, reports, passed, reasons)


def ablation_kind(variant: str) -> str:
    """The design kind of an :func:`ablation_configs` variant name: "plain", "gqa", "sparse",
    "moe" or "all" (the keys of :data:`codex_lab.lessons.l08_capstone.trade.KINDS`)."""
    for prefix, kind in (("plain", "plain"), ("GQA", "gqa"), ("sparse", "sparse"), ("MoE", "moe"), ("all", "all")):
        if variant.startswith(prefix):
            return kind
    raise ValueError(f"variant {variant!r} is not one of ablation_configs' names")


def speed_ablation(base: CodexModel, cand_cfg: ModelConfig, *, batches: Sequence[int] = (1, 8), prompt_len: int = 64,
                   new_tokens: int = 16, repeats: int = 3) -> list[dict[str, Any]]:
    """Cached greedy decode speed of ``base`` converted to each config of :func:`ablation_configs`,
    per batch size, the variants timed in interleaved rounds (:func:`codex_lab.runtime.interleaved_times`).

    Speed does not depend on the weights' values, so untrained conversions are timed. Each
    round prefills ``prompt_len`` random tokens (untimed) and times ``new_tokens`` decode steps.
    Returns one record per (variant, batch): variant, kind (:func:`ablation_kind`), batch, tokens_per_s (median round),
    step_ms (every round's ms per decode step), kv_bytes_per_token, params (stored), active_params, and
    vs_plain_median / vs_plain_lo / vs_plain_hi: the speed-up over "plain" per round (median,
    smallest, largest; 1.0 inside [lo, hi] means no difference was measured).
    """
    import statistics

    import torch

    from codex_lab.lessons.l03_gqa.bench import _decode_ms
    from codex_lab.runtime import interleaved_times
    from codex_lab.stats import timing_ratio

    models = {name: (base if cfg is base.cfg else convert(base, cfg)).eval()
              for name, cfg in ablation_configs(base.cfg, cand_cfg).items()}
    device = next(base.parameters()).device
    out = []
    for b in batches:
        prompt = torch.randint(0, base.cfg.vocab_size, (b, prompt_len), generator=torch.Generator().manual_seed(0)).to(device)
        ms: dict[str, list[float]] = {name: [] for name in models}

        def run(name: str) -> None:
            with torch.no_grad():
                ms[name].append(_decode_ms(models[name], prompt, new_tokens, device))

        for name in models:  # warm-up, not recorded
            with torch.no_grad():
                _decode_ms(models[name], prompt, new_tokens, device)
        interleaved_times({name: (lambda name=name: run(name)) for name in models}, max(2, repeats))
        for name, m in models.items():
            # tokens/s = batch * 1000 ms / ms per decode step
            rel = timing_ratio(ms["plain"], ms[name], a="plain", b=name)
            out.append({"variant": name, "kind": ablation_kind(name), "batch": b, "tokens_per_s": b * 1000.0 / statistics.median(ms[name]),
                        "step_ms": list(ms[name]), "kv_bytes_per_token": kv_bytes_per_token(m.cfg),
                        "params": m.num_params(), "active_params": active_params(m), "vs_plain_median": rel.speedup,
                        "vs_plain_lo": rel.lo, "vs_plain_hi": rel.hi})
    return out
