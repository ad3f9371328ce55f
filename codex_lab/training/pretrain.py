"""Pre-training a code model: AdamW, warm-up + cosine learning rate, gradient clipping,
mixed precision on GPU, periodic validation, atomic checkpoints and resume.

The same function runs single-process or under ``torchrun`` (DistributedDataParallel; gloo
on CPU, NCCL on CUDA): ``torchrun --nproc_per_node=2 -m codex_lab.cli train --preset tiny``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from codex_lab.data.batches import fixed_batches, random_batch, tokenize_texts
from codex_lab.data.corpus import load_corpus
from codex_lab.data.fim import fim_token_stream
from codex_lab.data.tokenizer import CodeTokenizer, train_tokenizer
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.runtime import get_device, seed_everything
from codex_lab.training.checkpoint import load_checkpoint, load_train_state, save_checkpoint
from codex_lab.training.evaluate import val_loss
from codex_lab.training.loop import LoopConfig, adamw, autocast_for, lr_schedule, run_loop


# TrainConfig fields that used to be model fields, kept as keyword names of preset_config
# and readable from old checkpoints' meta (flat "train_config")
MODEL_KEYS = ("vocab_size", "d_model", "n_layer", "n_head", "n_kv_head")


FIM_CHARS_PER_TOKEN = 3  # below the tiny tokenizer's ~3.5 characters per token of Python, so chunks fit


def _default_model() -> ModelConfig:
    return ModelConfig(vocab_size=4096, d_model=256, n_layer=4, n_head=4, max_seq_len=1024)


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved in the checkpoint's meta).

    ``model`` is the shape trained (its ``vocab_size`` is the tokenizer's target size; the
    trained tokenizer's real size replaces it). Sizes are in tokens; ``lr`` is the peak
    learning rate reached after ``warmup`` steps, decayed by a cosine to ``min_lr`` at
    ``steps``; ``grad_accum`` micro-batches of ``batch_size`` make one step.
    """

    preset: str = "tiny"
    model: ModelConfig = field(default_factory=_default_model)
    seq_len: int = 256
    batch_size: int = 16
    steps: int = 1000
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    grad_accum: int = 1
    eval_every: int = 100
    eval_batches: int = 8
    seed: int = 0
    corpus: str | None = None
    max_files: int | None = None
    max_file_bytes: int = 1_000_000  # corpus files larger than this are skipped and counted
    out: str = "runs/tiny"
    device: str | None = None
    tokenizer: str | None = None  # a tokenizer.json to reuse instead of training one (losses then compare)
    fim_rate: float = 0.0  # share of training chunks in fill-in-the-middle form (codex_lab.data.fim; 0 = plain LM)
    init_from: str | None = None  # warm start: a checkpoint folder whose weights (and tokenizer) the run starts from

    @property
    def vocab_size(self) -> int:
        """Target vocabulary of the tokenizer trained for this run."""
        return self.model.vocab_size

    def model_config(self, vocab_size: int) -> ModelConfig:
        """The model shape this run trains, with the trained tokenizer's ``vocab_size``."""
        return ModelConfig.from_dict({**self.model.to_dict(), "vocab_size": vocab_size})

    def loop_config(self) -> LoopConfig:
        """The optimisation part of this run for :func:`codex_lab.training.loop.run_loop`."""
        return LoopConfig(steps=self.steps, lr=self.lr, min_lr=self.min_lr, warmup=self.warmup,
                          weight_decay=self.weight_decay, grad_clip=self.grad_clip, accum_steps=self.grad_accum,
                          eval_every=self.eval_every)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """Read a saved config: nested (``{"model": {...}, ...}``) or the older flat form
        (model fields at the top level plus ``extra_model``)."""
        d = dict(d)
        known = {f.name for f in fields(cls)}
        if isinstance(d.get("model"), dict):
            d["model"] = ModelConfig.from_dict(d["model"])
        else:
            flat = {k: d.pop(k) for k in MODEL_KEYS if k in d}
            flat.update(d.pop("extra_model", None) or {})
            flat.setdefault("max_seq_len", max(1024, int(d.get("seq_len", 256))))
            d["model"] = ModelConfig(**flat)
        return cls(**{k: v for k, v in d.items() if k in known})


PRESETS: dict[str, dict[str, Any]] = {
    # ~4.2M parameters, fits 2 CPU cores; the shipped checkpoint.
    "tiny": dict(vocab_size=4096, d_model=256, n_layer=4, n_head=4, seq_len=256, batch_size=16, steps=600, lr=3e-3, warmup=30, eval_every=50),
    # ~30M parameters, for one consumer GPU.
    "small": dict(vocab_size=8192, d_model=512, n_layer=8, n_head=8, seq_len=1024, batch_size=32, steps=5000, lr=1e-3, min_lr=1e-4, warmup=200, eval_every=250),
}
# Fast mode: seconds, not minutes (CI, smoke tests); same code path.
FAST_OVERRIDES: dict[str, Any] = dict(vocab_size=512, d_model=64, n_layer=2, n_head=2, seq_len=64, batch_size=8, steps=20, warmup=4, eval_every=10, eval_batches=2, max_files=60)


