import pytest
import torch

from codex_lab.infer.generate import generate, generate_ids
from codex_lab.infer.sampling import sample_next, top_k_filter, top_p_filter
from codex_lab.infer.syntax import cut_function, function_prompts, parses


def test_top_k_and_top_p_filters():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0]])
    assert torch.isinf(top_k_filter(logits, 2)).tolist() == [[False, True, False, True]]
    probs = torch.softmax(logits, -1)[0]  # 0.64, 0.09, 0.24, 0.03
    kept = ~torch.isinf(top_p_filter(logits, 0.7))
    # smallest set reaching 0.7: {3.0 (0.64), 2.0 (0.24)}
    assert kept.tolist() == [[True, False, True, False]] and probs[0] < 0.7
    assert (~torch.isinf(top_p_filter(logits, 0.5))).sum() == 1  # top token always kept


def test_sampling_greedy_and_seeded():
    logits = torch.randn(4, 50)
    assert torch.equal(sample_next(logits), logits.argmax(-1))
    a = sample_next(logits, temperature=1.0, top_p=0.9, generator=torch.Generator().manual_seed(1))
    b = sample_next(logits, temperature=1.0, top_p=0.9, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    with pytest.raises(ValueError):
        sample_next(logits, temperature=-1)


def test_generate_greedy_matches_manual_argmax(tiny_model, small_tokenizer):
    ids, reason = generate_ids(tiny_model, [1, 2, 3], max_new_tokens=5)
    seq = [1, 2, 3]
    for _ in range(5):
        seq.append(int(tiny_model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert ids == seq[3:] and reason == "length"
    g = generate(tiny_model, small_tokenizer, "def f(", max_new_tokens=4, temperature=0.8, seed=7)
    assert g.ids == generate(tiny_model, small_tokenizer, "def f(", max_new_tokens=4, temperature=0.8, seed=7).ids
    with pytest.raises(ValueError, match="empty"):
        generate_ids(tiny_model, [], max_new_tokens=2)


def test_syntax_helpers():
    src = 'def add(a, b):\n    """Add."""\n    return a + b\n\ndef only_doc():\n    """Doc."""\n'
    assert function_prompts([src], 5) == ['def add(a, b):\n    """Add."""']
    assert cut_function("\n    return 1\n\nx = 2\n") == "\n    return 1\n\n"
    assert cut_function(" + 1\n    return y\ndef g(): pass\n") == " + 1\n    return y\n"
    assert parses("def f():\n    return 1\n") and not parses("def f(:\n")


def test_sampling_params_and_keywords_describe_the_same_generation(tiny_model):
    from codex_lab.infer.generate import generate_batch_cached, generate_ids, generate_ids_cached
    from codex_lab.infer.sampling import SamplingParams

    sp = SamplingParams(max_tokens=6, temperature=0.9, top_k=20, top_p=0.9, seed=3)
    by_params = generate_ids(tiny_model, [1, 2, 3], sp)
    assert by_params == generate_ids(tiny_model, [1, 2, 3], max_new_tokens=6, temperature=0.9, top_k=20, top_p=0.9, seed=3)
    # the one loop over a static cache gives the same tokens as the uncached reference
    assert generate_ids_cached(tiny_model, [1, 2, 3], sp) == by_params
    greedy = SamplingParams(max_tokens=5)
    batch = generate_batch_cached(tiny_model, torch.tensor([[1, 2, 3], [4, 5, 6]]), greedy, cache=None)
    assert batch[0].tolist() == generate_ids(tiny_model, [1, 2, 3], greedy)[0]


def test_generate_defaults_to_the_kv_cache_and_matches_the_reference_loop(tiny_model_and_tokenizer=None):
    """The package's generate() decodes with a KV cache by default (not the uncached reference
    loop) and gives the same greedy text as the reference."""
    import inspect

    import torch

    from codex_lab.data.tokenizer import train_tokenizer
    from codex_lab.infer.generate import generate
    from codex_lab.nn.config import ModelConfig
    from codex_lab.nn.model import CodexModel

    assert inspect.signature(generate).parameters["cache"].default == "static"
    tok = train_tokenizer(["def add(a, b):\n    return a + b\n" * 40], vocab_size=300)
    torch.manual_seed(0)
    model = CodexModel(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layer=2, n_head=2, max_seq_len=96)).eval()
    ref = generate(model, tok, "def add(a, b):", max_new_tokens=24, cache=None)
    got = generate(model, tok, "def add(a, b):", max_new_tokens=24)
    assert got.ids == ref.ids and got.text == ref.text and len(got.ids) > 0
