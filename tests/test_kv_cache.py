"""KV caches: cached generation == the plain generator, token for token (lesson 06).

Dense, sliding-window (rolling buffer) and GQA models; several prompt lengths and batch
sizes; multi-token prefill then decode; an uncached call after cached ones.
"""

import pytest
import torch

from codex_lab.infer.generate import generate_batch_cached, generate_ids, generate_ids_cached
from codex_lab.nn.accounting import kv_bytes_per_token
from codex_lab.nn.kv_cache import (
    DynamicKVCache, PagedKVPool, RollingWindowCache, StaticKVCache, make_static_caches,
)
from codex_lab.nn.model import CodexModel

from conftest import tiny_config


VARIANTS = {
    "dense": {},
    "window": {"attn_patterns": ["window:8", "dense"]},
    "gqa_window": {"n_kv_head": 2, "attn_patterns": ["dense", "window:5"]},
    "mqa": {"n_kv_head": 1},
}


def model_of(**kw) -> CodexModel:
    torch.manual_seed(0)
    return CodexModel(tiny_config(**kw)).eval()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_greedy_equals_uncached(variant):
    model = model_of(**VARIANTS[variant])
    g = torch.Generator().manual_seed(1)
    for T in (1, 7, 23):  # 23 > every window: the rolling buffer must wrap during prefill
        prompt = torch.randint(0, 512, (T,), generator=g).tolist()
        ref, _ = generate_ids(model, prompt, max_new_tokens=20)
        for kind in ("static", "dynamic"):
            got, reason = generate_ids_cached(model, prompt, max_new_tokens=20, cache=kind)
            assert got == ref, f"{variant}, prompt {T}, {kind} cache"
            assert reason == "length"
    # an uncached call after cached ones still gives the same tokens (no state leaks)
    assert generate_ids(model, prompt, max_new_tokens=20)[0] == ref


@pytest.mark.parametrize("batch", [1, 3])
def test_batched_cached_equals_one_at_a_time(batch):
    model = model_of(**VARIANTS["gqa_window"])
    prompts = torch.randint(0, 512, (batch, 11), generator=torch.Generator().manual_seed(2))
    out = generate_batch_cached(model, prompts, max_new_tokens=15)
    assert out.shape == (batch, 15)
    for i in range(batch):
        assert out[i].tolist() == generate_ids(model, prompts[i].tolist(), max_new_tokens=15)[0]


def test_cached_logits_match_full_forward():
    """Prefill 9 tokens, then decode 6 one at a time: each step's logits == the full forward's."""
    model = model_of(**VARIANTS["window"])
    seq = torch.randint(0, 512, (2, 15), generator=torch.Generator().manual_seed(3))
    full = model(seq).logits  # (2, 15, V)
    caches = make_static_caches(model.cfg, 2, 15)
    assert isinstance(caches[0], RollingWindowCache) and isinstance(caches[1], StaticKVCache)
    step = model(seq[:, :9], positions=torch.arange(9).expand(2, 9), caches=caches).logits
    got = [step]
    for t in range(9, 15):
        got.append(model(seq[:, t : t + 1], positions=torch.full((2, 1), t), caches=caches).logits)
    # fp32, logits O(1): same sums in another order agree to ~1e-6; a wrong key would differ by ~1e-1
    torch.testing.assert_close(torch.cat(got, dim=1), full, atol=1e-5, rtol=0)


def test_rolling_buffer_memory_and_wrap():
    c = RollingWindowCache(1, 2, 4, window=3)
    k = torch.arange(5, dtype=torch.float32).view(1, 1, 5, 1).expand(1, 2, 5, 4)
    k_all, _, pos = c.update(k, k, torch.arange(5)[None])
    assert k_all.shape[2] == 3 + 5 and pos[0, 3:].tolist() == [0, 1, 2, 3, 4]  # old buffer + new keys
    assert sorted(c.pos[0].tolist()) == [2, 3, 4]  # only the last window survives
    k_all, _, pos = c.update(k[:, :, :1] + 5, k[:, :, :1] + 5, torch.tensor([[5]]))
    assert sorted(pos[0].tolist()) == [3, 4, 5] and k_all.shape[2] == 3
    assert c.nbytes() == 2 * 1 * 2 * 3 * 4 * 4  # K and V, B * H_kv * window * D * fp32