def preset_config(name: str = "tiny", *, mode: str, **overrides: Any) -> TrainConfig:
    """A :class:`TrainConfig` from a preset, shrunk to laptop sizes unless ``mode`` is ``"full"``
    (fast and standard mode: :data:`FAST_OVERRIDES`), then ``overrides`` applied.

    Model fields (``vocab_size``, ``d_model``, ``n_layer``, ``n_head``, ``n_kv_head``, or any
    other :class:`~codex_lab.nn.config.ModelConfig` field) are accepted by name and go into
    ``model``; ``max_seq_len`` defaults to max(1024, seq_len).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    values: dict[str, Any] = {"preset": name, **PRESETS[name], "out": f"runs/{name}"}
    if mode not in ("fast", "standard", "full"):
        raise ValueError(f"mode {mode!r} is not understood; use fast, standard or full")
    if mode != "full":
        values.update(FAST_OVERRIDES)
    train_keys = {f.name for f in fields(TrainConfig)} - {"model"}
    model_keys = {f.name for f in fields(ModelConfig)}
    bad = sorted(set(overrides) - train_keys - model_keys)
    if bad:
        raise ValueError(f"unknown training options {bad}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    model = {k: values.pop(k) for k in list(values) if k in model_keys and k not in train_keys}
    model.setdefault("max_seq_len", max(1024, int(values.get("seq_len", 256))))
    return TrainConfig(model=ModelConfig(**model), **values)


def lr_at(step: int, tc: TrainConfig) -> float:
    """Learning rate at ``step``: linear warm-up, then cosine decay to ``min_lr``."""
    return lr_schedule(step, tc.lr, tc.warmup, tc.steps, tc.min_lr)


def param_checksum(model: torch.nn.Module) -> str:
    """SHA-1 of all parameters' bytes (to check DDP ranks stay identical)."""
    h = hashlib.sha1()
    for _, p in sorted(model.state_dict().items()):
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@dataclass
class TrainResult:
    """What a run produced: checkpoint folder, loss history and timing."""

    out: Path
    history: list[dict[str, float]]
    val_loss: float
    train_time_s: float
    n_params: int


