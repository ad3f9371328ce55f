"""The scorecard's standard-mode training: every arm to its plateau by the training-state rule,
scored where the rule stopped, demoted when its budget extension still improves it. Tiny models
(a 2-layer width-32 base of the small test tokenizer) and a corpus of 30 files, so it runs in
seconds; the verdict comes out both ways: a rate of 0 is a plateau, a run capped long before
its plateau is not."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from codex_lab.lessons.l08_capstone import pipeline as cap
from codex_lab.lessons.l08_capstone import score_training as st
from codex_lab.lessons.l08_capstone.scorecard import design_config
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.stats import TRAINED, UNDER_TRAINED_STATE

DESIGN = {"sparse_layers": [], "pattern": "window:16", "n_kv_head": 1, "moe_layers": [1], "n_experts": 2, "top_k": 1,
          "balance": "coba"}


@pytest.fixture(scope="module")
def setup(small_corpus, small_tokenizer):
    torch.manual_seed(0)
    base = CodexModel(ModelConfig(vocab_size=small_tokenizer.vocab_size, d_model=32, n_layer=2, n_head=2,
                                  max_seq_len=64)).eval()
    sizes = dataclasses.replace(cap.default_sizes("standard"), batch_size=2, seq_len=32, val_batches=1)
    return base, {"candidate": design_config(base.cfg, DESIGN)}, small_tokenizer, small_corpus, sizes


def test_a_rate_of_zero_is_a_plateau_and_the_scores_are_read_there(setup, monkeypatch):
    base, cfgs, tok, corpus, sizes = setup
    monkeypatch.setattr(st, "SCORED_LEN", 32)  # the tiny model's context is 64 tokens
    budget = st.PlateauBudget(chunk=4, eval_every=1, max_steps=40, warmup=1, extend=0.5, files=30)
    frozen = dataclasses.replace(sizes, lr=0.0)  # no step changes anything: flat curves, a plateau at once
    losses, curves, first, log, states = st.train_to_plateau(base, cfgs, tok, corpus, frozen, (0, 1), budget=budget)
    assert set(states) == {"baseline", "candidate"} and all(s.state == TRAINED for s in states.values())
    assert all(len(c) == 2 for c in curves.values())  # one curve per seed
    # the first seed's models are the ones scored, at the stopping point; their loss is the recorded one
    for name, m in first.items():
        assert st.val_loss_at(m, tok, corpus, sizes) == pytest.approx(losses[name][0])
    assert "pretrain_steps" in log.rows["candidate"] and "confirmed" in log.rows["candidate"]["extension"]


def test_a_run_capped_before_its_plateau_is_not_trained(setup, monkeypatch):
    base, cfgs, tok, corpus, sizes = setup
    monkeypatch.setattr(st, "SCORED_LEN", 32)
    budget = st.PlateauBudget(chunk=4, eval_every=1, max_steps=8, warmup=1, extend=0.5, files=30)
    fast_lr = dataclasses.replace(sizes, lr=3e-3)  # a fresh conversion still falling fast after 8 steps
    _, _, _, _, states = st.train_to_plateau(base, cfgs, tok, corpus, fast_lr, (0, 1), budget=budget)
    assert states["candidate"].state != TRAINED, states["candidate"].describe()


def test_an_arm_the_extension_still_improves_is_demoted(setup, monkeypatch):
    """The budget-extension check overrules the rule: force the rule to say "trained" at once and
    let the extension show the arm still learning; the arm must come out under-trained."""
    base, cfgs, tok, corpus, sizes = setup
    monkeypatch.setattr(st, "SCORED_LEN", 32)
    import codex_lab.training.plateau as plateau

    real = plateau.training_state

    def eager(curves, **kw):  # the rule fooled: "trained" after the first chunk, whatever the curves say
        s = real(curves, **kw)
        return dataclasses.replace(s, state=TRAINED)

    monkeypatch.setattr(plateau, "training_state", eager)
    budget = st.PlateauBudget(chunk=4, eval_every=1, max_steps=40, warmup=1, extend=4.0, files=30)
    _, _, _, _, states = st.train_to_plateau(base, cfgs, tok, corpus, dataclasses.replace(sizes, lr=3e-3), (0, 1),
                                             budget=budget)
    assert states["candidate"].state == UNDER_TRAINED_STATE and "still learning" in states["candidate"].reason


def test_an_arm_whose_loss_only_rises_is_compared_untouched():
    """The shipped baseline, pre-trained further at the scorecard's rate, got worse from its first chunk
    (a measured run, 3 seeds: degrading): step 0 is its best checkpoint, so it is compared there. An arm
    that improved at any chunk end is not (the other way round)."""
    rising = [[(0.0, 2.00), (4.0, 2.05), (8.0, 2.10)], [(0.0, 2.02), (4.0, 2.06), (8.0, 2.12)]]
    assert st._best_at_start(rising) == pytest.approx((2.01, 2.11))
    dip = [[(0.0, 2.00), (4.0, 1.95), (8.0, 2.10)], [(0.0, 2.02), (4.0, 1.97), (8.0, 2.12)]]
    assert st._best_at_start(dip) is None
