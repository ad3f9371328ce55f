"""``--hf DIR``: save_pretrained folders (Llama, Qwen2, Mixtral + a tokenizer built here) load
offline, tokenize like ``AutoTokenizer``, and decode greedily to HF's own ``generate`` tokens;
generate / eval / bench / serve accept the flag."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers  # the "hf" extra, part of ".[dev]": a missing install must fail, not skip
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from codex_lab.errors import InputError, MissingFileError
from codex_lab.hf.folder import load_hf_folder
from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.generate import generate_ids
from codex_lab.infer.sampling import SamplingParams

EOS = "<|endoftext|>"
TEXTS = ["def add(a, b):\n    return a + b\n", "class Point:\n    def __init__(self, x):\n        self.x = x\n",
         "for i in range(10):\n    print(i * i)\n", "import os\nprint(os.path.join('a', 'b'))\n"] * 4
VOCAB = 320  # model rows; the tokenizer below has fewer ids (like real checkpoints' padded vocabularies)


def _tokenizer() -> transformers.PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)


def _model(arch: str, eos: int) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, eos_token_id=eos,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if arch == "llama":
        m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
    elif arch == "qwen2":
        m = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw, tie_word_embeddings=True))
    else:
        m = transformers.MixtralForCausalLM(transformers.MixtralConfig(**kw, num_local_experts=4, num_experts_per_tok=2))
    with torch.no_grad():  # HF zero-initialises biases and uses near-uniform routers: make both matter
        for n, p in m.named_parameters():
            if n.endswith("bias") or n.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
    return m.eval()


@pytest.fixture(scope="module", params=["llama", "qwen2", "mixtral"])
def folder(request, tmp_path_factory) -> tuple[str, Path]:
    d = tmp_path_factory.mktemp(request.param)
    tok = _tokenizer()
    _model(request.param, tok.eos_token_id).save_pretrained(d)
    tok.save_pretrained(d)
    return request.param, d


def _hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                      eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_greedy_tokens_equal_hf_generate(folder) -> None:
    arch, d = folder
    assert any(d.glob("*.safetensors")) and (d / "tokenizer.json").is_file()
    ck = load_hf_folder(d)
    assert ck.meta["model_type"] == arch and ck.config.qkv_bias == (arch == "qwen2")
    assert bool(ck.config.moe_layers) == (arch == "mixtral")
    # the folder's tokenizer.json as HF reads it (AutoTokenizer in transformers 5 may rebuild a
    # model-specific pre-tokenizer from vocab + merges, which this toy tokenizer does not follow)
    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(d)
    text = "def add(a, b):\n    return"
    ids = ck.tokenizer.encode(text)
    assert ids == hf_tok(text).input_ids and ck.tokenizer.eot_id == hf_tok.eos_token_id
    assert ck.tokenizer.decode(ids) == text
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    want = _hf_greedy(hf, ids, 16)
    mine, _ = generate_ids(ck.model, ids, max_new_tokens=16)
    assert mine == want
    # the batched engine (what eval and serve use) gives the same tokens
    eng = Engine(ck.model, ck.tokenizer, max_batch_size=2, max_kv_tokens=256)
    eng.submit(ids, SamplingParams(max_tokens=16, ignore_eos=True))
    assert eng.run_until_done()[0].output_ids == want


def test_clear_errors_for_bad_folders(tmp_path: Path) -> None:
    with pytest.raises(MissingFileError, match="no Hugging Face folder"):
        load_hf_folder(tmp_path / "nope")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(MissingFileError, match="safetensors"):
        load_hf_folder(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(MissingFileError, match="tokenizer.json"):
        load_hf_folder(tmp_path)
    _tokenizer().save_pretrained(tmp_path)
    with pytest.raises(InputError, match="model_type='gpt2' is not supported|eos"):
        load_hf_folder(tmp_path)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "codex_lab.cli", *args], capture_output=True, text=True, timeout=600)


def test_commands_take_hf(folder) -> None:
    arch, d = folder
    if arch != "qwen2":
        pytest.skip("the command plumbing is the same for every architecture; checked once on Qwen2")
    r = _cli("generate", "--hf", str(d), "def add(a, b):", "--max-new-tokens", "5")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("def add(a, b):") and "tokens, finish_reason=" in r.stdout
    r = _cli("eval", "humaneval", "--hf", str(d), "--limit", "2", "--max-new-tokens", "8", "--json",
             "--no-progress", "--workers", "2")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    assert row["problems"] == 2 and row["source"] == f"hf:{d}" and row["pass_at_k"] == 0.0  # random weights
    r = _cli("generate", "--hf", str(d / "missing"), "x")
    assert r.returncode == 2 and "no Hugging Face folder" in r.stderr
    for cmd in (["serve", "--help"], ["bench", "inference", "--help"]):
        r = _cli(*cmd)
        assert r.returncode == 0 and "--hf" in r.stdout, cmd


def test_exported_folder_reads_back_with_its_stop_ids(tmp_path: Path) -> None:
    """export_hf_folder writes ``eos_token_id`` as a list (end-of-text first, then the FIM sentinels):
    ``--hf`` reads end-of-text from it and ends a plain answer where the checkpoint itself does,
    including the shipped model's 0-token answer to "for i in range(10):\\n    " (<|fim_suffix|> first)."""
    from codex_lab.hf.export import export_hf_folder, stop_token_ids
    from codex_lab.infer.generate import generate
    from codex_lab.training.checkpoint import load_pretrained

    ck = load_pretrained("cpu")
    back = load_hf_folder(export_hf_folder(ck.model, ck.tokenizer, tmp_path / "hf"))
    assert back.tokenizer.eot_id == ck.tokenizer.eot_id and back.tokenizer.pad_id == ck.tokenizer.pad_id
    assert stop_token_ids(back.tokenizer) == stop_token_ids(ck.tokenizer)
    for prompt in ("for i in range(10):\n    ", "def fibonacci(n):\n"):
        want = generate(ck.model, ck.tokenizer, prompt, SamplingParams(max_tokens=32))
        got = generate(back.model, back.tokenizer, prompt, SamplingParams(max_tokens=32))
        assert (got.ids, got.finish_reason) == (want.ids, want.finish_reason), prompt
    assert generate(back.model, back.tokenizer, "for i in range(10):\n    ", SamplingParams(max_tokens=32)).ids == []
