"""codex_lab MoE <-> Hugging Face Mixtral on randomly initialised small configs (no download).

Both directions: an independent, randomly initialised HF block / model converted to
codex_lab must give the same outputs and the same greedy tokens, and a codex_lab model
exported to HF likewise.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import MixtralConfig, MixtralForCausalLM  # noqa: E402
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func  # noqa: E402

from codex_lab.nn.config import ModelConfig  # noqa: E402
from codex_lab.infer.generate import generate_ids  # noqa: E402
from codex_lab.hf.mixtral import (  # noqa: E402
    codex_config_from_mixtral,
    from_hf_mixtral,
    moe_from_hf_block,
    moe_to_hf_block,
    to_hf_mixtral,
)
from codex_lab.nn.model import CodexModel  # noqa: E402
from codex_lab.nn.moe import MoEFeedForward, load_balancing_loss, set_dispatch_impl  # noqa: E402

# fp32 outputs of O(1); HF's expert loop and codex_lab's dispatch add the same terms in
# a different order, so the repo's fp32 tolerance (1e-5, CONTRIBUTING.md) applies. A
# mapping error (gate/up swapped, wrong expert) gives differences of order 0.1-1.
ATOL = 1e-5

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, num_local_experts=6,
             num_experts_per_tok=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
             eos_token_id=None, bos_token_id=None, pad_token_id=None)


def _hf_model(**over: object) -> MixtralForCausalLM:
    torch.manual_seed(0)
    cfg = MixtralConfig(**{**SMALL, **over})
    m = MixtralForCausalLM(cfg)
    with torch.no_grad():  # std 0.02 routers give nearly uniform routing; make it decisive
        for layer in m.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    return m.eval()


def _hf_greedy(hf: MixtralForCausalLM, prompt: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                      pad_token_id=0, min_new_tokens=n)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("top_k,impl", [(1, "grouped"), (2, "grouped"), (3, "reference")])
def test_block_from_hf_equals(top_k: int, impl: str) -> None:
    hf_cfg = MixtralConfig(**{**SMALL, "num_experts_per_tok": top_k})
    hf_cfg._experts_implementation = "eager"
    torch.manual_seed(top_k)
    block = MixtralSparseMoeBlock(hf_cfg)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.1)
    block.eval()
    cfg = codex_config_from_mixtral(hf_cfg)
    moe = moe_from_hf_block(block, cfg)
    moe.impl = impl
    x = torch.randn(2, 11, 64)
    with torch.no_grad():
        ref = block(x)
        got = moe(x)
    assert ref.abs().max() > 0.1  # a real signal, not zeros
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    # same routing decision as HF's router
    _, _, hf_idx = block.gate(x.view(-1, 64))
    assert moe.last_routing is not None
    assert torch.equal(moe.last_routing.expert_idx, hf_idx)


@pytest.mark.parametrize("experts_impl", ["eager", "grouped_mm"])
def test_block_to_hf_equals(experts_impl: str) -> None:
    cfg = ModelConfig(vocab_size=128, d_model=64, n_layer=1, n_head=4, moe_layers=[0], n_experts=8, moe_top_k=2,
                      moe_ffn_hidden=80)
    torch.manual_seed(1)
    moe = MoEFeedForward(cfg)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.1)
    block = moe_to_hf_block(moe, cfg, experts_implementation=experts_impl)
    x = torch.randn(3, 9, 64)
    with torch.no_grad():
        torch.testing.assert_close(block(x), moe(x), atol=ATOL, rtol=0)


def test_load_balancing_loss_matches_hf_times_k() -> None:
    torch.manual_seed(2)
    logits = torch.randn(40, 6)
    probs = torch.softmax(logits, -1)
    idx = probs.topk(2, -1).indices
    hf = load_balancing_loss_func((logits,), num_experts=6, top_k=2)
    # HF sums the per-slot fractions (each slot's f sums to 1), i.e. k times ours
    torch.testing.assert_close(hf, 2 * load_balancing_loss(probs, idx))


@pytest.mark.parametrize("tied", [False, True])
def test_model_from_hf_equal_logits_and_greedy(tied: bool) -> None:
    hf = _hf_model(tie_word_embeddings=tied)
    ours = from_hf_mixtral(hf)
    assert ours.cfg.moe_layers == [0, 1] and ours.cfg.n_experts == 6 and ours.cfg.n_kv_head == 2
    x = torch.randint(0, 128, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(x).logits
        torch.testing.assert_close(ours(x).logits, ref, atol=ATOL, rtol=0)
        set_dispatch_impl(ours, "reference")
        torch.testing.assert_close(ours(x).logits, ref, atol=ATOL, rtol=0)
    prompt = [5, 17, 99, 3]
    assert generate_ids(ours, prompt, max_new_tokens=12)[0] == _hf_greedy(hf, prompt, 12)


def test_model_to_hf_equal_logits_and_greedy() -> None:
    cfg = ModelConfig(vocab_size=128, d_model=64, n_layer=2, n_head=4, n_kv_head=1, max_seq_len=128,
                      moe_layers=[0, 1], n_experts=4, moe_top_k=2, moe_ffn_hidden=64)
    torch.manual_seed(3)
    ours = CodexModel(cfg).eval()
    with torch.no_grad():
        for layer in ours.layers:
            layer.ffn.router.weight.normal_(0.0, 0.5)
    hf = to_hf_mixtral(ours)
    x = torch.randint(0, 128, (2, 25), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x).logits, atol=ATOL, rtol=0)
    # round trip gives the same weights back
    back = from_hf_mixtral(hf)
    for (name, a), b in zip(ours.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), name
    prompt = [1, 2, 3]
    assert generate_ids(ours, prompt, max_new_tokens=10)[0] == _hf_greedy(hf, prompt, 10)


def test_refusals_name_the_setting() -> None:
    base = dict(vocab_size=128, d_model=64, n_layer=2, n_head=4, n_experts=4, moe_top_k=2)
    with pytest.raises(ValueError, match="every Mixtral layer"):
        to_hf_mixtral(CodexModel(ModelConfig(**base, moe_layers=[1])))
    with pytest.raises(ValueError, match="shared experts"):
        to_hf_mixtral(CodexModel(ModelConfig(**base, moe_layers=[0, 1], n_shared_experts=1)))
    with pytest.raises(ValueError, match="dropless"):
        to_hf_mixtral(CodexModel(ModelConfig(**base, moe_layers=[0, 1], moe_capacity_factor=1.25)))
    with pytest.raises(ValueError, match="sliding_window"):
        codex_config_from_mixtral(MixtralConfig(**{**SMALL, "sliding_window": 16}))
    biased = CodexModel(ModelConfig(**base, moe_layers=[0, 1], moe_router_bias=True))
    biased.layers[0].ffn.expert_bias[0] = 0.1
    with pytest.raises(ValueError, match="selection bias"):
        to_hf_mixtral(biased)
