"""Weight-only int8 (codex_lab.nn.int8): the fast kernel held to the plain dequantised path (by the
bound bfloat16 activations imply), the
codes held to the formula, and the fidelity verdicts shown to come out both ways."""

import pytest
import torch

from codex_lab.data.batches import tokenize_texts
from codex_lab.data.corpus import load_corpus
from codex_lab.infer.fast_decode import FastDecoder
from codex_lab.infer.generate import generate_ids_cached
from codex_lab.evals.quantized import int8_fidelity, tokens_kept, tokens_verdict
from codex_lab.stats import FAILS, HOLDS, NOT_RESOLVED
from codex_lab.nn.int8 import QMAX, Int8Linear, int8_weight_bytes, quantize_int8, quantize_rows
from codex_lab.nn.model import CodexModel
from codex_lab.training.checkpoint import load_pretrained

from conftest import tiny_config


def test_codes_follow_the_formula_and_bound_the_error() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(37, 53, generator=g)
    w[5] = 0.0  # an all-zero row: scale 1, codes 0
    codes, scale = quantize_rows(w)
    assert codes.dtype == torch.int8 and codes.shape == w.shape and scale.shape == (37,)
    assert int(codes.abs().max()) == QMAX and scale[5] == 1.0 and not codes[5].any()
    # each row's largest weight maps to +-127, and rounding moves a weight by at most half a step
    err = (codes.float() * scale[:, None] - w).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-7).all())


@pytest.mark.parametrize("bias", [False, True])
def test_the_int8_kernel_equals_the_dequantised_reference(bias: bool) -> None:
    torch.manual_seed(1)
    lin = torch.nn.Linear(64, 96, bias=bias)
    q = Int8Linear(lin)
    x = torch.randn(3, 5, 64)
    # the fast path rounds x, the scales and the output to bfloat16 (8 significant bits: relative
    # error <= 2^-9 each) and sums the products in float32. Each rounding moves y[o] by at most
    # 2^-9 * scale[o] * sum_i |x_i q[o, i]|, three of them 3 * 2^-9 < 2^-7 of that sum
    bound = 2.0 ** -7 * (x.abs() @ q.dequantized().abs().T)
    if bias:
        bound = bound + 2.0 ** -7 * lin.bias.detach().abs()  # the bias is added in float32 (no rounding)
    err = (q(x) - q.reference(x)).abs()
    assert bool((err <= bound).all()), float((err / bound).max())
    assert float(err.max()) > 0  # the bound is met by a path that really rounds (not the reference again)
    assert q(x).shape == (3, 5, 96)
    # float32 activations: the same int8 x float products summed in another order, float32
    # rounding of O(10) sums
    q32 = Int8Linear(lin, "float32")
    torch.testing.assert_close(q32(x), q32.reference(x), rtol=1e-5, atol=1e-5)
    # and close to the float layer it replaced: per-channel int8 rounding, relative ~1/254 per weight
    with torch.no_grad():
        for layer in (q, q32):
            assert float((layer(x) - lin(x)).abs().max()) < 0.05 * float(lin(x).abs().max())
    with pytest.raises(ValueError, match="choose one of"):
        Int8Linear(lin, "int4")


def test_quantize_int8_replaces_the_matmuls_and_leaves_the_model_alone() -> None:
    torch.manual_seed(2)
    model = CodexModel(tiny_config(vocab_size=300)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    qm, left = quantize_int8(model)
    assert left == []
    n_int8 = sum(isinstance(m, Int8Linear) for m in qm.modules())
    assert n_int8 == model.cfg.n_layer * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # int8 codes are a quarter of float32's bytes: the copy is smaller than the float model
    assert int8_weight_bytes(qm) < int8_weight_bytes(model)
    moe, left = quantize_int8(CodexModel(tiny_config(vocab_size=300, moe_layers=[1])).eval())
    assert left == ["layers.1.ffn"]  # an MoE feed-forward stays float, and says so


def test_fast_decoder_runs_the_int8_copy_with_its_cached_tokens() -> None:
    torch.manual_seed(3)
    model = CodexModel(tiny_config(vocab_size=300)).eval()
    qm, _ = quantize_int8(model)
    ids = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    ref = generate_ids_cached(qm, ids, max_new_tokens=12)[0]
    assert FastDecoder(qm, max_len=32, compile=False).generate(ids, 12)[0] == ref


def test_tokens_kept_counts_up_to_the_first_difference() -> None:
    assert tokens_kept([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert tokens_kept([1, 2], [1, 2]) == 2 and tokens_kept([5], [6]) == 0


def test_the_tokens_verdict_comes_out_each_way() -> None:
    """Against the 0.9 goal, paired by prompt: nearly everything kept on 40 prompts holds, about
    half kept fails, 0.86 kept with a wide spread (the shipped int8 copy's measured share) is not
    resolved, and all kept everywhere is not resolved either (no variance: never a zero-width holds)."""
    assert tokens_verdict([1.0] * 36 + [0.9, 0.95, 0.97, 0.98]).verdict == HOLDS
    assert tokens_verdict([0.5, 0.4, 0.6, 0.55] * 10).verdict == FAILS
    assert tokens_verdict([1.0] * 32 + [0.2, 0.4, 0.1, 0.3, 0.5, 0.2, 0.3, 0.1]).verdict == NOT_RESOLVED
    assert tokens_verdict([1.0] * 8).verdict == NOT_RESOLVED


@pytest.fixture(scope="module")
def shipped_and_heldout():
    ck = load_pretrained("cpu")
    texts = load_corpus().texts("val")[:6]
    tokens = tokenize_texts(ck.tokenizer, texts)[: 8 * 128 + 1]
    stream = tokenize_texts(ck.tokenizer, texts)
    prompts = [stream[i * 97:i * 97 + 24].tolist() for i in range(10)]  # 10 held-out prompts of 24 tokens
    return ck.model.eval(), tokens, prompts


def test_fidelity_holds_for_the_shipped_model_and_fails_for_perturbed_codes(shipped_and_heldout) -> None:
    """The held-out loss of the int8 copy holds at 0.01 nats/token; the counterfactual, a copy whose
    codes are perturbed (every code moved by up to +-16 steps), fails on loss and on tokens kept."""
    model, tokens, prompts = shipped_and_heldout
    qm, _ = quantize_int8(model)
    good = int8_fidelity(model, qm, tokens, prompts, seq_len=128, new_tokens=16)
    assert good["windows"] == 8 and good["prompts"] == 10
    assert good["loss_verdict"] == HOLDS, good
    # 10 prompts of 16 tokens do not settle the tokens criterion for the faithful copy (tokens_verdict's
    # own test shows it coming out each way); its share and interval are reported
    assert good["tokens_verdict"] != FAILS and good["tokens_kept_lo"] <= good["tokens_kept"] <= good["tokens_kept_hi"]
    bad, _ = quantize_int8(model)
    g = torch.Generator().manual_seed(0)
    for m in bad.modules():
        if isinstance(m, Int8Linear):
            noise = torch.randint(-16, 17, m.qweight.shape, generator=g, dtype=torch.int16)
            m.qweight.copy_((m.qweight.to(torch.int16) + noise).clamp(-QMAX, QMAX).to(torch.int8))
    worse = int8_fidelity(model, bad, tokens, prompts, seq_len=128, new_tokens=16)
    assert worse["loss_verdict"] == FAILS, worse
    assert worse["tokens_verdict"] == FAILS, worse
