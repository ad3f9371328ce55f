"""codex_lab <-> Hugging Face transformers on randomly initialised Llama and Qwen2 models.

The tests build small HF models themselves (no download) and require equal logits and
identical greedy generations in both directions, plus clear refusals of configs that
codex_lab does not implement.
"""

from __future__ import annotations

import pytest
import torch
import transformers  # the "hf" extra, part of ".[dev]": a missing install must fail, not skip

from codex_lab.nn.config import ModelConfig
from codex_lab.infer.generate import generate_ids
from codex_lab.hf.llama import from_hf, hf_config_to_codex, to_hf
from codex_lab.nn.model import CodexModel

# fp32 logits of O(1): on CPU (torch 2.13, transformers 5.x) HF and codex_lab run the same
# ops and agree exactly (max |diff| measured 0.0); other backends may pick different
# reduction orders, so the repo's fp32 attention tolerance (1e-5, CONTRIBUTING.md) is used.
# A mapping error (a swapped or missing weight) gives differences of order 0.1-1.
ATOL = 1e-5

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6)


def _hf_model(arch: str, **over: object):
    torch.manual_seed(0)
    kw = {**SMALL, **over}
    if arch == "llama":
        cfg = transformers.LlamaConfig(**kw, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        m = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(**kw, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        m = transformers.Qwen2ForCausalLM(cfg)
        with torch.no_grad():  # HF initialises biases to zero; make them matter
            for n, p in m.named_parameters():
                if n.endswith("bias"):
                    p.normal_(0.0, 0.5)
    return m.eval()


def _hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                      pad_token_id=0, min_new_tokens=n)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch,tied", [("llama", False), ("llama", True), ("qwen2", True), ("qwen2", False)])
def test_from_hf_equal_logits_and_greedy(arch: str, tied: bool) -> None:
    hf = _hf_model(arch, tie_word_embeddings=tied)
    ours = from_hf(hf)
    assert ours.cfg.n_kv_head == 2 and ours.cfg.qkv_bias == (arch == "qwen2")
    assert ours.cfg.tie_embeddings == tied
    x = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(x).logits
        got = ours(x).logits
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    prompt = [5, 17, 99, 3]
    mine, _ = generate_ids(ours, prompt, max_new_tokens=12)
    assert mine == _hf_greedy(hf, prompt, 12)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_to_hf_equal_logits_and_greedy(qkv_bias: bool) -> None:
    torch.manual_seed(2)
    cfg = ModelConfig(vocab_size=128, d_model=64, n_layer=2, n_head=4, n_kv_head=1, max_seq_len=128,
                      qkv_bias=qkv_bias, tie_embeddings=not qkv_bias)
    ours = CodexModel(cfg).eval()
    if qkv_bias:
        with torch.no_grad():
            for n, p in ours.named_parameters():
                if n.endswith("bias"):
                    p.normal_(0.0, 0.5)
    hf = to_hf(ours)
    assert type(hf).__name__ == ("Qwen2ForCausalLM" if qkv_bias else "LlamaForCausalLM")
    x = torch.randint(0, 128, (3, 33), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x).logits, atol=ATOL, rtol=0)
    prompt = [1, 2, 3, 4, 5]
    mine, _ = generate_ids(ours, prompt, max_new_tokens=12)
    assert _hf_greedy(hf, prompt, 12) == mine
    # weights are copied, not shared: changing the export leaves the source alone
    with torch.no_grad():
        hf.model.norm.weight.add_(1.0)
    assert torch.equal(ours.norm.weight, torch.ones(64))


def test_round_trip_is_exact() -> None:
    torch.manual_seed(4)
    ours = CodexModel(ModelConfig(vocab_size=128, d_model=64, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=64)).eval()
    back = from_hf(to_hf(ours, arch="qwen2"))  # a bias-free model exported as Qwen2 (zero biases)
    got = back.state_dict()
    for name, p in ours.state_dict().items():
        assert torch.equal(p, got[name]), name
    assert all(torch.count_nonzero(p) == 0 for n, p in back.state_dict().items() if n.endswith("bias"))


