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
