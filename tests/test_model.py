"""The model: reference attention == SDPA attention (MHA, GQA, MQA, windows, caches)."""

import pytest
import torch

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.kv_cache import make_dynamic_caches
from codex_lab.nn.attention import attention_reference, attention_sdpa
from codex_lab.nn.model import CodexModel

from conftest import tiny_config

# fp32 logits are O(1-10); both paths compute the same sums in a different order, so they
# agree to ~1e-6 relative; 1e-5 absolute leaves margin without hiding real bugs (a wrong
# mask or head mapping changes logits by ~1e-1).
ATOL = 1e-5


def pair(**kw):
    torch.manual_seed(0)
    a = CodexModel(tiny_config(**kw)).eval()
    b = CodexModel(tiny_config(attn_impl="reference", **kw)).eval()
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
@pytest.mark.parametrize("patterns", [None, ["window:5", "dense"]])
def test_reference_equals_sdpa(n_kv_head, patterns):
    a, b = pair(n_kv_head=n_kv_head, attn_patterns=patterns)
    idx = torch.randint(0, 512, (3, 37))
    torch.testing.assert_close(a(idx).logits, b(idx).logits, atol=ATOL, rtol=0)


def test_causality():
    a, _ = pair()
    idx = torch.randint(0, 512, (1, 20))
    changed = idx.clone()
    changed[0, 15] = (idx[0, 15] + 1) % 512
    la, lb = a(idx).logits, a(changed).logits
    torch.testing.assert_close(la[:, :15], lb[:, :15], atol=ATOL, rtol=0)
    assert (la[:, 15:] - lb[:, 15:]).abs().max() > 1e-3


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("n_kv_head", [4, 1])
def test_cache_prefill_then_decode_equals_full(impl, n_kv_head):
    torch.manual_seed(0)
    m = CodexModel(tiny_config(attn_impl=impl, n_kv_head=n_kv_head, attn_patterns=["window:6", "dense"])).eval()
    idx = torch.randint(0, 512, (2, 24))
    full = m(idx).logits
    caches = make_dynamic_caches(2)
    parts = [m(idx[:, :10], caches=caches).logits]  # multi-token prefill
    for t in range(10, 24):
        parts.append(m(idx[:, t : t + 1], caches=caches).logits)  # one-token decode
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=ATOL, rtol=0)
    torch.testing.assert_close(m(idx).logits, full, atol=0, rtol=0)  # uncached after cached


def test_fully_masked_rows_are_zero_not_nan():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    mask = torch.zeros(1, 1, 3, 5, dtype=torch.bool)
    mask[..., 1, :2] = True
    out = attention_reference(q, k, v, mask)
    assert not out.isnan().any() and out[:, :, 0].abs().sum() == 0
    torch.testing.assert_close(out[:, :, 1], attention_sdpa(q, k, v, mask)[:, :, 1], atol=ATOL, rtol=0)


def test_loss_ignores_minus_100_and_gradients_flow():
    torch.manual_seed(0)
    m = CodexModel(tiny_config())
    idx = torch.randint(0, 512, (2, 16))
    tgt = idx.clone()
    tgt[:, :8] = -100
    out = m(idx, tgt)
    manual = torch.nn.functional.cross_entropy(out.logits[:, 8:].reshape(-1, 512), idx[:, 8:].reshape(-1))
    torch.testing.assert_close(out.loss, manual)
    out.loss.backward()
    assert all(p.grad is not None for p in m.parameters())


def test_config_validation_and_roundtrip(tmp_path):
    with pytest.raises(ValueError, match="must divide"):
        ModelConfig(n_head=4, n_kv_head=3)
    with pytest.raises(ValueError, match="one pattern spec per layer"):
        ModelConfig(n_layer=2, attn_patterns=["dense"])
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({"bogus": 1})
    cfg = tiny_config(n_kv_head=2, attn_patterns=["window:8", "dense"])
    cfg.save(tmp_path / "c.json")
    assert ModelConfig.load(tmp_path / "c.json") == cfg
    with pytest.raises(ValueError, match="max_seq_len"):
        CodexModel(tiny_config())(torch.zeros(1, 200, dtype=torch.long))


def test_tied_embeddings_and_param_count():
    m = CodexModel(tiny_config())
    assert m.lm_head.weight is m.embed.weight
    assert m.num_params() - m.num_params(non_embedding=True) == 512 * 64


def test_is_causal_requires_square_scores():
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
    for fn in (attention_reference, attention_sdpa):
        with pytest.raises(ValueError, match="is_causal needs as many queries as keys"):
            fn(q, k, k, None, is_causal=True)
    torch.testing.assert_close(attention_reference(q, q, q, None, is_causal=True),
                               attention_sdpa(q, q, q, None, is_causal=True), atol=ATOL, rtol=0)
