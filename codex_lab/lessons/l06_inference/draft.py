"""A draft model for speculative decoding, distilled from the target (lesson 06).

The untrained early-exit draft (:func:`codex_lab.nn.surgery.truncated_draft`: the target's
first layers + its final norm and head) guesses the target's next token rarely: the
hidden state after layer 1 of 4 is not what the final norm and head were trained to read.
Here the draft is *trained to imitate the target* (knowledge distillation, Hinton et al.
2015; for speculative decoding, DistillSpec, Zhou et al. 2024):

- shape: ``n_layer`` blocks (default 1) of the target's width, the target's embedding and
  tied head **shared and frozen** (not trained, not shipped); only the block(s) and the
  final norm are trained, starting from a copy of the target's first block(s) and norm
  (so step 0 *is* the early-exit draft);
- data: windows of the corpus's train split in the target's training format (fill-in-the-
  middle at the target's rate), half of each batch continued by the target's own greedy
  tokens (the text the draft is judged on when it drafts; "on-policy" data, which DistillSpec
  found raises acceptance); evaluated on fixed held-out windows, split alike;
- loss: the KL divergence from the target's next-token distribution to the draft's, at every
  position: ``KL(p || q) = sum_v p_v (log p_v - log q_v)`` (nats/token), which pushes the
  draft's whole distribution, and so its argmax, towards the target's;
- held-out curve: every ``eval_every`` steps, the share of held-out positions where the
  draft's argmax equals the target's (``agreement``, the greedy acceptance a single guess
  would get) and the mean KL, so :func:`codex_lab.training_state.training_state` can say
  whether the draft reached a plateau.

The trained block ships in the package (``codex_lab/assets/l06_draft``, float16, ~1.6 MB)
with the command that made it; :func:`load_draft` rebuilds the draft around a target.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from codex_lab.nn.model import CodexModel
from codex_lab.training.loop import LoopConfig

DRAFT_DIR = Path(__file__).resolve().parents[2] / "assets" / "l06_draft"  # codex_lab/assets/l06_draft



def distill_loop(steps: int, lr: float, warmup: int, eval_every: int = 0) -> LoopConfig:
    """The distillation's schedule: warm-up to ``lr``, then a cosine to a tenth of it at ``steps``."""
    return LoopConfig(steps=steps, lr=lr, min_lr=lr / 10, warmup=warmup, eval_every=eval_every)

def make_draft(target: CodexModel, n_layer: int = 1) -> CodexModel:
    """A ``n_layer``-block draft of ``target``'s width sharing its embedding and head.

    The blocks and the final norm are *copies* of the target's first ``n_layer`` blocks and
    its norm (trainable, the target is not touched); ``embed`` and ``lm_head`` are the
    target's own modules (shared, so the draft costs no extra embedding memory; freeze them
    with :func:`trainable_parameters`). At init the draft equals ``truncated_draft(target, n_layer)``.
    """
    if not 1 <= n_layer <= target.cfg.n_layer:
        raise ValueError(f"n_layer must be in 1..{target.cfg.n_layer}, got {n_layer}")
    cfg = copy.deepcopy(target.cfg)
    cfg.n_layer = n_layer
    if cfg.attn_patterns is not None:
        cfg.attn_patterns = cfg.attn_patterns[:n_layer]
    cfg.moe_layers = [i for i in cfg.moe_layers if i < n_layer]
    draft = CodexModel.__new__(CodexModel)
    nn.Module.__init__(draft)
    draft.cfg = cfg
    draft.embed, draft.lm_head = target.embed, target.lm_head  # shared, frozen
    draft.layers = nn.ModuleList([copy.deepcopy(b) for b in target.layers[:n_layer]])
    draft.norm = copy.deepcopy(target.norm)
    draft.register_buffer("rope_cos", target.rope_cos, persistent=False)
    draft.register_buffer("rope_sin", target.rope_sin, persistent=False)
    return draft.eval()


def trainable_parameters(draft: CodexModel) -> list[nn.Parameter]:
    """The draft's own weights: its blocks and final norm (not the shared embedding/head)."""
    return [*draft.layers.parameters(), *draft.norm.parameters()]


def draft_state(draft: CodexModel) -> dict[str, Tensor]:
    """The tensors that make a draft from its target: ``layers.*`` and ``norm.*``."""
    return {k: v for k, v in draft.state_dict().items() if k.startswith(("layers.", "norm."))}


