"""Lesson 05's claim experiment on codebench: the arms, the equal token budget, the selection of
the other balancer by validation loss, and verdicts from the per-seed scores (a tiny model keeps
it to seconds; the notebook runs it on the shipped model)."""

from __future__ import annotations

import pytest
import torch

from codex_lab.evals import codebench as cb
from codex_lab.lessons.l05_multitask import experiments as ex
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.training.checkpoint import load_pretrained


@pytest.fixture(scope="module")
def tiny():
    tok = load_pretrained().tokenizer
    torch.manual_seed(0)
    return CodexModel(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layer=1, n_head=2, max_seq_len=256)), tok


def test_experiment_arms_budget_and_verdicts(tiny) -> None:
    model, tok = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    setup = ex.Setup(steps=8, batch_size=2, seeds=(0, 1), per_family=2, candidates=("task_token", "dwa"), val_per_task=2)
    problems = cb.load_problems(2)
    res = ex.run_experiment(model, tok, setup, problems=problems)
    # the base model is copied for every run, never trained in place
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert set(res.selection) == {"task_token", "dwa"} and res.other == min(res.selection, key=res.selection.get)
    assert list(res.scores) == ["single-task", "naive", "coba", res.other]
    for arm, per_seed in res.scores.items():
        assert len(per_seed) == 2 and all(set(s) == set(cb.FAMILIES) for s in per_seed), arm
        assert all(0.0 <= v <= 1.0 for s in per_seed for v in s.values())
    # equal token budget: every multi-task run made `steps` steps of `batch_size` examples
    assert all(len(r.steps) == setup.steps for rs in res.runs.values() for r in rs)
    assert res.runs["naive"][0].config.mix == "size" and res.runs["coba"][0].config.mix == "balancer"
    vs = res.verdicts("coba")
    assert [c.metric.split(":")[0] for c in vs] == [f"pass@1 {f}" for f in [*cb.FAMILIES, "all"]]
    assert all(c.verdict in ("holds", "fails", "not resolved") for c in vs)
    assert res.values("coba", "all") == [sum(s.values()) / 4 for s in res.scores["coba"]]
    assert "±" in res.table() and res.model is not None


def test_verdicts_follow_the_scores() -> None:
    """Hand-made scores: a clear gain holds, a clear loss fails, noise is not resolved."""
    res = ex.Results(ex.Setup(seeds=(0, 1, 2)))
    fams = cb.FAMILIES
    res.scores["single-task"] = [{f: 0.2 + 0.01 * i for f in fams} for i in range(3)]
    res.scores["coba"] = [{"completion": 0.6 + 0.01 * i, "bugfix": 0.0 + 0.01 * i, "testgen": [0.1, 0.5, 0.2][i],
                           "fim": 0.2 + 0.01 * i} for i in range(3)]
    v = {c.metric.split(":")[0].split()[-1]: c.verdict for c in res.verdicts("coba")}
    assert v["completion"] == "holds" and v["bugfix"] == "fails" and v["testgen"] == "not resolved"
