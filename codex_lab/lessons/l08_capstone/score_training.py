"""How the scorecard trains the arms it compares (the plain baseline, the learner's design and
the course's reference design, each converted from the shipped model): briefly, at the
capstone's pre-training stage (fast and full mode), or each to its plateau by the
training-state rule (standard mode, :class:`PlateauBudget`), so that standard mode scores
the quality criteria on trained models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from codex_lab.lessons.l08_capstone.results import StageLog

SCORED_LEN = 256  # validation sequences the scorecard measures (tokens): the longest scored pairs
# the smallest change of held-out loss that matters (nats/token), as in lessons 03 and 08's trade experiment
MIN_CHANGE_NATS = 0.01


def val_loss_at(model: Any, tokenizer: Any, corpus: Any, sz: Any) -> float:
    """Validation loss (nats/token) on fixed batches of :data:`SCORED_LEN` tokens."""
    from codex_lab.data.batches import fixed_batches, tokenize_texts
    from codex_lab.training.evaluate import val_loss

    val = fixed_batches(tokenize_texts(tokenizer, corpus.texts("val")), sz.batch_size, SCORED_LEN, sz.val_batches)
    return float(val_loss(model, val))


def _best_at_start(curves: list[Any]) -> tuple[float, float] | None:
    """(mean held-out loss at step 0, at the last evaluation) when step 0 is the arm's best
    evaluation over its seeds' mean (lower is better), else None."""
    means = [sum(c[i][1] for c in curves) / len(curves) for i in range(len(curves[0]))]
    return (means[0], means[-1]) if means[0] <= min(means) else None


def quality_states(curves: dict[str, list[Any]], *, min_change: float = MIN_CHANGE_NATS) -> dict[str, Any]:
    """Each arm's training state (:func:`codex_lab.training_state.training_state`, held-out
    loss, lower is better) from its pre-training curves, one per seed: ``{arm: TrainingState}``."""
    from codex_lab.training_state import training_state

    return {arm: training_state(cs, higher_is_better=False, min_change=min_change, arm=arm)
            for arm, cs in curves.items() if cs}


def train_briefly(base: Any, cfgs: dict[str, Any], tok: Any, corpus: Any, sizes: Any,
                   seeds: tuple[int, ...]) -> tuple[dict, dict, dict, Any, dict]:
    """Fast and full mode: every arm (the baseline, the candidate and the reference design,
    each converted from ``base``) gets the capstone's pre-training stage at ``sizes``, seed by
    seed. Returns per arm the seeds' validation losses at :data:`SCORED_LEN` tokens and held-out
    curves, the first seed's models, its stage log, and the arms' training states."""
    from codex_lab.lessons.l08_capstone import pipeline as cap
    from codex_lab.nn.surgery import convert

    losses: dict[str, list[float]] = {}
    curves: dict[str, list[Any]] = {}
    first: dict[str, Any] = {}
    first_log = None
    for seed in seeds:
        log = StageLog()
        models = cap.build_models(base, cfgs["candidate"], seed=seed, log=log)
        arms = {**models, **{k: convert(base, c, seed=seed) for k, c in cfgs.items() if k != "candidate"}}
        cap.pretrain_stage(arms, tok, corpus, sizes, log, seed=seed)
        for name, m in arms.items():
            losses.setdefault(name, []).append(val_loss_at(m, tok, corpus, sizes))
            curves.setdefault(name, []).append(log.curves[name])
        if not first:
            first, first_log = dict(arms), log
    return losses, curves, first, first_log, quality_states(curves)


@dataclass(frozen=True)
class PlateauBudget:
    """Standard mode's pre-training of every arm to its plateau: the seeds of an arm train in
    lockstep, ``chunk`` steps at a time (a held-out evaluation every ``eval_every``), until the
    training-state rule calls the arm trained (or ``max_steps``); then ``extend`` of its steps
    again, the budget-extension check (:func:`codex_lab.training.plateau.train_to_plateau`)."""

    chunk: int = 20
    eval_every: int = 4
    max_steps: int = 400
    warmup: int = 10
    extend: float = 0.5
    files: int = 300  # corpus train files the arms train on (the brief stage's 40 would be learned by heart)


STANDARD_BUDGET = PlateauBudget()