def kl_to_target(target_logits: Tensor, draft_logits: Tensor) -> Tensor:
    """Mean over positions of KL(p || q), p = softmax(target), q = softmax(draft); logits (..., V); nats."""
    logp = F.log_softmax(target_logits.float(), dim=-1)  # (..., V)
    logq = F.log_softmax(draft_logits.float(), dim=-1)  # (..., V)
    # KL(p || q) = sum_v p_v (log p_v - log q_v)
    return (logp.exp() * (logp - logq)).sum(-1).mean()


@torch.no_grad()
def heldout_agreement(target: CodexModel, draft: CodexModel, batches: list[Tensor]) -> tuple[float, float]:
    """(agreement, KL) on fixed windows ``batches`` (each (B, T) ids): the share of positions
    where the draft's argmax equals the target's, and the mean KL(p_target || q_draft) in nats."""
    agree = kl = 0.0
    n = 0
    for x in batches:
        pt = target(x).logits  # (B, T, V)
        pd = draft(x).logits  # (B, T, V)
        agree += float((pt.argmax(-1) == pd.argmax(-1)).float().sum())
        kl += float(kl_to_target(pt, pd)) * x.numel()
        n += x.numel()
    return agree / n, kl / n


@dataclass
class DistillConfig:
    """Sizes of one distillation run (defaults: the shipped draft, ~3 CPU minutes on one core,
    the target's greedy continuations included).

    steps, batch_size, seq_len: optimiser steps of ``batch_size`` windows of ``seq_len``
    tokens; lr: AdamW peak rate (warm-up ``warmup`` steps, cosine to lr / 10);
    eval_every / eval_windows: held-out curve period and size (fixed ``seq_len`` windows of
    the validation split); n_layer: draft blocks; max_files: corpus files read (sorted, then
    split by path hash as everywhere in the course); fim_rate: share of training chunks in
    fill-in-the-middle form (the target's own training rate); loss: "kl" (KL(p_target || q_draft))
    or "greedy" (cross-entropy on the target's argmax tokens, hard distillation); on_policy:
    share of each batch's windows that are the target's own greedy continuations (the text a
    draft is judged on when it drafts: DistillSpec's on-policy data) drawn from ``policy_seqs``
    windows, each ``seq_len / 2`` corpus tokens then ``seq_len / 2`` tokens the target chose
    (the held-out set is split alike); seed: data order and FIM draws.
    """

    steps: int = 480
    batch_size: int = 4
    seq_len: int = 256
    lr: float = 3e-3
    warmup: int = 10
    eval_every: int = 40
    eval_windows: int = 32
    n_layer: int = 1
    max_files: int = 200
    fim_rate: float = 0.5
    loss: str = "kl"
    on_policy: float = 0.5
    policy_seqs: int = 128
    seed: int = 0


@dataclass
class DistillResult:
    """A distilled draft and its held-out curves: ``curve`` rows (step, agreement, KL nats),
    step 0 being the untrained early-exit draft; ``train_s``: process CPU seconds of the run."""

    draft: CodexModel
    config: DistillConfig
    curve: list[tuple[int, float, float]] = field(default_factory=list)
    train_s: float = 0.0

    def agreement_curve(self) -> list[tuple[int, float]]:
        """(step, held-out agreement) pairs, for :func:`codex_lab.training_state.training_state`."""
        return [(s, a) for s, a, _ in self.curve]


def distill_data(tok: Any, cfg: DistillConfig) -> tuple[Tensor, Tensor]:
    """Token streams (train, held-out), both with FIM at ``cfg.fim_rate`` (the target's format)."""
    from codex_lab.data.corpus import load_corpus
    from codex_lab.data.fim import fim_token_stream

    corpus = load_corpus(max_files=cfg.max_files)
    # chunks of ~3 characters per token x seq_len: one FIM example fits one window
    train = fim_token_stream(tok, corpus.texts("train"), cfg.fim_rate, seed=cfg.seed, chunk_chars=3 * cfg.seq_len)
    val = fim_token_stream(tok, corpus.texts("val"), cfg.fim_rate, seed=1000 + cfg.seed, chunk_chars=3 * cfg.seq_len)
    return train, val


