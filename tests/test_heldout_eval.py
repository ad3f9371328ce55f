"""Held-out comparison of checkpoints (``codex-lab eval heldout``) and training with a reused tokenizer."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from codex_lab.cli import main as cli_main
from codex_lab.data.batches import tokenize_texts
from codex_lab.data.corpus import load_corpus
from codex_lab.infer.syntax import function_prompts
from codex_lab.nn.model import CodexModel
from codex_lab.training.checkpoint import load_checkpoint, save_checkpoint
from codex_lab.training.evaluate import heldout_loss
from codex_lab.training.pretrain import preset_config, train

from conftest import tiny_config


def test_heldout_loss_scores_every_window_once():
    torch.manual_seed(0)
    m = CodexModel(tiny_config()).eval()
    tokens = torch.randint(0, 512, (1000,))
    loss, n = heldout_loss(m, tokens, seq_len=64, batch_size=3)  # 15 windows, last batch of 3 is full, ragged ones too
    n_win = (1000 - 1) // 64
    assert n == n_win * 64
    # the same sum, one window at a time, by hand
    per = []
    for w in range(n_win):
        x = tokens[w * 64 : w * 64 + 65]
        logits = m(x[None, :-1]).logits[0]  # (64, V)
        per.append(F.cross_entropy(logits, x[1:], reduction="sum"))
    # fp32 sums over ~900 tokens in a different order: relative error well under 1e-5
    assert loss == pytest.approx(float(sum(per)) / n, rel=1e-5)
    with pytest.raises(ValueError, match="need more than"):
        heldout_loss(m, tokens[:30], seq_len=64)


def test_train_with_a_reused_tokenizer_keeps_it_and_eval_heldout_compares(tmp_path: Path, small_tokenizer, capsys):
    tok_file = tmp_path / "given_tokenizer.json"
    small_tokenizer.save(tok_file)
    tc = preset_config("tiny", mode="fast", out=str(tmp_path / "run"), steps=4, eval_every=4, max_files=20,
                       tokenizer=str(tok_file), d_model=32, n_layer=1, n_head=2, seq_len=32, batch_size=2)
    r = train(tc, progress=False)
    ck = load_checkpoint(r.out)
    text = "def f(x):\n    return x + 1\n"
    assert ck.tokenizer.encode(text) == small_tokenizer.encode(text)
    assert ck.model.cfg.vocab_size == small_tokenizer.vocab_size

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, t in enumerate(load_corpus(max_files=120).texts()):
        (corpus / f"m{i}.py").write_text(t)
    rc = cli_main(["eval", "heldout", "--checkpoint", str(r.out), "--corpus", str(corpus), "--prompts", "2",
                   "--max-new-tokens", "8", "--seq-len", "32", "--json", "--device", "cpu"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    (row,) = rows
    val = load_corpus(corpus).texts("val")
    n_tok = tokenize_texts(ck.tokenizer, val).numel()
    assert row["tokens_scored"] == (n_tok - 1) // 32 * 32
    # bits/char = nats/token * tokens / chars / ln 2
    assert row["bits_per_char"] == pytest.approx(row["loss_nats_per_token"] * n_tok / sum(map(len, val)) / math.log(2))
    assert len(function_prompts(val, 2)) == 2  # the held-out files do hold top-level functions
    assert row["syntax_prompts"] == 2 and 0.0 <= row["syntax_validity"] <= 1.0
    assert not any(k.startswith("_") for k in row)  # per-window values stay out of the JSON

    # a damaged copy (loud noise on every weight: confident, wrong predictions) against the trained one
    from codex_lab.training.checkpoint import save_checkpoint

    dead = load_checkpoint(r.out)
    torch.manual_seed(0)
    with torch.no_grad():
        for p_ in dead.model.parameters():
            p_.add_(torch.randn_like(p_) * 2.0)
    save_checkpoint(tmp_path / "dead", dead.model, dead.tokenizer, dict(dead.meta))
    rc = cli_main(["eval", "heldout", "--checkpoint", str(tmp_path / "dead"), "--checkpoint", str(r.out),
                   "--corpus", str(corpus), "--prompts", "3", "--max-new-tokens", "8", "--seq-len", "32", "--device", "cpu"])
    assert rc == 0
    out = capsys.readouterr().out
    line = out.strip().splitlines()[-1]
    # the trained model's loss is far lower in every window: the paired interval is below 0
    assert line.startswith(f"{r.out} vs {tmp_path / 'dead'}: bits/char -") and "-> holds;" in line, out
    assert "paired prompts" in line, out


def test_paired_verdicts_on_known_numbers():
    from codex_lab.evals.heldout import paired_verdicts

    base = {"checkpoint": "a", "tokens_scored": 40, "_windows": [3.0, 3.2, 2.9, 3.1], "_bits_per_nat_token": 0.5,
            "_syntax_ok": [True, False, False, True, False, False]}
    new = {"checkpoint": "b", "tokens_scored": 40, "_windows": [2.9, 3.1, 2.8, 3.0], "_bits_per_nat_token": 0.5,
           "_syntax_ok": [True, True, False, True, False, False]}
    v = paired_verdicts(base, new)
    # every window exactly 0.1 nats/token lower: no spread at all, so no variance was measured and
    # the package gives no zero-width "holds" (codex_lab.stats)
    assert v["bits_per_char_diff"] == pytest.approx(-0.05) and v["bits_per_char_verdict"] == "not resolved"
    spread = dict(new, _windows=[2.88, 3.11, 2.79, 3.02])  # 0.08-0.12 lower per window: resolved
    vs = paired_verdicts(base, spread)
    assert vs["bits_per_char_diff"] == pytest.approx(-0.05) and vs["bits_per_char_verdict"] == "holds"
    # one prompt of six flips to valid: +1/6, but six paired prompts cannot resolve it
    assert v["syntax_diff"] == pytest.approx(1 / 6) and v["syntax_verdict"] == "not resolved"
    other_tok = dict(new, tokens_scored=44)
    assert paired_verdicts(base, other_tok)["bits_per_char_verdict"].startswith("not compared")
