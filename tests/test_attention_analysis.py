"""Attention maps captured from a model, and the distance statistics built on them."""

from __future__ import annotations

import pytest
import torch

from codex_lab.lessons.l01_attention_patterns.analysis import (
    attention_entropy,
    attention_maps,
    mass_by_distance,
    share_within,
    uniform_share_within,
)
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel

# fp32 probabilities summed over <= 40 keys
ATOL = 1e-5


def model(**kw) -> CodexModel:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=64, **kw)
    return CodexModel(cfg).eval()


def test_maps_reproduce_the_layer_output() -> None:
    m = model(attn_patterns=["dense", "window:5+strided:4"])
    ids = torch.randint(0, 50, (40,))
    maps = attention_maps(m, ids)
    assert maps.shape == (2, 4, 40, 40)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 4, 40), atol=ATOL, rtol=0)
    assert (maps.triu(1) == 0).all()  # causal
    allowed = m.layers[1].attn.pattern.mask(40)
    assert (maps[1][:, ~allowed] == 0).all()  # the sparse layer's pattern is respected
    # oracle: maps @ v -> o_proj equals the attention module's real output, layer by layer
    outs, vs = {}, {}
    hooks = []
    for li, layer in enumerate(m.layers):
        hooks.append(layer.attn.register_forward_hook(lambda mod, a, o, li=li: outs.__setitem__(li, o)))
        hooks.append(layer.attn.v_proj.register_forward_hook(lambda mod, a, o, li=li: vs.__setitem__(li, o)))
    with torch.no_grad():
        m(ids[None])
    for h in hooks:
        h.remove()
    for li, layer in enumerate(m.layers):
        att = layer.attn
        v = vs[li].view(1, 40, att.n_kv_head, att.head_dim).transpose(1, 2).repeat_interleave(2, dim=1)  # (1, H, T, hd)
        y = (maps[li][None] @ v).transpose(1, 2).reshape(1, 40, -1)
        torch.testing.assert_close(att.o_proj(y), outs[li], atol=ATOL, rtol=0)


def test_distance_statistics_on_known_maps() -> None:
    T = 12
    # layer 0: every query attends only to itself; layer 1: uniform over all causal keys
    diag = torch.eye(T)
    uni = torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]
    maps = torch.stack([diag[None], uni[None]])  # (2, 1, T, T)
    prof = mass_by_distance(maps)
    assert prof[0, 0, 0] == 1 and (prof[0, 0, 1:] == 0).all()
    # uniform: the weight at distance d averaged over queries i >= d is mean 1/(i+1)
    want = torch.tensor([float((1 / torch.arange(d + 1, T + 1, dtype=torch.float64)).mean()) for d in range(T)], dtype=torch.float64)
    torch.testing.assert_close(prof[1, 0].double(), want, atol=ATOL, rtol=0)
    s = share_within(maps, 4)
    assert s[0, 0] == pytest.approx(1.0)
    assert s[1, 0] == pytest.approx(uniform_share_within(T, 4), abs=ATOL)
    assert uniform_share_within(T, 4) == pytest.approx(sum(4 / (i + 1) for i in range(4, T)) / (T - 4))
    ent = attention_entropy(maps)
    assert ent[0, 0] == pytest.approx(0.0, abs=1e-6)
    assert ent[1, 0] == pytest.approx(float(torch.log(torch.arange(1, T + 1.0)).mean()), abs=ATOL)


def test_bad_inputs() -> None:
    m = model()
    with pytest.raises(ValueError, match="one sequence"):
        attention_maps(m, torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="longer snippet"):
        share_within(torch.ones(1, 1, 8, 8), 8)
    with pytest.raises(ValueError, match=r"\(L, H, T, T\)"):
        mass_by_distance(torch.ones(8, 8))


# ---------------------------------------------------------------- the window's cost in held-out loss


class _CharTok:
    """Characters as token ids (enough for heldout_snippets, which only encodes)."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 50 for c in text]


TEXTS = [f"def f{i}():\n" + "    x = 1\n" * (20 + i) for i in range(12)]


def test_windowed_copy_keeps_the_weights_and_equals_dense_when_the_window_covers_the_snippet() -> None:
    from codex_lab.lessons.l01_attention_patterns.analysis import snippet_losses, windowed

    m = model()
    ids = torch.randint(0, 50, (3, 41))
    w_all, w_4 = windowed(m, 40), windowed(m, 4)
    assert w_4.cfg.attn_patterns == ["window:4", "window:4"] and m.cfg.attn_patterns is None
    assert all(torch.equal(p, w_4.state_dict()[n]) for n, p in m.state_dict().items())
    dense = snippet_losses(m, ids, min_query=0)  # (3,)
    assert dense.shape == (3,)
    # a window of 40 keys over 40 queries is dense: same losses up to summation order (fp32 logits of O(1))
    torch.testing.assert_close(snippet_losses(w_all, ids, 0), dense, atol=1e-5, rtol=0)
    # queries 0..3 see the same 4 keys under window:4 and dense: scored alone they agree
    torch.testing.assert_close(snippet_losses(w_4, ids[:, :5], 0), snippet_losses(m, ids[:, :5], 0), atol=1e-5, rtol=0)
    # past the window they differ (an untrained model still reads its keys)
    assert (snippet_losses(w_4, ids, 10) - snippet_losses(m, ids, 10)).abs().max() > 1e-4
    with pytest.raises(ValueError, match="window"):
        windowed(m, 0)


def test_snippet_losses_average_only_the_queries_past_min_query() -> None:
    from codex_lab.lessons.l01_attention_patterns.analysis import snippet_losses

    m = model()
    ids = torch.randint(0, 50, (2, 21))
    with torch.no_grad():
        logits = m(ids[:, :-1]).logits  # (2, 20, V)
    # -log p(token i+1) for queries i >= 7, written out
    nll = -torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]  # (2, 20)
    torch.testing.assert_close(snippet_losses(m, ids, 7, batch_size=1), nll[:, 7:].mean(1), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="min_query"):
        snippet_losses(m, ids, 20)


def test_heldout_snippets_are_a_seeded_sample_starting_at_a_def() -> None:
    from codex_lab.lessons.l01_attention_patterns.analysis import heldout_snippets

    tok = _CharTok()
    a, b, c = (heldout_snippets(tok, TEXTS, 4, 30, seed=s) for s in (0, 0, 1))
    assert a.shape == (4, 30) and torch.equal(a, b)
    assert not torch.equal(a, c)  # another seed, another evaluation sample
    starts = {tuple(tok.encode(t[:30])) for t in TEXTS}
    assert all(tuple(row.tolist()) in starts for row in a)  # each snippet starts at the text's def
    with pytest.raises(ValueError, match="give a 5000-token snippet"):
        heldout_snippets(tok, TEXTS, 2, 5000, seed=0)


def test_window_losses_score_every_arm_on_the_same_snippets() -> None:
    from codex_lab.lessons.l01_attention_patterns.analysis import window_losses

    m = model()
    res = window_losses(m, _CharTok(), TEXTS, windows=(8, 64), n_snippets=3, length=40, seeds=[0, 1, 2], min_query=10)
    assert sorted(res) == ["dense", "window:64", "window:8"] and all(len(v) == 3 for v in res.values())
    for d, wide in zip(res["dense"], res["window:64"]):  # a 64-key window over 40 tokens is dense
        torch.testing.assert_close(wide, d, atol=1e-5, rtol=0)
    assert not torch.allclose(res["window:8"][0], res["dense"][0])