@torch.no_grad()
def policy_windows(target: CodexModel, stream: Tensor, n: int, seq_len: int, gen: torch.Generator,
                   batch: int = 16) -> Tensor:
    """``n`` windows (n, seq_len): ``seq_len // 2`` tokens cut at random from ``stream``, then the
    target's greedy continuation for the rest (batched static-cache decoding)."""
    from codex_lab.data.batches import random_batch
    from codex_lab.infer.generate import generate_batch_cached

    half = seq_len // 2
    out = []
    for i in range(0, n, batch):
        x, _ = random_batch(stream, min(batch, n - i), half, gen)  # (b, half)
        new = generate_batch_cached(target, x, max_new_tokens=seq_len - half)  # (b, seq_len - half)
        out.append(torch.cat([x, new], dim=1))  # (b, seq_len)
    return torch.cat(out) if out else torch.empty(0, seq_len, dtype=torch.long)


def distill(target: CodexModel, tok: Any, cfg: DistillConfig | None = None, *,
            data: tuple[Tensor, Tensor] | None = None, log: Callable[[str], None] | None = None) -> DistillResult:
    """Distil a draft from ``target`` (frozen) with ``cfg.loss`` on train-split windows, a share
    ``cfg.on_policy`` of each batch continued by the target's own greedy tokens.

    ``data``: (train, held-out) token streams (default :func:`distill_data`). The caller's
    grad mode is restored. Returns the draft (eval mode) and its curves.
    """
    from codex_lab.data.batches import fixed_batches, random_batch
    from codex_lab.training.loop import adamw, run_loop

    cfg = cfg or DistillConfig()
    if cfg.loss not in ("kl", "greedy"):
        raise ValueError(f"loss must be 'kl' or 'greedy', got {cfg.loss!r}")
    if not 0.0 <= cfg.on_policy < 1.0:
        raise ValueError(f"on_policy is the share of each batch the target continues, in [0, 1), got {cfg.on_policy}")
    train, val = data if data is not None else distill_data(tok, cfg)
    t0 = time.process_time()  # CPU seconds from here: the target's continuations count
    target.eval()
    draft = make_draft(target, cfg.n_layer)
    gen = torch.Generator().manual_seed(cfg.seed)
    n_pol = round(cfg.eval_windows * cfg.on_policy)
    eval_x = [x for x, _ in fixed_batches(val, cfg.eval_windows - n_pol, cfg.seq_len, 1)]  # one (W, T) batch of corpus text
    if n_pol:  # and one of the target's own continuations of held-out text
        eval_x.append(policy_windows(target, val, n_pol, cfg.seq_len, torch.Generator().manual_seed(1000 + cfg.seed)))
    b_pol = min(round(cfg.batch_size * cfg.on_policy), cfg.batch_size - 1)  # at least one corpus window
    pool = policy_windows(target, train, cfg.policy_seqs, cfg.seq_len, gen) if b_pol else None
    res = DistillResult(draft, cfg)
    grad = torch.is_grad_enabled()
    own = {id(p) for p in trainable_parameters(draft)}
    frozen = [(p, p.requires_grad) for p in [*target.parameters(), *draft.parameters()] if id(p) not in own]
    for p, _ in frozen:  # the target and the shared embedding/head: no gradients computed for them
        p.requires_grad_(False)
    torch.set_grad_enabled(True)
    try:
        a0, k0 = heldout_agreement(target, draft, eval_x)
        res.curve.append((0, a0, k0))

        def loss_fn(step: int) -> tuple[Tensor, dict[str, float]]:
            x, _ = random_batch(train, cfg.batch_size - b_pol, cfg.seq_len, gen)  # (B - b_pol, T) corpus windows
            if pool is not None:  # + b_pol of the target's continuations
                x = torch.cat([x, pool[torch.randint(0, len(pool), (b_pol,), generator=gen)]])  # (B, T)
            with torch.no_grad():
                p_logits = target(x).logits  # (B, T, V), the teacher
            draft.train()
            q_logits = draft(x).logits  # (B, T, V)
            if cfg.loss == "greedy":
                # hard distillation: -log q(argmax_v p_v) per position
                loss = F.cross_entropy(q_logits.float().flatten(0, 1), p_logits.argmax(-1).flatten())
            else:
                loss = kl_to_target(p_logits, q_logits)
            return loss, {"loss": float(loss.detach())}

        def eval_fn(step: int, row: dict[str, float]) -> None:
            draft.eval()
            a, k = heldout_agreement(target, draft, eval_x)
            res.curve.append((step, a, k))
            if log:
                log(f"step {step}: held-out agreement {a:.3f}, KL {k:.3f} nats, train KL {row.get('loss', math.nan):.3f}")

        loop = distill_loop(cfg.steps, cfg.lr, cfg.warmup, cfg.eval_every)
        run_loop(loss_fn, adamw(trainable_parameters(draft), loop), loop, eval_fn=eval_fn)
    finally:
        torch.set_grad_enabled(grad)
        for p, flag in frozen:
            p.requires_grad_(flag)
        draft.eval()
    res.train_s = time.process_time() - t0
    return res


