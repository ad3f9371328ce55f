"""Training a small model from scratch with its held-out curve: the pieces the converged
experiments of lessons 03 and 08 share (a small-vocabulary token stream of the corpus, a
per-seed held-out sample, and a run that records ``(step, held-out loss)`` for the
training-state rule, :mod:`codex_lab.training_state`)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from codex_lab.data.batches import random_batch
from codex_lab.nn.model import CodexModel
from codex_lab.training.evaluate import val_loss
from codex_lab.training.loop import LoopConfig, adamw, held_tail, run_loop


def heldout_windows(tokens: Tensor, n_windows: int, seq_len: int, seed: int, batch_size: int = 16, *,
                    salt: int = 17) -> list[tuple[Tensor, Tensor]]:
    """One seed's evaluation sample: ``n_windows`` random windows of ``seq_len`` tokens of the
    held-out ``tokens`` (1-D ids), as (x, y) batches of (<= batch_size, seq_len). Another seed
    draws other windows, so the seeds' spread includes the evaluation sample's noise; ``salt``
    keeps an experiment's stream apart from its training order's."""
    gen = torch.Generator().manual_seed(10_007 * seed + salt)
    return [random_batch(tokens, min(batch_size, n_windows - i), seq_len, gen)  # (b, T) x, y
            for i in range(0, n_windows, batch_size)]


def small_vocab_streams(corpus: Any, vocab_size: int, max_files: int | None) -> tuple[Tensor, Tensor, int]:
    """(train ids, val ids, vocabulary size): a byte-level BPE of ``vocab_size`` tokens trained on
    the train split of the corpus's first ``max_files`` files (a small vocabulary keeps the
    output layer, most of a tiny model's step, small), then both splits as 1-D ids."""
    train, val, tok = small_vocab_data(corpus, vocab_size, max_files)
    return train, val, tok.vocab_size


def small_vocab_data(corpus: Any, vocab_size: int, max_files: int | None) -> tuple[Tensor, Tensor, Any]:
    """:func:`small_vocab_streams` with the tokenizer itself in place of its size (to serve the
    models trained on the streams)."""
    from codex_lab.data.batches import tokenize_texts
    from codex_lab.data.tokenizer import train_tokenizer

    files = corpus.files if max_files is None else corpus.files[:max_files]
    train = [f.text for f in files if f.split == "train"]
    val = [f.text for f in files if f.split == "val"]
    if not train or not val:
        raise ValueError(f"the first {max_files} corpus files give {len(train)} train and {len(val)} val files; "
                         "need both (use more files)")
    tok = train_tokenizer(train, vocab_size=vocab_size)
    return tokenize_texts(tok, train), tokenize_texts(tok, val), tok


def train_curve(model: CodexModel, train_tokens: Tensor, eval_batches: Sequence[tuple[Tensor, Tensor]], *,
                steps: int, lr: float, min_lr: float, warmup: int, batch_size: int, seq_len: int, seed: int,
                eval_every: int, weight_decay: float = 0.0, flat_share: float = 0.0) -> list[tuple[float, float]]:
    """Train ``model`` in place on random windows of ``train_tokens`` and return its held-out
    curve: ``(step, val loss in nats/token)`` at step 0 and every ``eval_every`` steps (and the
    last). AdamW (``weight_decay`` on matrices only), warm-up to ``lr``, cosine to ``min_lr`` at step
    ``decay_end = round(steps x (1 - flat_share))``, then ``min_lr`` held flat to ``steps``
    (``flat_share = 0``: the cosine ends at the last step); gradient norm clipped at 1; the
    batches are drawn from a generator seeded by ``seed``.

    Why a flat tail: a cosine that ends at the last step keeps lowering the loss until then
    (the annealing gain), so the last quarter of the curve slopes down whatever the budget;
    with the rate held at ``min_lr`` the curve shows whether more steps would still help.
    """
    loop, tail = held_tail(LoopConfig(steps=steps, lr=lr, min_lr=min_lr, warmup=warmup, weight_decay=weight_decay,
                                      grad_clip=1.0, eval_every=eval_every), flat_share)
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    opt = adamw(model, loop, split_decay=weight_decay > 0)  # decay on matrices only
    curve = [(0.0, val_loss(model, eval_batches))]

    def loss_fn(_: int) -> tuple[Tensor, dict[str, float]]:
        x, y = random_batch(train_tokens, batch_size, seq_len, gen)  # (B, T) each
        out = model(x.to(device), y.to(device))
        return out.loss + out.aux_loss, {"loss": float(out.loss.detach())}

    def eval_fn(step: int, _: dict[str, float]) -> None:
        if (eval_every and step % eval_every == 0) or step == steps:  # not at decay_end unless it is on the grid
            curve.append((float(step), val_loss(model, eval_batches)))

    model.train()
    run_loop(loss_fn, opt, loop, eval_fn=eval_fn)
    if tail is not None:  # the held tail: the same optimiser (its moments carry on), lr = min_lr
        run_loop(loss_fn, opt, tail, eval_fn=eval_fn, start_step=loop.steps)
    model.eval()
    return curve


