"""Pre-training a code model: AdamW, warm-up + cosine learning rate, gradient clipping,
mixed precision on GPU, periodic validation, atomic checkpoints and resume.

The same function runs single-process or under ``torchrun`` (DistributedDataParallel; gloo
on CPU, NCCL on CUDA): ``torchrun --nproc_per_node=2 -m codex_lab.cli train --preset tiny``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from codex_lab.training.checkpoint import load_checkpoint, save_checkpoint
from codex_lab.nn.config import ModelConfig
from codex_lab.data.corpus import load_corpus
from codex_lab.data.batches import fixed_batches, random_batch, tokenize_texts
from codex_lab.nn.model import CodexModel
from codex_lab.runtime import fast_mode, get_device, seed_everything
from codex_lab.data.tokenizer import CodeTokenizer, train_tokenizer


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved in the checkpoint's meta).

    Sizes are in tokens; ``lr`` is the peak learning rate reached after ``warmup`` steps,
    decayed by a cosine to ``min_lr`` at ``steps``.
    """

    preset: str = "tiny"
    vocab_size: int = 4096
    d_model: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None
    seq_len: int = 256
    batch_size: int = 16
    steps: int = 1000
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    seed: int = 0
    corpus: str | None = None
    max_files: int | None = None
    out: str = "runs/tiny"
    device: str | None = None
    extra_model: dict[str, Any] = field(default_factory=dict)

    def model_config(self, vocab_size: int) -> ModelConfig:
        """The model shape this run trains (max_seq_len covers the training windows)."""
        return ModelConfig(
            vocab_size=vocab_size, d_model=self.d_model, n_layer=self.n_layer, n_head=self.n_head,
            n_kv_head=self.n_kv_head, max_seq_len=max(1024, self.seq_len), **self.extra_model,
        )


PRESETS: dict[str, dict[str, Any]] = {
    # ~4.2M parameters, fits 2 CPU cores; the shipped checkpoint.
    "tiny": dict(vocab_size=4096, d_model=256, n_layer=4, n_head=4, seq_len=256, batch_size=16, steps=600, lr=3e-3, warmup=30, eval_every=50),
    # ~30M parameters, for one consumer GPU.
    "small": dict(vocab_size=8192, d_model=512, n_layer=8, n_head=8, seq_len=1024, batch_size=32, steps=5000, lr=1e-3, min_lr=1e-4, warmup=200, eval_every=250),
}
# Fast mode: seconds, not minutes (CI, smoke tests); same code path.
FAST_OVERRIDES: dict[str, Any] = dict(vocab_size=512, d_model=64, n_layer=2, n_head=2, seq_len=64, batch_size=8, steps=20, warmup=4, eval_every=10, eval_batches=2, max_files=60)


