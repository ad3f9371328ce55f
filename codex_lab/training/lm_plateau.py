"""Language models trained to their plateau, the seeds in lockstep: the sessions and the driver
that lessons 03, 04 and 08 share (their reference runs each train arms from a checkpoint or
from scratch until the training-state rule calls them trained, then half as long again).

One :class:`codex_lab.training.curves.LMSession` per seed (warm-up, then a constant rate: the
rule sees the model level off, not an annealed rate), driven by
:func:`codex_lab.training.plateau.train_to_plateau`; the held-out loss and the weights are read at
the stopping point, before the budget-extension check trains on.

With ``processes=True`` each seed's session lives in a process of its own
(:class:`codex_lab.parallel.Remote`): the seeds of each chunk train side by side, so an arm left to
run alone (a reference run's last) uses every core; each seed's arithmetic is the one it has in
place (one math thread, its own generator), so the numbers are the same
(``tests/test_parallel.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from torch import Tensor

from codex_lab.nn.model import CodexModel
from codex_lab.parallel import Remote, call_all
from codex_lab.training.curves import LMSession
from codex_lab.training.plateau import PlateauRun, train_to_plateau

Session = LMSession | Remote  # a seed's session, here or in a process of its own


def lm_sessions(models: Sequence[CodexModel], seeds: Sequence[int], train: Tensor,
                evals: Sequence[Sequence[tuple[Tensor, Tensor]]], *, lr: float, warmup: int, batch_size: int,
                seq_len: int, eval_every: int, salt: int, checkpoints: str | Path | None = None,
                unit: str = "", processes: bool = False) -> list[Session]:
    """One session per seed: ``models[i]`` trained on random windows of ``train`` (1-D ids) drawn
    by a generator seeded ``seeds[i] + salt`` (the arms of one seed share a data order when they
    share ``salt``: paired), scored on ``evals[i]`` (that seed's held-out (x, y) batches). With
    ``checkpoints`` (a folder) each session resumes from, and keeps, ``<unit>-seed<seed>.pt`` there.
    ``processes``: each session built in a process of its own (a :class:`~codex_lab.parallel.Remote`;
    :func:`lm_to_plateau` drives either kind and closes the processes when it returns)."""
    if not (len(models) == len(seeds) == len(evals)):
        raise ValueError(f"give one model, seed and evaluation sample per seed; got {len(models)}, {len(seeds)}, "
                         f"{len(evals)}")
    make: Any = (lambda *a, **kw: Remote(LMSession, *a, **kw)) if processes else LMSession
    return [make(m, train, ev, lr=lr, warmup=warmup, batch_size=batch_size, seq_len=seq_len, seed=seed + salt,
                 eval_every=eval_every,
                 checkpoint=None if checkpoints is None else Path(checkpoints) / f"{unit}-seed{seed}.pt")
            for m, seed, ev in zip(models, seeds, evals)]


def first_values(sessions: Sequence[Session]) -> list[float]:
    """Each session's held-out value before any training (a converted model's, untouched)."""
    return call_all([_method(s, "first_value") for s in sessions])


def _method(session: Session, name: str) -> Any:
    return session.method(name) if isinstance(session, Remote) else getattr(session, name)


def lm_to_plateau(arm: str, sessions: Sequence[Session], *, chunk: int, min_steps: int, max_steps: int,
                  min_change: float, extend: float,
                  confirm: bool = False) -> tuple[PlateauRun, list[float], list[dict[str, Tensor]]]:
    """Train ``sessions`` (one per seed) to their plateau (held-out loss, lower is better, judged
    every ``chunk`` steps from ``min_steps``, cap ``max_steps``; then ``extend`` of the steps again);
    returns the run, each seed's held-out loss at the stopping point (nats/token) and the models'
    weights there (read before the extension trains on). ``confirm``: an arm the extension finds
    still learning trains on and is judged again (:func:`~codex_lab.training.plateau.train_to_plateau`).
    Sessions in processes of their own (``lm_sessions(processes=True)``) train side by side and are
    closed when this returns (what they wrote to disk stays)."""
    at_stop: dict[str, Any] = {}

    def freeze() -> None:  # the verdict is read at the stopping point, before the extension trains on
        got = call_all([_method(s, "freeze") for s in sessions])
        at_stop["final"], at_stop["weights"] = [f for f, _ in got], [w for _, w in got]

    try:
        run = train_to_plateau([_method(s, "advance") for s in sessions], arm=arm, chunk=chunk, max_steps=max_steps,
                               min_steps=min_steps, higher_is_better=False, min_change=min_change, extend=extend,
                               before_extension=freeze, confirm=confirm)
    finally:
        for s in sessions:
            if isinstance(s, Remote):
                s.close()
    return run, at_stop["final"], at_stop["weights"]


def fixed_steps(sessions: Sequence[LMSession], steps: int, chunk: int) -> list[list[tuple[float, float]]]:
    """Train every session ``steps`` steps in chunks of ``chunk`` (each chunk checkpointed when the
    sessions keep checkpoints: ``advance(a); advance(b)`` trains what ``advance(a + b)`` does);
    returns each seed's held-out curve. A fixed budget: a pre-training an arm continues."""
    if steps < 1 or chunk < 1:
        raise ValueError(f"steps ({steps}) and chunk ({chunk}) must be >= 1")
    done = 0
    curves: list[list[tuple[float, float]]] = []
    while done < steps:
        n = min(chunk, steps - done)
        curves = [s.advance(n) for s in sessions]
        done += n
    return curves


__all__ = ["Session", "first_values", "fixed_steps", "lm_sessions", "lm_to_plateau"]
