"""Multi-task fine-tuning loop, per-task evaluation and the finetune command (lesson 05)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_config
from test_tasks import synth_files

from codex_lab.training.balancing import make_balancer
from codex_lab.training.checkpoint import save_checkpoint
from codex_lab.cli import main as cli_main
from codex_lab.training.finetune import FinetuneConfig, finetune
from codex_lab.nn.model import CodexModel
from codex_lab.infer.task_metrics import completion_parses, exact_match, overlap_f1, score_answers
from codex_lab.training.evaluate import task_losses
from codex_lab.data.task_batches import encode_tasks
from codex_lab.data.tasks import build_tasks

TASKS3 = ("completion", "bugfix", "testgen")


@pytest.fixture(scope="module")
def taskset():
    """The synthetic tasks with every example in both splits (the loop, not leakage, is tested here)."""
    ts = build_tasks(synth_files(), TASKS3, val_fraction=0.5, share={"bugfix": 1.0})
    for task, splits in ts.examples.items():
        pool = splits["train"] + splits["val"]
        ts.examples[task] = {"train": pool, "val": pool}
    return ts


def fresh_model(vocab: int) -> CodexModel:
    torch.manual_seed(0)
    return CodexModel(tiny_config(vocab_size=vocab, d_model=32, n_layer=1, n_head=2, max_seq_len=512))


def cfg(**kw) -> FinetuneConfig:
    base = dict(tasks=TASKS3, steps=4, batch_size=4, eval_every=2, val_per_task=4, max_len=500, lr=1e-3, mix="uniform")
    return FinetuneConfig(**{**base, **kw})


def test_weights_logged_every_step_and_runs_are_deterministic(taskset, small_tokenizer):
    r = finetune(fresh_model(small_tokenizer.vocab_size), small_tokenizer, taskset, cfg(balance="coba"), progress=False)
    assert len(r.steps) == 4 and [e["step"] for e in r.evals] == [0.0, 2.0, 4.0]
    for row in r.steps:
        w = [row[f"w_{t}"] for t in TASKS3]
        assert abs(sum(w) - 1) < 1e-6 and min(w) >= 0  # weights normalised over present tasks
        assert sum(row[f"n_{t}"] for t in TASKS3) == 4
    again = finetune(fresh_model(small_tokenizer.vocab_size), small_tokenizer, taskset, cfg(balance="coba"), progress=False)
    assert [s["loss"] for s in r.steps] == [s["loss"] for s in again.steps]
    assert torch.equal(r.final, again.final)
    assert "spread of relative gains" in r.table() and json.dumps(r.to_dict())


@pytest.mark.parametrize("balance,mix", [("coba", "balancer"), ("token", "size")])
def test_a_session_advanced_in_chunks_is_the_same_run(taskset, small_tokenizer, balance, mix):
    """advance(2) then advance(4) runs the same 6 steps as one finetune() of 6 steps: the same
    losses, evaluations and weights (model, optimiser, balancer and batch order carry over)."""
    from codex_lab.training.finetune import FinetuneSession

    one = fresh_model(small_tokenizer.vocab_size)
    r = finetune(one, small_tokenizer, taskset, cfg(balance=balance, mix=mix, steps=6), progress=False)
    two = fresh_model(small_tokenizer.vocab_size)
    s = FinetuneSession(two, small_tokenizer, taskset, cfg(balance=balance, mix=mix, steps=999))
    s.advance(2)
    s.advance(4)
    c = s.result()
    assert [x["loss"] for x in r.steps] == [x["loss"] for x in c.steps] and c.config.steps == 6
    assert [e["step"] for e in c.evals] == [0.0, 2.0, 4.0, 6.0] and torch.equal(r.final, c.final)
    assert all(torch.equal(a, b) for a, b in zip(one.state_dict().values(), two.state_dict().values()))
    with pytest.raises(ValueError, match="at least 1 step"):
        s.advance(0)


def test_balancer_mix_samples_tasks_by_the_convergence_weights(taskset, small_tokenizer):
    from codex_lab.training.balancing import ConvergenceBalancer

    bal = ConvergenceBalancer(3, floor=0.0)
    bal.current = torch.tensor([0.0, 0.0, 1.0])  # all probability on testgen
    bal.observe_val = lambda v: None  # keep the weights fixed for this test
    r = finetune(fresh_model(small_tokenizer.vocab_size), small_tokenizer, taskset, cfg(mix="balancer", steps=3), progress=False, balancer=bal)
    assert all(row["n_testgen"] == 4 for row in r.steps)
    assert torch.equal(make_balancer("token", 3).sampling_weights(), torch.full((3,), 1 / 3))


def test_training_lowers_validation_loss_and_uncertainty_learns(taskset, small_tokenizer):
    model = fresh_model(small_tokenizer.vocab_size)
    bal = make_balancer("uncertainty", len(TASKS3))
    r = finetune(model, small_tokenizer, taskset, cfg(balance="uncertainty", steps=6, lr=3e-3), progress=False, balancer=bal)
    # a random model starts near ln(vocab) = 6.2 nats; six steps at 3e-3 on repeated examples cut it
    assert float(r.final.mean()) < float(r.initial.mean())
    assert bal.log_var.abs().min() > 0  # the log-variances are trained with the model


def test_task_losses_match_a_plain_loop(taskset, small_tokenizer):
    model = fresh_model(small_tokenizer.vocab_size).eval().requires_grad_(False)
    val = encode_tasks(small_tokenizer, taskset.split("val"), TASKS3, 500)
    loss, acc = task_losses(model, val, TASKS3, pad_id=small_tokenizer.pad_id, batch_size=3)
    for k, t in enumerate(TASKS3):
        total, n = 0.0, 0
        for e in val[t]:  # one example at a time, no padding: the obviously correct path
            s = torch.tensor([e.prompt_ids + e.answer_ids])
            logits = model(s[:, :-1]).logits[0, len(e.prompt_ids) - 1 :]  # (A, V)
            total += float(torch.nn.functional.cross_entropy(logits, torch.tensor(e.answer_ids), reduction="sum"))
            n += len(e.answer_ids)
        # fp32 logits summed in a different order (padded batch vs one by one)
        assert abs(float(loss[k]) - total / n) < 1e-4, t
        assert 0.0 <= float(acc[k]) <= 1.0


def test_metrics(taskset):
    assert exact_match("  a = 1  \n", "a = 1") and not exact_match("a = 2", "a = 1")
    assert completion_parses("def f(x):\n", "    return x\n") and not completion_parses("def f(x):\n", "return (")
    assert overlap_f1("Clamp x into range", "clamp x into [lo, hi]") == pytest.approx(2 * 3 / 4 * 3 / 5 / (3 / 4 + 3 / 5))
    assert overlap_f1("", "abc") == 0.0
    tg = [e for s in taskset.examples["testgen"].values() for e in s]
    clamp = next(e for e in tg if e.func.endswith("::clamp"))
    m = score_answers([clamp, clamp, clamp], [clamp.answer, ">>> clamp(5, 0, 3)\n4\n", "no tests"])
    assert m["pass"] == pytest.approx(1 / 3) and m["exact"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="one task"):
        score_answers([clamp, taskset.examples["completion"]["train"][0]], ["", ""])


def test_bad_config_is_a_clear_error(taskset, small_tokenizer):
    with pytest.raises(ValueError, match="mix"):
        cfg(mix="random")
    with pytest.raises(ValueError, match="were not built"):
        finetune(fresh_model(small_tokenizer.vocab_size), small_tokenizer, taskset, cfg(tasks=("docstring",)), progress=False)
    with pytest.raises(ValueError, match="no train or validation example"):
        finetune(fresh_model(small_tokenizer.vocab_size), small_tokenizer, taskset, cfg(max_len=8), progress=False)


def test_finetune_command_end_to_end(tmp_path, small_tokenizer, capsys):
    corpus = tmp_path / "corpus"
    for f in synth_files():
        (corpus / f.path).parent.mkdir(parents=True, exist_ok=True)
        (corpus / f.path).write_text(f.text)
    save_checkpoint(tmp_path / "ck", fresh_model(small_tokenizer.vocab_size), small_tokenizer)
    argv = ["finetune", "--checkpoint", str(tmp_path / "ck"), "--corpus", str(corpus), "--tasks", "completion,testgen", "--val-fraction", "0.3",
            "--balance", "task_token", "--steps", "2", "--batch-size", "2", "--eval-every", "1", "--max-len", "500",
            "--generate", "1", "--out", str(tmp_path / "out"), "--no-progress", "--mix", "uniform"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "spread of relative gains" in out and "completion" in out
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(res["generation"]) == {"completion", "testgen"} and (tmp_path / "out" / "checkpoint" / "model.safetensors").is_file()
    assert cli_main(["finetune", "--checkpoint", str(tmp_path / "ck"), "--tasks", "poetry"]) == 2
