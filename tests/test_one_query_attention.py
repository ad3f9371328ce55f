"""FastDecoder's one-query attention (``one_query_attention``, what a compiled CPU decode step runs) against
SDPA, the reference it replaces: the same outputs, the same greedy tokens."""

import pytest
import torch
import torch.nn.functional as F

from codex_lab.infer.fast_decode import FastDecoder
from codex_lab.nn.attention import one_query_attention
from codex_lab.infer.generate import generate_ids_cached
from codex_lab.nn.model import CodexModel

from conftest import tiny_config


@pytest.mark.parametrize("h,hkv", [(4, 4), (4, 2), (6, 1)])
def test_one_query_attention_equals_sdpa(h: int, hkv: int) -> None:
    g = torch.Generator().manual_seed(h * 10 + hkv)
    B, L, D = 2, 23, 16
    q = torch.randn(B, h, 1, D, generator=g)
    k, v = torch.randn(B, hkv, L, D, generator=g), torch.randn(B, hkv, L, D, generator=g)
    # the slots up to position 14 are filled, and a window hides the oldest five
    slots = torch.arange(L)
    allowed = ((slots <= 14) & (slots > 4))[None]  # (1, L)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[None, None], enable_gqa=h != hkv)
    got = one_query_attention(q, k, v, allowed)
    assert got.shape == want.shape == (B, h, 1, D)
    # float32, the same sums in another order: a few units in the last place of O(1) values
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # a value behind a hidden slot changes nothing
    v2 = v.clone()
    v2[:, :, 20] += 100.0
    torch.testing.assert_close(one_query_attention(q, k, v2, allowed), got)


@pytest.mark.parametrize("h,hkv,per_row", [(4, 4, False), (4, 2, False), (6, 1, True)])
def test_a_few_queries_equal_sdpa_under_a_causal_mask(h: int, hkv: int, per_row: bool) -> None:
    """A speculative verify's T = 5 queries (positions 10-14) over the cache: each sees the filled
    slots up to its own position, so query t's output must not depend on a slot past it."""
    g = torch.Generator().manual_seed(h * 10 + hkv)
    B, T, L, D = 2, 5, 23, 16
    q = torch.randn(B, h, T, D, generator=g)
    k, v = torch.randn(B, hkv, L, D, generator=g), torch.randn(B, hkv, L, D, generator=g)
    pos, slots = torch.arange(10, 10 + T), torch.arange(L)
    allowed = slots[None, :] <= pos[:, None]  # (T, L): causal over the cache
    mask = allowed[None, None].expand(B, 1, T, L) if per_row else allowed  # (B, 1, T, L) or (T, L)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[None, None], enable_gqa=h != hkv)
    got = one_query_attention(q, k, v, mask)
    assert got.shape == want.shape == (B, h, T, D)
    # float32, the same sums in another order: a few units in the last place of O(1) values
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    v2 = v.clone()
    v2[:, :, 12] += 100.0  # slot 12: seen by the queries at 12-14, hidden from those at 10 and 11
    moved = (one_query_attention(q, k, v2, mask) - got).abs().amax(dim=(0, 1, 3))  # (T,)
    assert (moved[:2] == 0).all() and (moved[2:] > 1).all(), moved


@pytest.mark.parametrize("kw", [{}, {"n_kv_head": 2, "attn_patterns": ["window:6", "dense"]}])
def test_both_attentions_decode_the_cached_generators_tokens(kw) -> None:
    torch.manual_seed(1)
    model = CodexModel(tiny_config(vocab_size=300, **kw)).eval()
    ids = torch.randint(0, 300, (11,), generator=torch.Generator().manual_seed(4)).tolist()
    ref = generate_ids_cached(model, ids, max_new_tokens=18)[0]
    for attention in ("one_query", "sdpa"):
        dec = FastDecoder(model, max_len=40, compile=False, attention=attention)
        assert dec.attention == attention
        assert dec.generate(ids, 18)[0] == ref, attention


def test_auto_picks_one_query_when_compiling_on_a_cpu_and_a_bad_choice_is_refused(tiny_model) -> None:
    assert FastDecoder(tiny_model, max_len=16, backend="eager").attention == "one_query"
    assert FastDecoder(tiny_model, max_len=16, compile=False).attention == "sdpa"  # the eager reference
    with pytest.raises(ValueError, match="choose 'auto', 'sdpa' or 'one_query'"):
        FastDecoder(tiny_model, max_len=16, compile=False, attention="flash")


@pytest.mark.parametrize("kw", [{}, {"n_kv_head": 2, "attn_patterns": ["window:6", "dense"]}])
def test_the_paged_step_asks_for_one_query_attention_and_gets_sdpas_logits(kw, monkeypatch) -> None:
    """The serving engine's compiled CPU step reads a paged pool through views marked
    ``one_query``: rows of different lengths (a mask per row), the logits SDPA gives, and the
    one-query formula really ran (counted)."""
    import codex_lab.nn.model as model_mod
    from codex_lab.nn.kv_cache import PagedKVPool

    torch.manual_seed(2)
    model = CodexModel(tiny_config(vocab_size=300, **kw)).eval()
    cfg = model.cfg
    calls = []
    real = model_mod.one_query_attention
    monkeypatch.setattr(model_mod, "one_query_attention", lambda *a: calls.append(1) or real(*a))
    logits = {}
    for one_query in (False, True):
        pool = PagedKVPool(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, n_blocks=8, block_size=4)
        g = torch.Generator().manual_seed(7)
        # row 0 holds 9 tokens (blocks 0-2), row 1 holds 3 (block 3, padded with its own block)
        tables = torch.tensor([[0, 1, 2], [3, 3, 3]])
        for pos in range(9):  # one token per row per step, row 1 stops writing at position 2
            tok = torch.randint(0, 300, (2, 1), generator=g)
            p = torch.tensor([[pos], [min(pos, 2)]])
            with torch.no_grad():
                out = model(tok, positions=p, caches=pool.views(tables, one_query=one_query), last_only=True).logits
        logits[one_query] = out[:, -1]
    assert len(calls) == 9 * cfg.n_layer  # every layer of every step took the one-query path
    # float32, the same sums in another order: a few units in the last place of O(1) logits
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-5, atol=1e-5)