class ChunkedSession:
    """What every session trained in chunks by a run to its plateau shares: ``advance(n)``
    trains ``n`` more steps (a subclass's :meth:`_train`) and returns the held-out curve, and
    ``checkpoint`` (a file path) keeps the whole session after every ``advance``, atomically.

    A session built on an existing checkpoint *replays*: its ``advance`` calls return the
    recorded curve, without training, until they reach the step the checkpoint holds, then
    train on from there. A deterministic driver making the same calls again thus reaches the
    same decisions, and a run killed between two chunks (a session's end) resumes where it
    stopped with the numbers an unbroken run gives. :meth:`_frozen_at` reads back what a
    subclass's ``freeze`` recorded at the driver's step when replaying past it.

    A subclass sets ``model``, ``opt``, ``gen`` (the batch generator), ``curve`` and calls
    :meth:`_start` at the end of its ``__init__``; :meth:`_extra` / :meth:`_load_extra` carry
    what else it keeps.
    """

    model: torch.nn.Module
    opt: torch.optim.Optimizer
    gen: torch.Generator
    curve: list[tuple[float, float]]

    def _start(self, checkpoint: str | Path | None) -> None:
        self.step, self.at = 0, 0  # at: the step the driver has reached (< step only while replaying)
        self.frozen: dict[str, Any] | None = None  # what freeze() recorded, with its "step"
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        if self.checkpoint is not None and self.checkpoint.exists():
            state = torch.load(self.checkpoint, map_location="cpu", weights_only=False)
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["opt"])
            self.gen.set_state(state["gen"])
            self.step, self.curve, self.frozen = int(state["step"]), [tuple(p) for p in state["curve"]], state["frozen"]
            self._load_extra(state)
        else:
            self.curve = [self._first_point()]

    def _first_point(self) -> tuple[float, float]:
        """The held-out value before any training: (0, value)."""
        raise NotImplementedError

    def _train(self, n: int) -> None:
        """Train ``n`` steps from ``self.step``, appending evaluations to ``self.curve``."""
        raise NotImplementedError

    def _extra(self) -> dict[str, Any]:
        return {}

    def _load_extra(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`_extra` saved."""

    def _save(self) -> None:
        assert self.checkpoint is not None
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.checkpoint.with_name(self.checkpoint.name + ".tmp")
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(), "gen": self.gen.get_state(),
                    "step": self.step, "curve": self.curve, "frozen": self.frozen, **self._extra()}, tmp)
        os.replace(tmp, self.checkpoint)  # a kill mid-write leaves the previous checkpoint whole

    def first_value(self) -> float:
        """The held-out value before any training (step 0: a converted model's, untouched)."""
        return float(self.curve[0][1])

    def held_out(self) -> list[tuple[float, float]]:
        """The held-out curve up to the step the driver has reached."""
        return [p for p in self.curve if p[0] <= self.at]

    def advance(self, n: int) -> list[tuple[float, float]]:
        """Train ``n`` more steps (or replay them from the checkpoint); returns the held-out curve so far."""
        if self.at + n <= self.step:  # replaying a checkpoint: these steps were trained before
            self.at += n
            return self.held_out()
        if self.at < self.step:
            raise ValueError(f"the checkpoint {self.checkpoint} holds step {self.step}, which the driver's steps "
                             f"({self.at} then +{n}) do not land on: resume with the same chunks, or delete it")
        self.model.train()
        self._train(n)
        self.at = self.step
        self.model.eval()
        if self.checkpoint is not None:
            self._save()
        return list(self.curve)

    def _frozen_at(self) -> dict[str, Any] | None:
        """The freeze record at the driver's step when replaying past it (None when live)."""
        if self.at < self.step:
            if self.frozen is None or self.frozen["step"] != self.at:
                raise ValueError(f"the checkpoint {self.checkpoint} has no frozen state at step {self.at}: delete it")
            return self.frozen
        return None

    def _keep_frozen(self, record: dict[str, Any]) -> None:
        """Record ``freeze``'s result at the driver's step, in the checkpoint too."""
        self.frozen = {"step": self.at, **record}
        if self.checkpoint is not None:
            self._save()


class LMSession(ChunkedSession):
    """One model trained on random windows of a token stream in chunks, with its held-out curve:
    the ``advance(n) -> curve`` a run to its plateau drives
    (:func:`codex_lab.training.plateau.train_to_plateau`).

    AdamW (no weight decay), a linear warm-up over ``warmup`` steps to ``lr``, then ``lr``
    held constant: a run has no end built into its schedule, so it can be extended, and a flat
    tail is the model's, not an annealed rate's. Gradient norm clipped at 1; the batches come
    from a generator seeded by ``seed``; held-out loss (nats/token) on ``eval_batches`` at step
    0 and every ``eval_every`` steps. ``advance(a); advance(b)`` trains exactly what
    ``advance(a + b)`` does (one optimiser, one generator).

    ``checkpoint`` (a file path): after every ``advance`` the whole session (weights, optimiser
    moments, the batch generator, the step and the curve, and a :meth:`freeze` record) is
    written there, atomically. A session built on an existing checkpoint *replays*: its
    ``advance`` calls return the recorded curve, without training, until they reach the step
    the checkpoint holds, then train on from there. A deterministic driver (a run to a plateau)
    making the same calls again thus reaches the same decisions, and a run killed between two
    chunks (a session's end) resumes where it stopped with the numbers an unbroken run gives.
    """

    def __init__(self, model: CodexModel, train_tokens: Tensor, eval_batches: Sequence[tuple[Tensor, Tensor]], *,
                 lr: float, warmup: int, batch_size: int, seq_len: int, seed: int, eval_every: int,
                 checkpoint: str | Path | None = None) -> None:
        if eval_every < 1 or batch_size < 1 or seq_len < 2:
            raise ValueError(f"eval_every ({eval_every}), batch_size ({batch_size}) must be >= 1 and seq_len ({seq_len}) >= 2")
        self.model, self.tokens, self.evals = model, train_tokens, list(eval_batches)
        self.lr, self.warmup, self.batch_size, self.seq_len, self.eval_every = lr, warmup, batch_size, seq_len, eval_every
        self.device = next(model.parameters()).device
        self.gen = torch.Generator().manual_seed(seed)
        self.opt = adamw(model, LoopConfig(steps=1, lr=lr))
        self._start(checkpoint)

    def _first_point(self) -> tuple[float, float]:
        return (0.0, val_loss(self.model, self.evals))

    def _train(self, n: int) -> None:
        for _ in range(n):
            # lr(step) = lr x min(1, (step + 1) / warmup): linear warm-up, then constant
            lr = self.lr * min(1.0, (self.step + 1) / max(1, self.warmup))
            for g in self.opt.param_groups:
                g["lr"] = lr
            x, y = random_batch(self.tokens, self.batch_size, self.seq_len, self.gen)  # (B, T) each
            out = self.model(x.to(self.device), y.to(self.device))
            loss = out.loss + out.aux_loss
            if not torch.isfinite(loss):
                raise FloatingPointError(f"the training loss became {float(loss)} at step {self.step}: lower lr ({self.lr:g})")
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.step += 1
            if self.step % self.eval_every == 0:
                self.curve.append((float(self.step), val_loss(self.model, self.evals)))

    def freeze(self) -> tuple[float, dict[str, Tensor]]:
        """(held-out loss, a copy of the weights) at the step the driver has reached: read from the
        model, and kept in the checkpoint, when live; from that record when replaying past it."""
        rec = self._frozen_at()
        if rec is not None:
            return float(rec["final"]), rec["weights"]
        final, weights = self.held_out()[-1][1], copy.deepcopy(self.model.state_dict())
        self._keep_frozen({"final": final, "weights": weights})
        return final, weights