def save_draft(res: DistillResult, path: str | Path = DRAFT_DIR, **provenance: Any) -> Path:
    """Write the draft's own tensors (float16 safetensors) and ``meta.json`` (config, curve,
    CPU seconds and ``provenance``: command, commit, date, machine)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to(torch.float16).contiguous() for k, v in draft_state(res.draft).items()},
              str(path / "draft.safetensors"))
    meta = {"config": asdict(res.config), "curve": [list(r) for r in res.curve], "train_cpu_s": res.train_s,
            "dtype": "float16", "shares": "the target's embedding and tied head (not stored)", **provenance}
    (path / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return path


def draft_meta(path: str | Path = DRAFT_DIR) -> dict[str, Any]:
    """The shipped draft's ``meta.json``: its config, held-out curve and provenance."""
    return json.loads((Path(path) / "meta.json").read_text())


def load_draft(target: CodexModel, path: str | Path = DRAFT_DIR) -> CodexModel:
    """The shipped distilled draft around ``target`` (which must be the shipped model: the
    draft reads its embedding and head). Weights are stored in float16 and loaded in the
    target's dtype and device.

    The file's header is checked before its tensors are read: the draft's weights (its block(s)
    and norm, at most the target's own) must be what the file declares and really on disk
    (:func:`~codex_lab.data.weights_file.check_weights_held`), so a file declaring more, or a
    sparse one, is an InputError instead of an allocation of whatever it declares.
    """
    from safetensors.torch import load_file

    from codex_lab.data.weights_file import check_weights_held, safetensors_sizes

    meta = draft_meta(path)
    draft = make_draft(target, int(meta["config"]["n_layer"]))  # bounded: copies of the target's own blocks
    weights = Path(path) / "draft.safetensors"
    want = sum(t.numel() for t in draft_state(draft).values())
    check_weights_held(Path(path) / "meta.json", want, {weights: safetensors_sizes(weights)},
                       fix="the draft was made for another target: remake it "
                           "(python -m codex_lab.lessons.l06_inference.draft)")
    ref = next(target.parameters())
    state = {k: v.to(device=ref.device, dtype=ref.dtype) for k, v in load_file(str(weights)).items()}
    missing = set(draft_state(draft)) - set(state)
    if missing:
        raise ValueError(f"{path}: the draft file lacks {sorted(missing)[:3]}")
    draft.load_state_dict(state, strict=False)
    return draft.eval()


def main(argv: list[str] | None = None) -> None:
    """``python -m codex_lab.lessons.l06_inference.draft``: distil the draft from the shipped model and write it
    (default: the package's ``assets/l06_draft``) with its provenance (command, commit, date,
    machine, CPU and wall seconds)."""
    import argparse
    import datetime
    import platform
    import subprocess
    import sys

    from codex_lab.training.checkpoint import load_pretrained

    d = DistillConfig()
    ap = argparse.ArgumentParser(prog="python -m codex_lab.lessons.l06_inference.draft", description=main.__doc__)
    for f, v in asdict(d).items():
        ap.add_argument(f"--{f.replace('_', '-')}", type=type(v), default=v)
    ap.add_argument("--out", default=str(DRAFT_DIR))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = DistillConfig(**{f: getattr(args, f) for f in asdict(d)})
    ck = load_pretrained("cpu")
    t0 = time.perf_counter()
    res = distill(ck.model, ck.tokenizer, cfg, log=print)
    wall = time.perf_counter() - t0
    try:
        here = Path(__file__).resolve().parent
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here).stdout.strip() or "unknown"
        if subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=here).stdout.strip():
            commit += " (with uncommitted changes)"
    except OSError:
        commit = "unknown"
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    path = save_draft(res, args.out, command=" ".join(["python -m codex_lab.lessons.l06_inference.draft", *(sys.argv[1:] if argv is None else argv)]),
                      commit=commit, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      machine=f"{cpu}, {torch.get_num_threads()} thread(s), torch {torch.__version__}", wall_s=wall)
    print(f"wrote {path}: held-out agreement {res.curve[0][1]:.3f} -> {res.curve[-1][1]:.3f} in {res.train_s:.0f} CPU s")


if __name__ == "__main__":
    main()