def preset_config(name: str = "tiny", **overrides: Any) -> TrainConfig:
    """A :class:`TrainConfig` from a preset, shrunk in fast mode, then ``overrides`` applied."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    values: dict[str, Any] = {"preset": name, **PRESETS[name], "out": f"runs/{name}"}
    if fast_mode():
        values.update(FAST_OVERRIDES)
    known = {f.name for f in fields(TrainConfig)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ValueError(f"unknown training options {bad}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(**values)


def lr_at(step: int, tc: TrainConfig) -> float:
    """Learning rate at ``step``: linear warm-up, then cosine decay to ``min_lr``."""
    if step < tc.warmup:
        # lr * (step + 1) / warmup
        return tc.lr * (step + 1) / tc.warmup
    progress = min(1.0, (step - tc.warmup) / max(1, tc.steps - tc.warmup))
    # min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2
    return tc.min_lr + (tc.lr - tc.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


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


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> float:
    """Mean validation loss (nats per token) over fixed batches."""
    was = model.training
    model.eval()
    losses = []
    for x, y in batches:
        out = model(x.to(device), y.to(device))
        losses.append(float(out.loss))
    model.train(was)
    return sum(losses) / len(losses)


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

    corpus = load_corpus(tc.corpus, max_files=tc.max_files)
    if resume:
        if not state_file.is_file():
            raise FileNotFoundError(f"nothing to resume: {state_file} is missing; train without --resume first")
        ck = load_checkpoint(ckpt_dir)
        tokenizer, model = ck.tokenizer, ck.model.train()
    else:
        if rank == 0:
            tokenizer = train_tokenizer(corpus.texts("train"), vocab_size=tc.vocab_size)
            out.mkdir(parents=True, exist_ok=True)
            tokenizer.save(out / "tokenizer.json")
        if world > 1:
            dist.barrier()
        tokenizer = CodeTokenizer.load(out / "tokenizer.json")
        seed_everything(tc.seed)  # identical initial weights on every rank
        model = CodexModel(tc.model_config(tokenizer.vocab_size))
    model.to(device)
    train_tokens = tokenize_texts(tokenizer, corpus.texts("train"))
    val_tokens = tokenize_texts(tokenizer, corpus.texts("val"))
    val_batches = fixed_batches(val_tokens, tc.batch_size, tc.seq_len, tc.eval_batches)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tc.lr, betas=(0.9, 0.95), fused=device.type == "cuda",
    )
    step, history, elapsed_before = 0, [], 0.0
    gen = torch.Generator().manual_seed(tc.seed * 1000 + rank)  # each rank its own windows
    if resume:
        state = torch.load(state_file, map_location="cpu", weights_only=False)
        opt.load_state_dict(state["optimizer"])
        step, history, elapsed_before = state["step"], state["history"], state["elapsed_s"]
        gen.set_state(state["generator"][rank] if isinstance(state["generator"], list) else state["generator"])

    net: torch.nn.Module = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)

    def checkpoint(val_loss: float) -> None:
        gens = [gen.get_state()]
        if world > 1:
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, gen.get_state())
            gens = gathered
        if rank != 0:
            return
        meta = {"train_config": asdict(tc), "history": history, "val_loss": val_loss, "step": step,
                "train_time_s": elapsed_before + (time.perf_counter() - t0), "n_params": model.num_params(),
                "corpus": corpus.stats(), "world_size": world, "torch": torch.__version__, "device": str(device)}
        save_checkpoint(ckpt_dir, model, tokenizer, meta)
        tmp = state_file.with_suffix(".tmp")
        torch.save({"optimizer": opt.state_dict(), "step": step, "history": history,
                    "elapsed_s": meta["train_time_s"], "generator": gens}, tmp)
        os.replace(tmp, state_file)

    t0 = time.perf_counter()
    net.train()
    bar = tqdm(total=tc.steps, initial=step, desc=f"train {tc.preset}", disable=not progress or rank != 0)
    val_loss = float("nan")
    train_loss = float("nan")
    while step < tc.steps:
        lr = lr_at(step, tc)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = random_batch(train_tokens, tc.batch_size, tc.seq_len, gen)
        with amp:
            o = net(x.to(device), y.to(device))
            loss = o.loss + o.aux_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        step += 1
        train_loss = float(o.loss.detach())
        bar.update(1)
        bar.set_postfix(loss=f"{train_loss:.3f}", lr=f"{lr:.1e}")
        if step % tc.eval_every == 0 or step == tc.steps:
            val_loss = evaluate(model, val_batches, device)
            history.append({"step": step, "train_loss": train_loss, "val_loss": val_loss, "lr": lr,
                            "tokens": step * tc.batch_size * tc.seq_len * world,
                            "elapsed_s": elapsed_before + time.perf_counter() - t0})
            checkpoint(val_loss)
    bar.close()
    if not history:  # resumed a finished run
        val_loss = evaluate(model, val_batches, device)
    else:
        val_loss = history[-1]["val_loss"]
    if world > 1:
        (out / f"ddp_rank{rank}.json").write_text(json.dumps({"rank": rank, "checksum": param_checksum(model), "step": step}))
        dist.barrier()
        dist.destroy_process_group()
    return TrainResult(out=ckpt_dir, history=history, val_loss=val_loss,
                       train_time_s=elapsed_before + time.perf_counter() - t0, n_params=model.num_params())
