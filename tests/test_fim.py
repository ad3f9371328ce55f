"""Fill-in-the-middle data (codex_lab.data.fim): the transform only moves characters and adds
sentinels, its rates hold, PSM/SPM are exact, rate 0 is the plain stream, prompts match
training, and pre-training records the FIM contract in the checkpoint's meta."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from codex_lab.data.batches import tokenize_texts
from codex_lab.data.fim import (
    fim_document,
    fim_pieces,
    fim_prompt_ids,
    fim_segments,
    fim_split,
    fim_token_stream,
    fim_transform,
    line_chunks,
)
from codex_lab.data.tokenizer import EOT, FIM_MIDDLE as MID, FIM_PREFIX as PRE, FIM_SUFFIX as SUF
from codex_lab.training.checkpoint import load_checkpoint
from codex_lab.training.pretrain import preset_config, train

DOC = 'def add(a, b):\n    """Sum."""\n    return a + b\n\nprint(add(1, 2))\n'


def untransform(s: str) -> str:
    """The original document back from a PSM or SPM string (the reference inverse)."""
    if not s.startswith(PRE):
        assert SUF not in s and MID not in s
        return s
    if s.startswith(PRE + SUF):  # SPM: PRE SUF suffix MID prefix+middle
        suffix, rest = s[len(PRE + SUF):].split(MID)
        return rest + suffix
    prefix, rest = s[len(PRE):].split(SUF)  # PSM: PRE prefix SUF suffix MID middle
    suffix, middle = rest.split(MID)
    return prefix + middle + suffix


def test_psm_and_spm_formats_are_exact():
    assert fim_segments("ab", "cd", "ef", "psm") == [PRE, "ab", SUF, "ef", MID, "cd"]
    assert fim_segments("ab", "cd", "ef", "spm") == [PRE, SUF, "ef", MID, "ab", "cd"]
    assert fim_segments("", "cd", "", "psm") == [PRE, SUF, MID, "cd"]  # empty pieces are left out
    with pytest.raises(ValueError, match="unknown FIM format"):
        fim_segments("a", "b", "c", "pms")  # type: ignore[arg-type]


def test_transform_is_a_permutation_of_the_characters_plus_sentinels():
    rng = random.Random(1)
    seen = Counter()
    for i in range(300):
        text = DOC * (i % 3 + 1) + str(i)
        out = fim_transform(text, rng, rate=1.0)
        fmt = "spm" if out.startswith(PRE + SUF) else "psm"
        seen[fmt] += 1
        for tok in (PRE, SUF, MID):
            assert out.count(tok) == 1, (tok, out)
        stripped = out.replace(PRE, "").replace(SUF, "").replace(MID, "")
        assert Counter(stripped) == Counter(text)  # same characters, same counts
        assert untransform(out) == text  # and the exact document is recoverable
    assert seen["psm"] > 0 and seen["spm"] > 0


def test_split_points_are_uniform_characters():
    # two sorted uniform points on [0, n]: E[len(prefix)] = n/3, E[len(middle)] = n/3
    rng = random.Random(2)
    n, trials = 300, 6000
    text = "x" * n
    pre = [len(fim_split(text, rng)[0]) / n for _ in range(trials)]
    mid = [len(fim_split(text, rng)[1]) / n for _ in range(trials)]
    # min of two uniforms has sd sqrt(1/18) = 0.236; 5 standard errors of the mean is 0.015
    tol = 5 * math.sqrt(1 / 18) / math.sqrt(trials)
    assert abs(sum(pre) / trials - 1 / 3) < tol
    assert abs(sum(mid) / trials - 1 / 3) < tol
    assert fim_split("", rng) == ("", "", "")


@pytest.mark.parametrize("rate,spm_share", [(0.5, 0.5), (0.2, 0.9)])
def test_rates_hold_statistically(rate: float, spm_share: float):
    rng = random.Random(3)
    n = 5000
    outs = [fim_transform(DOC, rng, rate=rate, spm_share=spm_share) for _ in range(n)]
    fim = [o for o in outs if o.startswith(PRE)]
    spm = [o for o in fim if o.startswith(PRE + SUF)]
    # binomial proportions within 5 standard errors (a false alarm about once in 3 million runs)
    assert abs(len(fim) / n - rate) < 5 * math.sqrt(rate * (1 - rate) / n)
    assert abs(len(spm) / len(fim) - spm_share) < 5 * math.sqrt(spm_share * (1 - spm_share) / len(fim))


def test_rate_zero_is_identity_and_bad_rates_are_refused():
    rng = random.Random(4)
    assert all(fim_transform(DOC + str(i), rng, rate=0.0) == DOC + str(i) for i in range(50))
    assert fim_document("", rng, rate=1.0) == [PRE, SUF, MID]
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="fim rate must be in"):
            fim_transform(DOC, rng, rate=bad)
    with pytest.raises(ValueError, match="spm_share"):
        fim_transform(DOC, rng, rate=0.5, spm_share=2.0)


def test_line_chunks_rejoin_and_respect_the_limit():
    text = "".join(f"line {i} " + "y" * (i % 7) + "\n" for i in range(200)) + "x" * 120 + "\nend"
    chunks = line_chunks(text, 100)
    assert "".join(chunks) == text
    assert all(len(c) <= 100 or "\n" not in c.rstrip("\n") for c in chunks)  # only a single long line exceeds it
    assert len(chunks) > 10
    assert line_chunks("", 10) == [] and line_chunks("ab", 10) == ["ab"]
    with pytest.raises(ValueError, match="max_chars"):
        line_chunks("ab", 0)


def test_stream_rate_zero_equals_plain_tokens(small_corpus, small_tokenizer):
    texts = small_corpus.texts("train")[:15]
    plain = tokenize_texts(small_tokenizer, texts)
    for chunk_chars in (None, 500):
        assert torch.equal(fim_token_stream(small_tokenizer, texts, 0.0, chunk_chars=chunk_chars), plain)
    # several encoding groups give the same stream as one
    assert torch.equal(fim_token_stream(small_tokenizer, texts, 0.0, group_chars=1000), plain)


def test_stream_pieces_are_encoded_separately_and_round_trip(small_corpus, small_tokenizer):
    texts = small_corpus.texts("train")[:10]
    docs = list(fim_pieces(texts, 0.5, seed=7, chunk_chars=400))
    ids = fim_token_stream(small_tokenizer, texts, 0.5, seed=7, chunk_chars=400)
    # deterministic for a seed, and the decoded stream is the pieces' text
    assert small_tokenizer.decode(ids.tolist()) == "".join(p for d in docs for p in d)
    expected = [i for d in docs for p in d for i in small_tokenizer.encode(p)]
    assert ids.tolist() == expected
    # every document ends with end-of-text, and un-FIM-ing every example gives the document back
    for doc, pieces in zip(texts, docs):
        assert pieces[-1] == EOT
        text = "".join(pieces)
        parts = [untransform(p) for p in text.split(EOT) if p]
        assert "".join(parts) == doc
    n_fim = sum(p == PRE for d in docs for p in d)
    n_chunks = sum(len(line_chunks(t, 400)) for t in texts)
    assert 0.3 < n_fim / n_chunks < 0.7  # rate 0.5 over hundreds of chunks (5 standard errors is < 0.15)
    assert n_chunks > 150


def test_prompt_ids_match_training_layout(small_tokenizer):
    tok = small_tokenizer
    pre, suf, mid = tok.token_id(PRE), tok.token_id(SUF), tok.token_id(MID)
    p, s = "def f(x):\n    return ", "\n\nprint(f(2))\n"
    assert fim_prompt_ids(tok, p, s) == [pre, *tok.encode(p), suf, *tok.encode(s), mid]
    assert fim_prompt_ids(tok, p, s, "spm") == [pre, suf, *tok.encode(s), mid, *tok.encode(p)]
    # the PSM prompt is exactly the training example's ids up to and including <|fim_middle|>
    train_ids = [i for piece in fim_segments(p, "x * 2", s, "psm") for i in tok.encode(piece)]
    assert train_ids[: len(fim_prompt_ids(tok, p, s))] == fim_prompt_ids(tok, p, s)
    assert fim_prompt_ids(tok, "", "") == [pre, suf, mid]
    with pytest.raises(ValueError, match="special token"):
        fim_prompt_ids(tok, "x" + MID, "")
    with pytest.raises(ValueError, match="unknown FIM format"):
        fim_prompt_ids(tok, "a", "b", "xyz")  # type: ignore[arg-type]


def test_pretrain_records_fim_contract_and_warm_starts(tmp_path: Path):
    base = preset_config("tiny", mode="fast", out=str(tmp_path / "a"), steps=4, eval_every=4, max_files=20)
    src = load_checkpoint(train(base, progress=False).out)
    assert "fim_rate" not in src.meta  # a plain run does not claim FIM
    # lr 0: the warm-started run's weights must stay exactly the source's
    tc = preset_config("tiny", mode="fast", out=str(tmp_path / "b"), steps=2, eval_every=2, max_files=20, lr=0.0, min_lr=0.0,
                       fim_rate=0.5, init_from=str(src.path))
    ck = load_checkpoint(train(tc, progress=False).out)
    assert ck.meta["fim_rate"] == 0.5 and ck.meta["fim_format"] == "psm"
    for name, p in src.model.state_dict().items():
        assert torch.equal(p, ck.model.state_dict()[name]), name
    bad = preset_config("tiny", mode="fast", out=str(tmp_path / "c"), steps=1, max_files=20, d_model=32, init_from=str(src.path))
    with pytest.raises(ValueError, match="another model shape"):
        train(bad, progress=False)


def test_ship_script_rerecords_the_greedy_fixture(tmp_path: Path):
    import json
    import sys

    from codex_lab.infer.generate import generate_ids
    from codex_lab.training.checkpoint import load_pretrained, pretrained_path

    scripts = str(Path(__file__).resolve().parents[1] / "scripts")
    sys.path.insert(0, scripts)
    try:
        from ship_checkpoint import GREEDY_FIXTURE, record_greedy_fixture
    finally:
        sys.path.remove(scripts)
    fixture = tmp_path / "greedy.json"
    old = json.loads(GREEDY_FIXTURE.read_text())
    stale = {**old, "max_new_tokens": 3, "cases": [{**c, "new_ids": [0], "prompt_ids": [0]} for c in old["cases"][:2]]}
    fixture.write_text(json.dumps(stale))
    record_greedy_fixture(pretrained_path(), fixture, note="test")
    new = json.loads(fixture.read_text())
    assert new["note"] == "test" and new["max_new_tokens"] == 3 and len(new["cases"]) == 2
    ck = load_pretrained()
    for case in new["cases"]:  # what tests/test_greedy_fixture.py checks, on the re-recorded file
        assert case["prompt_ids"] == ck.tokenizer.encode(case["prompt"])
        with torch.no_grad():
            ids, reason = generate_ids(ck.model.eval(), case["prompt_ids"], max_new_tokens=3, temperature=0.0)
        assert (ids, reason) == (case["new_ids"], case["finish_reason"]) and len(ids) == 3