def test_static_cache_truncate_and_errors():
    c = StaticKVCache(1, 1, 2, max_len=4)
    x = torch.ones(1, 1, 3, 2)
    c.update(x, x, torch.arange(3)[None])
    c.truncate(1)
    _, _, pos = c.update(x[:, :, :1], x[:, :, :1], torch.tensor([[1]]))
    assert pos[0].tolist() == [0, 1] and c.length == 2
    with pytest.raises(ValueError, match="max_len"):
        c.update(x, x, torch.tensor([[2, 3, 4]]))
    with pytest.raises(ValueError, match="batch_size"):
        c.update(torch.ones(2, 1, 1, 2), torch.ones(2, 1, 1, 2), torch.zeros(2, 1, dtype=torch.long))


def test_paged_pool_matches_dynamic_cache():
    """Keys written through block tables come back in position order, padding masked."""
    pool = PagedKVPool(1, 2, 4, n_blocks=6, block_size=2)
    blocks = [pool.allocate(2), pool.allocate(1)]  # rows own 2 and 1 blocks, not contiguous
    assert pool.n_free == 3 and sorted(sum(blocks, [])) == [0, 1, 2]
    tables = torch.tensor([blocks[0], blocks[1] * 2])  # (2, 2), row 1 padded with its own block
    k = torch.randn(2, 2, 2, 4)
    ref = DynamicKVCache()
    view = pool.views(tables)[0]
    ka, va, pos = view.update(k, k, torch.tensor([[0, 1], [0, 1]]))
    kr, _, _ = ref.update(k, k, torch.tensor([[0, 1], [0, 1]]))
    assert torch.equal(ka[:, :, :2], kr) and pos.tolist() == [[0, 1, -1, -1], [0, 1, -1, -1]]
    k3 = torch.randn(1, 2, 1, 4)
    ka, _, pos = pool.views(tables[:1])[0].update(k3, k3, torch.tensor([[2]]))
    assert torch.equal(ka[0, :, 2], k3[0, :, 0]) and pos.tolist() == [[0, 1, 2, -1]]
    pool.release(blocks[0])
    assert pool.n_free == 5
    with pytest.raises(MemoryError):
        pool.allocate(6)


def test_gqa_shrinks_cache_by_group_size():
    mha, gqa = tiny_config(), tiny_config(n_kv_head=1)
    # bytes/token = 2 * layers * H_kv * D * 4: MQA on 4 heads keeps 1/4
    assert kv_bytes_per_token(mha) == 2 * 2 * 4 * 16 * 4 == 4 * kv_bytes_per_token(gqa)
    assert sum(c.nbytes() for c in make_static_caches(gqa, 1, 10)) == 10 * kv_bytes_per_token(gqa)


def test_bad_inputs_raise_clear_errors():
    model = model_of()
    with pytest.raises(ValueError, match="empty"):
        generate_ids_cached(model, [], max_new_tokens=3)
    with pytest.raises(ValueError, match="max_seq_len"):
        generate_ids_cached(model, [1] * 120, max_new_tokens=20)
    with pytest.raises(ValueError, match="cache kind"):
        generate_ids_cached(model, [1], max_new_tokens=2, cache="paged")


def test_positions_default_to_the_cache_length():
    """model(idx, caches=...) without positions continues after what the cache holds."""
    model = model_of(**VARIANTS["window"])
    seq = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(4))
    caches = make_static_caches(model.cfg, 1, 12)
    model(seq[:, :10], caches=caches)
    assert all(c.length == 10 for c in caches)
    last = model(seq[:, 10:12], caches=caches).logits  # positions 10, 11 inferred
    # fp32 logits O(1): another summation order differs by ~1e-6
    torch.testing.assert_close(last, model(seq).logits[:, 10:], atol=1e-5, rtol=0)