@pytest.mark.parametrize(
    "arch,over,needle",
    [
        ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}, "rope_type='linear'"),
        ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                       "original_max_position_embeddings": 32}}, "rope_type='yarn'"),
        ("llama", {"attention_bias": True}, "attention_bias"),
        ("llama", {"mlp_bias": True}, "mlp_bias"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act"),
        ("llama", {"head_dim": 32}, "head_dim"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0}, "sliding"),
    ],
)
def test_unsupported_configs_are_refused(arch: str, over: dict, needle: str) -> None:
    kw = {**SMALL, **over}
    cfg = (transformers.LlamaConfig if arch == "llama" else transformers.Qwen2Config)(**kw)
    with pytest.raises(ValueError, match=needle.replace("[", r"\[")):
        hf_config_to_codex(cfg)


def test_other_architectures_and_exports_are_refused() -> None:
    mistral = transformers.MistralConfig(**SMALL)
    with pytest.raises(ValueError, match="model_type='mistral'"):
        hf_config_to_codex(mistral)
    sparse = CodexModel(ModelConfig(vocab_size=128, d_model=64, n_layer=2, n_head=4, max_seq_len=64,
                                    attn_patterns=["dense", "window:8"]))
    with pytest.raises(ValueError, match="sparse attention"):
        to_hf(sparse)
    biased = CodexModel(ModelConfig(vocab_size=128, d_model=64, n_layer=1, n_head=4, max_seq_len=64, qkv_bias=True))
    with pytest.raises(ValueError, match="arch='qwen2'"):
        to_hf(biased, arch="llama")


# Qwen2.5-Coder-0.5B's published config.json (shapes only; no weights are built)
QWEN25_CODER_05B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_real_qwen25_coder_config_maps_to_gqa() -> None:
    cfg = hf_config_to_codex(transformers.Qwen2Config(**QWEN25_CODER_05B), max_seq_len=4096)
    assert (cfg.n_layer, cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.group_size) == (24, 14, 2, 64, 7)
    assert (cfg.ffn_hidden, cfg.rope_theta, cfg.norm_eps, cfg.max_seq_len) == (4864, 1e6, 1e-6, 4096)
    assert cfg.qkv_bias and cfg.tie_embeddings


def test_transformers_4_style_config_is_read_and_refused() -> None:
    from types import SimpleNamespace

    old = dict(model_type="llama", hidden_act="silu", num_attention_heads=4, hidden_size=64, head_dim=None,
               attention_bias=False, mlp_bias=False, pretraining_tp=1, num_key_value_heads=2, vocab_size=128,
               num_hidden_layers=2, intermediate_size=96, max_position_embeddings=128, rms_norm_eps=1e-6,
               tie_word_embeddings=False, rope_theta=5e5, rope_scaling=None)
    assert hf_config_to_codex(SimpleNamespace(**old)).rope_theta == 5e5
    with pytest.raises(ValueError, match="rope_type='dynamic'"):
        hf_config_to_codex(SimpleNamespace(**{**old, "rope_scaling": {"type": "dynamic", "factor": 2.0}}))


def test_from_hf_dtype() -> None:
    hf = _hf_model("qwen2").to(torch.bfloat16)
    same = from_hf(hf)
    wide = from_hf(hf, dtype=torch.float32, max_seq_len=64)
    assert next(same.parameters()).dtype == torch.bfloat16 and next(wide.parameters()).dtype == torch.float32
    assert wide.cfg.max_seq_len == 64 and same.cfg.max_seq_len == SMALL["max_position_embeddings"]
    w = hf.model.layers[1].self_attn.k_proj.bias
    assert torch.equal(wide.layers[1].attn.k_proj.bias, w.float())  # bf16 -> fp32 is exact