def _dist_info() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def train(tc: TrainConfig, *, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train (or resume) a model as ``tc`` describes; checkpoint into ``tc.out/checkpoint``."""
    rank, world = _dist_info()
    device = get_device(tc.device)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend)
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
    out = Path(tc.out)
    ckpt_dir, state_file = out / "checkpoint", out / "train_state.pt"
    seed_everything(tc.seed)

    corpus = load_corpus(tc.corpus, max_files=tc.max_files, max_file_bytes=tc.max_file_bytes)
    if resume:
        if not state_file.is_file():
            raise FileNotFoundError(f"nothing to resume: {state_file} is missing; train without --resume first")
        ck = load_checkpoint(ckpt_dir)
        tokenizer, model = ck.tokenizer, ck.model.train()
    else:
        if rank == 0:
            tok_file = tc.tokenizer or (str(Path(tc.init_from) / "tokenizer.json") if tc.init_from else None)
            if tok_file:
                tokenizer = CodeTokenizer.load(tok_file)  # reused: per-token losses compare with its other models
            else:
                tokenizer = train_tokenizer(corpus.texts("train"), vocab_size=tc.vocab_size)
            out.mkdir(parents=True, exist_ok=True)
            tokenizer.save(out / "tokenizer.json")
        if world > 1:
            dist.barrier()
        tokenizer = CodeTokenizer.load(out / "tokenizer.json")
        seed_everything(tc.seed)  # identical initial weights on every rank
        model = CodexModel(tc.model_config(tokenizer.vocab_size))
        if tc.init_from:  # RoPE has no learned positions, so a longer seq_len than the source's works
            src = load_checkpoint(tc.init_from)
            a, b = src.config.to_dict(), model.cfg.to_dict()
            differ = {k: (a[k], b.get(k)) for k in a if k != "max_seq_len" and a[k] != b.get(k)}
            if differ:
                raise ValueError(f"init_from {tc.init_from!r} has another model shape (checkpoint, this run): {differ}; "
                                 "train with the model options it was trained with")
            model.load_state_dict(src.model.state_dict())
    model.to(device)
    if tc.fim_rate > 0:  # chunks of FIM_CHARS_PER_TOKEN * seq_len characters: a FIM example fits one window
        train_tokens = fim_token_stream(tokenizer, corpus.texts("train"), tc.fim_rate, seed=tc.seed,
                                        chunk_chars=FIM_CHARS_PER_TOKEN * tc.seq_len)
    else:
        train_tokens = tokenize_texts(tokenizer, corpus.texts("train"))
    val_tokens = tokenize_texts(tokenizer, corpus.texts("val"))
    val_batches = fixed_batches(val_tokens, tc.batch_size, tc.seq_len, tc.eval_batches)

    loop = tc.loop_config()
    opt = adamw(model, loop, split_decay=True, fused=device.type == "cuda")
    step, history, elapsed_before = 0, [], 0.0
    gen = torch.Generator().manual_seed(tc.seed * 1000 + rank)  # each rank its own windows
    if resume:
        state = load_train_state(state_file)  # weights_only: a planted pickle payload is refused, not run
        opt.load_state_dict(state["optimizer"])
        step, history, elapsed_before = state["step"], state["history"], state["elapsed_s"]
        gen.set_state(state["generator"][rank] if isinstance(state["generator"], list) else state["generator"])

    net: torch.nn.Module = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    def loss_fn(_: int) -> tuple[Tensor, dict[str, float]]:
        x, y = random_batch(train_tokens, tc.batch_size, tc.seq_len, gen)  # (B, T) each
        o = net(x.to(device), y.to(device))
        return o.loss + o.aux_loss, {"loss": float(o.loss.detach())}

    def on_eval(at: int, row: dict[str, float]) -> None:
        vl = val_loss(model, val_batches, device)
        history.append({"step": at, "train_loss": row["loss"], "val_loss": vl, "lr": row["lr"],
                        "tokens": at * tc.grad_accum * tc.batch_size * tc.seq_len * world,
                        "elapsed_s": elapsed_before + row["elapsed_s"]})
        checkpoint(at, vl, elapsed_before + row["elapsed_s"])

    def checkpoint(at: int, vl: float, elapsed_s: float) -> None:
        gens = [gen.get_state()]
        if world > 1:
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, gen.get_state())
            gens = gathered
        if rank != 0:
            return
        meta = {"train_config": asdict(tc), "history": history, "val_loss": vl, "step": at,
                "train_time_s": elapsed_s, "n_params": model.num_params(),
                "corpus": corpus.stats(), "world_size": world, "torch": torch.__version__, "device": str(device)}
        if tc.fim_rate > 0:  # the contract the server reads: FIM-trained, and the prompt format to use
            meta.update(fim_rate=tc.fim_rate, fim_format="psm", fim_formats_trained=["psm", "spm"], fim_spm_share=0.5)
        save_checkpoint(ckpt_dir, model, tokenizer, meta)
        tmp = state_file.with_suffix(".tmp")
        torch.save({"optimizer": opt.state_dict(), "step": at, "history": history,
                    "elapsed_s": elapsed_s, "generator": gens}, tmp)
        os.replace(tmp, state_file)

    net.train()
    done = run_loop(loss_fn, opt, loop, clip_params=model.parameters(), eval_fn=on_eval, start_step=step,
                    autocast=autocast_for(device), progress=progress and rank == 0, desc=f"train {tc.preset}")
    if not history:  # resumed a finished run
        val = val_loss(model, val_batches, device)
    else:
        val = history[-1]["val_loss"]
    if world > 1:
        (out / f"ddp_rank{rank}.json").write_text(json.dumps({"rank": rank, "checksum": param_checksum(model), "step": done.step}))
        dist.barrier()
        dist.destroy_process_group()
    return TrainResult(out=ckpt_dir, history=history, val_loss=val,
                       train_time_s=elapsed_before + done.train_time_s + done.eval_time_s, n_params=model.num_params())


def uptrain(
    model: CodexModel,
    tokens: Tensor,
    *,
    steps: int,
    batch_size: int = 8,
    seq_len: int = 128,
    lr: float = 1e-3,
    warmup: int = 0,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` in place on random windows of ``tokens`` (1-D ids); return the
    training losses (nats/token, one per step).

    A short continued pre-training: AdamW (no weight decay) with linear warm-up to ``lr``
    over ``warmup`` steps, then constant; gradient norm clipped at 1; LM loss plus the MoE
    layers' aux losses. This is the "uptraining" after an MHA -> GQA conversion (Ainslie et
    al. used about 5% of the pre-training steps), the capstone's brief pre-training, and a
    short pre-training from scratch.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    loop = LoopConfig(steps=steps, lr=lr, warmup=warmup, weight_decay=0.0, grad_clip=1.0)
    opt = adamw(model, loop)

    def loss_fn(_: int) -> tuple[Tensor, dict[str, float]]:
        x, y = random_batch(tokens, batch_size, seq_len, gen)  # (B, T) each
        out = model(x.to(device), y.to(device))
        return out.loss + out.aux_loss, {"loss": float(out.loss.detach())}

    model.train()
    res = run_loop(loss_fn, opt, loop)
    model.eval()
    return res.losses