def train_to_plateau(base: Any, cfgs: dict[str, Any], tok: Any, corpus: Any, sizes: Any, seeds: tuple[int, ...], *,
                      budget: PlateauBudget = STANDARD_BUDGET) -> tuple[dict, dict, dict, Any, dict]:
    """Standard mode: every arm converted from ``base`` (one copy per seed) and trained to its
    plateau (:class:`PlateauBudget`); each arm is scored where the rule stopped (its weights
    there are kept and put back after the extension check), and an arm the extension still
    improved by ``MIN_CHANGE_NATS`` or more is under-trained, whatever the rule said. Returns
    what :func:`train_briefly` does."""
    import copy
    import time
    from dataclasses import replace

    from codex_lab.data.batches import fixed_batches, tokenize_texts
    from codex_lab.lessons.l08_capstone import pipeline as cap
    from codex_lab.nn.surgery import convert
    from codex_lab.stats import DEGRADING, TRAINED
    from codex_lab.training.curves import LMSession
    from codex_lab.training.plateau import overruled_by_extension
    from codex_lab.training.plateau import train_to_plateau as plateau_run

    t0 = time.perf_counter()
    train_tokens = tokenize_texts(tok, corpus.texts("train")[: budget.files])
    val = fixed_batches(tokenize_texts(tok, corpus.texts("val")), sizes.batch_size, sizes.seq_len, sizes.val_batches)
    log = StageLog()
    per_seed = []
    for i, seed in enumerate(seeds):
        models = cap.build_models(base, cfgs["candidate"], seed=seed, log=log if i == 0 else StageLog())
        per_seed.append({**models, **{k: convert(base, c, seed=seed) for k, c in cfgs.items() if k != "candidate"}})
    losses: dict[str, list[float]] = {}
    curves: dict[str, list[Any]] = {}
    states: dict[str, Any] = {}
    for name in per_seed[0]:
        sessions = [LMSession(arms[name], train_tokens, val, lr=sizes.lr, warmup=budget.warmup,
                              batch_size=sizes.batch_size, seq_len=sizes.seq_len, seed=seed,
                              eval_every=budget.eval_every) for arms, seed in zip(per_seed, seeds)]
        frozen: list[Any] = []

        def snapshot(sessions: list[Any] = sessions) -> list[dict[str, Any]]:
            return [copy.deepcopy(x.model.state_dict()) for x in sessions]

        def restore(snap: list[dict[str, Any]], sessions: list[Any] = sessions) -> None:
            for x, w in zip(sessions, snap):
                x.model.load_state_dict(w)  # early stopping: back to the arm's best chunk end (held-out loss)

        # an arm past its best (held-out loss rising) is compared at its best chunk end, as lesson 05's are,
        # or at its start when no chunk end beat it (the untouched baseline: already at its plateau)
        start = snapshot()
        run = plateau_run([x.advance for x in sessions], arm=name, chunk=budget.chunk, max_steps=budget.max_steps,
                               higher_is_better=False, min_change=MIN_CHANGE_NATS, extend=budget.extend,
                               before_extension=lambda: frozen.extend(snapshot()), snapshot=snapshot, restore=restore)
        st = run.state
        at_start = _best_at_start(run.curves) if st.state == DEGRADING else None
        if at_start is not None:
            frozen[:] = start  # early stopping on validation, at the checkpoint of step 0
            st = replace(st, state=TRAINED, final=at_start[0], reason=(
                f"at its best untouched: its mean held-out loss only rose under more pre-training, from {at_start[0]:.4g} "
                f"at step 0 to {at_start[1]:.4g} by step {run.curves[0][-1][0]:g}; compared at step 0 (early stopping)"))
        for arms, weights in zip(per_seed, frozen):
            arms[name].load_state_dict(weights)  # scored where the rule stopped, not after the extension
            arms[name].eval()
        st = overruled_by_extension(st, steps=run.steps, extension_steps=run.extension_steps,
                                    change=run.extension_change, min_change=MIN_CHANGE_NATS)
        states[name], curves[name] = st, run.curves
        losses[name] = [val_loss_at(arms[name], tok, corpus, sizes) for arms in per_seed]
        log.put(name, pretrain_steps=0 if at_start else run.steps, extension=st.reason if at_start else run.describe(),
                val_loss_pretrained=losses[name][0])
        log.curves[name] = run.curves[0]
    log.timed("pretrain", t0)
    return losses, curves, dict(per_seed[0]), log, states
