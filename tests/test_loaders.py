"""Hostile checkpoint, tokenizer and training-text inputs: one clear line naming the file, never a traceback.

Every broken file below must give :class:`InputError` (a ValueError, so the CLI prints it on
one line and exits 2) whose message names the broken file; the same checkpoints passed to
``codex-lab generate``, ``serve`` and ``registry add`` must exit 2 with one line on stderr.
"""

from __future__ import annotations

import json
import struct
import tracemalloc
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import save_file

from codex_lab.data.batches import iter_token_chunks, tokenize_texts
from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.errors import InputError
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.training.checkpoint import load_checkpoint, save_checkpoint

W, C, T, M = "model.safetensors", "config.json", "tokenizer.json", "meta.json"


@pytest.fixture(scope="module")
def good(tmp_path_factory, small_tokenizer) -> Path:
    """A valid tiny checkpoint, copied by each test before it is broken."""
    torch.manual_seed(0)
    m = CodexModel(ModelConfig(vocab_size=small_tokenizer.vocab_size, d_model=32, n_layer=1, n_head=2,
                               max_seq_len=64)).eval()
    return save_checkpoint(tmp_path_factory.mktemp("good") / "ck", m, small_tokenizer, {"note": "good"})


def copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def edit_config(**changes) -> Callable[[Path], str]:
    def brk(ck: Path) -> str:
        cfg = json.loads((ck / C).read_text())
        for k, v in changes.items():
            if v is KeyError:
                cfg.pop(k)
            else:
                cfg[k] = v
        (ck / C).write_text(json.dumps(cfg))
        return C
    return brk


def write(name: str, data: bytes | Callable[[bytes], bytes]) -> Callable[[Path], str]:
    def brk(ck: Path) -> str:
        p = ck / name
        p.write_bytes(data(p.read_bytes()) if callable(data) else data)
        return name
    return brk


def weights_from(fn: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]) -> Callable[[Path], str]:
    def brk(ck: Path) -> str:
        from safetensors.torch import load_file
        save_file(fn(load_file(str(ck / W))), str(ck / W))
        return W
    return brk


def nan_weights(sd):
    k = next(iter(sd))
    sd[k] = sd[k].clone()
    sd[k].view(-1)[0] = float("nan")
    return sd


def fresh_tokenizer_without_specials(ck: Path) -> str:
    from tokenizers import Tokenizer, models
    Tokenizer(models.BPE()).save(str(ck / T))
    return T


# Each entry breaks one file of a good checkpoint and returns that file's name.
BREAKERS: dict[str, Callable[[Path], str]] = {
    "weights truncated": write(W, lambda b: b[: len(b) // 2]),
    "weights truncated in header": write(W, lambda b: b[:20]),
    "weights empty": write(W, b""),
    "weights garbage": write(W, bytes(range(256)) * 40),
    "weights header length 2**63": write(W, struct.pack("<Q", 1 << 63) + b"{}"),
    "weights header not JSON": write(W, struct.pack("<Q", 8) + b"nonsense"),
    "weights with NaN": weights_from(nan_weights),
    "weights missing a tensor": weights_from(lambda sd: dict(list(sd.items())[1:])),
    "weights with an extra tensor": weights_from(lambda sd: {**sd, "evil.weight": torch.zeros(2)}),
    "weights of another shape": weights_from(lambda sd: {k: torch.zeros(*v.shape[:-1], v.shape[-1] + 2)
                                                         if v.dim() == 2 else v for k, v in sd.items()}),
    "weights as integers": weights_from(lambda sd: {k: v.to(torch.int32) for k, v in sd.items()}),
    "config truncated": write(C, lambda b: b[: len(b) // 2]),
    "config garbage": write(C, b"\x00\xff" * 50),
    "config a list": write(C, b"[1, 2, 3]"),
    "config nested 100k deep": write(C, b"[" * 100_000 + b"]" * 100_000),
    "config 2 MB": write(C, b" " * (2 << 20) + b"{}"),
    "config string int": edit_config(n_layer="1"),
    "config bool int": edit_config(n_head=True),
    "config float int": edit_config(d_model=32.0),
    "config missing key": edit_config(d_model=KeyError),
    "config unknown key": edit_config(evil=1),
    "config negative": edit_config(n_head=-2),
    "config zero layers": edit_config(n_layer=0),
    "config huge vocab": edit_config(vocab_size=10**12),
    "config huge seq": edit_config(max_seq_len=10**9),
    "config NaN theta": write(C, lambda b: b.replace(b'"rope_theta": 10000.0', b'"rope_theta": NaN')),
    "config wrong list": edit_config(moe_layers=["a"]),
    "config inconsistent heads": edit_config(n_head=3),
    "config shape differs from weights": edit_config(d_model=64, n_head=2),
    "config bad attn_impl": edit_config(attn_impl="evil"),
    "config bad attention pattern": edit_config(attn_patterns=["blockstride:0:0"]),
    "config unknown attention pattern": edit_config(attn_patterns=["evil"]),
    "config negative capacity": edit_config(moe_capacity_factor=-1.0),
    "tokenizer garbage": write(T, b"\x00garbage\xff"),
    "tokenizer truncated": write(T, lambda b: b[: len(b) // 2]),
    "tokenizer empty object": write(T, b"{}"),
    "tokenizer without special tokens": fresh_tokenizer_without_specials,
    "tokenizer bigger than vocab": edit_config(vocab_size=300),  # 512-id tokenizer, 300-id model
    "meta garbage": write(M, b"{not json"),
    "meta a list": write(M, b"[]"),
}


@pytest.mark.parametrize("kind", sorted(BREAKERS))
def test_bad_checkpoint_file_is_one_line_naming_the_file(kind, good, tmp_path):
    ck = copy(good, tmp_path / "ck")
    name = BREAKERS[kind](ck)
    with pytest.raises(InputError) as ei:
        load_checkpoint(ck)
    msg = str(ei.value)
    assert "\n" not in msg and len(msg) < 600
    # the tokenizer/vocab mismatch is found while reading both files; it names both
    assert str(ck / name) in msg or (kind == "tokenizer bigger than vocab" and str(ck / T) in msg), msg


@pytest.mark.parametrize("missing", [W, C, T])
def test_missing_file_names_it(missing, good, tmp_path):
    ck = copy(good, tmp_path / "ck")
    (ck / missing).unlink()
    with pytest.raises(InputError, match=missing):
        load_checkpoint(ck)
    with pytest.raises(FileNotFoundError):  # still a FileNotFoundError for old callers
        load_checkpoint(tmp_path / "nope")


def test_special_files_in_place_of_checkpoint_files(good, tmp_path):
    import os
    ck = copy(good, tmp_path / "ck")
    (ck / C).unlink()
    os.mkfifo(ck / C)  # a FIFO must not hang the loader
    with pytest.raises(InputError, match=C):
        load_checkpoint(ck)
    (ck / C).unlink()
    (ck / C).symlink_to(ck / C)  # a symlink loop
    with pytest.raises(InputError, match=C):
        load_checkpoint(ck)


def test_good_checkpoint_still_loads(good):
    ck = load_checkpoint(good)
    assert ck.meta == {"note": "good"} and ck.config.d_model == 32


def test_tokenizer_load_garbage(tmp_path, small_tokenizer):
    p = tmp_path / "tokenizer.json"
    p.write_text('{"version": "1.0", "model": 7}')
    with pytest.raises(InputError, match="tokenizer.json"):
        CodeTokenizer.load(p)
    small_tokenizer.save(p)
    assert CodeTokenizer.load(p).vocab_size == small_tokenizer.vocab_size


@pytest.mark.parametrize("argv", [
    ["generate", "def f():", "--checkpoint", "{ck}"],
    ["serve", "--checkpoint", "{ck}"],
    ["registry", "add", "{ck}", "--root", "{root}"],
    ["finetune", "--checkpoint", "{ck}", "--steps", "1"],
])
@pytest.mark.parametrize("kind", ["weights truncated", "config string int", "tokenizer garbage", "missing"])
def test_cli_bad_checkpoint_exits_2_with_one_line(argv, kind, good, tmp_path, capsys):
    from codex_lab.cli import main

    ck = copy(good, tmp_path / "ck")
    if kind == "missing":
        (ck / W).unlink()
        name = W
    else:
        name = BREAKERS[kind](ck)
    args = [a.format(ck=ck, root=tmp_path / "reg") for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    # one error line (other lines may be notices such as "[codex-lab finetune] fast mode")
    errors = [line for line in err.splitlines() if " error: " in line]
    assert len(errors) == 1 and name in errors[0] and "Traceback" not in err, err


def test_streaming_tokenization_matches_the_plain_one(small_tokenizer, small_corpus):
    texts = small_corpus.texts()[:12]
    # reference: everything at once, as the loader did before streaming
    ref = [i for ids in small_tokenizer.encode_batch(texts) for i in [*ids, small_tokenizer.eot_id]]
    chunks = list(iter_token_chunks(small_tokenizer, texts, chunk_chars=5_000))
    assert len(chunks) > 1
    assert torch.cat(chunks).tolist() == ref
    assert tokenize_texts(small_tokenizer, iter(texts), chunk_chars=5_000).tolist() == ref
    assert tokenize_texts(small_tokenizer, []).numel() == 0


def test_streaming_tokenization_bounds_python_memory(small_tokenizer, small_corpus):
    """Python-object memory (tracemalloc sees lists of ints, not tensor storage) stays at one chunk's worth."""
    texts = (small_corpus.texts() * 4)[:120]
    n_chars = sum(map(len, texts))
    tracemalloc.start()
    try:
        tokens = tokenize_texts(small_tokenizer, texts, chunk_chars=20_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # encoding everything at once holds ~36 bytes per token in Python lists (8-byte pointer +
    # 28-byte int); chunks of 20k chars hold a 20k-char share of that. Allow 1/4 of the
    # all-at-once figure: the corpus here is > 20x one chunk, so streaming sits far below it.
    assert n_chars > 20 * 20_000
    assert peak < 0.25 * 36 * tokens.numel(), (peak, tokens.numel())


def test_tokenizer_training_sees_bounded_runs():
    """A 1 MB run without whitespace (minified line, base64 blob) is cut for the BPE trainer only."""
    from codex_lab.data.tokenizer import MAX_TRAIN_RUN, _bounded_runs

    code = "def f(x):\n    return x + 1  # " + "y" * MAX_TRAIN_RUN + "\n"
    assert _bounded_runs(code) is code  # real code is passed through untouched
    blob = "a = '" + "Zm9v" * 50_000 + "'\n"
    cut = _bounded_runs(blob)
    assert max(map(len, cut.split())) <= MAX_TRAIN_RUN
    assert cut.replace("\n", "") == blob.replace("\n", "")  # only line breaks were added


class _Payload:
    """Unpickling this runs ``os.system`` (the planted-payload case of issue 30)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


def test_resume_refuses_a_pickle_payload_in_train_state(tmp_path, capsys):
    """`codex-lab train --resume` with a pickle payload planted in train_state.pt: one line, payload not run."""
    from codex_lab.cli import main

    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--steps", "2", "--eval-every", "2", "--max-files", "40",
            "--batch-size", "2", "--seq-len", "32", "--vocab-size", "300", "--no-progress", "--device", "cpu"]
    assert main(argv) == 0
    state = out / "train_state.pt"
    good = torch.load(state, weights_only=True)  # what train writes loads with weights_only=True
    assert good["step"] == 2
    marker = tmp_path / "payload_ran"
    torch.save({**good, "history": _Payload(marker)}, state)
    capsys.readouterr()
    assert main([*argv[:4], "4", *argv[5:], "--resume"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if " error: " in line]
    assert not marker.exists(), "the pickle payload ran"
    assert len(errors) == 1 and str(state) in errors[0] and "without --resume" in errors[0] and "Traceback" not in err, err
    assert "system" in errors[0] and "weights_only" not in errors[0], err  # names what it asked for, no unsafe advice
    state.write_bytes(state.read_bytes()[:100])  # truncated: one line too
    assert main([*argv[:4], "4", *argv[5:], "--resume"]) == 2
    assert str(state) in capsys.readouterr().err


def _header_only_weights(ck: Path, cfg: ModelConfig) -> None:
    """Replace the weights by a header declaring every tensor of ``cfg``'s model (float32) and no data."""
    with torch.device("meta"):
        sd = CodexModel(cfg).state_dict()
    header, pos = {}, 0
    for k, t in sd.items():
        n = t.numel() * 4
        header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [pos, pos + n]}
        pos += n
    raw = json.dumps(header).encode()
    (ck / W).write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * max(0, 4096 - 8 - len(raw)))


def test_small_file_declaring_gigabytes_is_refused_before_allocation(good, tmp_path):
    """A ~4 KiB weights file whose header declares 2.5 GiB: one line naming it; the loader's peak
    memory stays far below 2.5 GiB (measured in a child process, which reports its own peak RSS)."""
    import subprocess
    import sys

    ck = copy(good, tmp_path / "ck")
    cfg = json.loads((ck / C).read_text())
    cfg.update(vocab_size=512, d_model=4096, n_layer=3, n_head=32, ffn_hidden=16384)
    (ck / C).write_text(json.dumps(cfg))
    mc = ModelConfig.from_dict(cfg)
    with torch.device("meta"):
        declared = sum(t.numel() for t in CodexModel(mc).state_dict().values()) * 4
    assert declared > 2.5 * 2**30
    _header_only_weights(ck, mc)
    assert (ck / W).stat().st_size < 64 << 10
    code = ("import resource, sys\nfrom codex_lab.training.checkpoint import load_checkpoint\n"
            "from codex_lab.errors import InputError\n"
            "try:\n    load_checkpoint(sys.argv[1])\nexcept InputError as e:\n    print('ERR', e)\n"
            "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)\n")
    r = subprocess.run([sys.executable, "-c", code, str(ck)], capture_output=True, text=True, timeout=300)
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert "ERR" in lines and str(ck / W) in lines["ERR"] and "bytes of data" in lines["ERR"], r.stdout + r.stderr
    # importing torch alone is ~0.3-0.5 GB of RSS; allocating the declared model would add 2.5 GiB
    print(f"\n{(ck / W).stat().st_size:,}-byte file declaring {declared / 2**30:.2f} GiB: refused, "
          f"loader peak RSS {int(lines['PEAK']) / 2**20:.0f} MiB")
    assert int(lines["PEAK"]) < 1.5 * 2**30, lines


@pytest.mark.parametrize("kind", ["range past the end", "range of the wrong length", "gap", "overlap", "trailing bytes"])
def test_safetensors_header_entries_must_match_the_file(good, tmp_path, kind):
    from codex_lab.data.weights_file import read_safetensors_header

    ck = copy(good, tmp_path / "ck")
    raw = (ck / W).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    first, second = header[names[0]], header[names[1]]
    if kind == "range past the end":
        last = header[names[-1]]
        last["data_offsets"] = [last["data_offsets"][0] + 4096, last["data_offsets"][1] + 4096]
    elif kind == "range of the wrong length":
        first["data_offsets"][1] += 4
    elif kind == "gap":
        data = data[: second["data_offsets"][0]] + b"\0" * 4 + data[second["data_offsets"][0] :]
        for k in names[1:]:
            header[k]["data_offsets"] = [o + 4 for o in header[k]["data_offsets"]]
    elif kind == "overlap":
        second["data_offsets"] = [o - 4 for o in second["data_offsets"]]
    else:
        data += b"\0" * 16
    h = json.dumps(header).encode()
    (ck / W).write_bytes(struct.pack("<Q", len(h)) + h + data)
    with pytest.raises(InputError) as ei:
        read_safetensors_header(ck / W)
    assert str(ck / W) in str(ei.value) and "\n" not in str(ei.value)
    with pytest.raises(InputError, match="model.safetensors"):
        load_checkpoint(ck)


def test_config_over_the_memory_budget_is_refused(good, tmp_path, monkeypatch):
    from codex_lab.data.weights_file import config_param_estimate

    ck = copy(good, tmp_path / "ck")
    need = 4 * config_param_estimate(load_checkpoint(good).config)
    monkeypatch.setenv("CODEX_LAB_MAX_LOAD_BYTES", str(need - 1))
    with pytest.raises(InputError) as ei:
        load_checkpoint(ck)
    assert str(ck / C) in str(ei.value) and "CODEX_LAB_MAX_LOAD_BYTES" in str(ei.value)
    monkeypatch.setenv("CODEX_LAB_MAX_LOAD_BYTES", str(need))
    assert load_checkpoint(ck).config.d_model == 32
    # the largest config the per-field limits allow is refused by the budget on any machine
    monkeypatch.delenv("CODEX_LAB_MAX_LOAD_BYTES")
    edit_config(vocab_size=1 << 22, d_model=1 << 12, n_layer=1024, n_head=32)(ck)
    with pytest.raises(InputError, match="memory budget"):
        load_checkpoint(ck)


@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": False, "n_kv_head": 2, "qkv_bias": True},
                                {"moe_layers": [1], "n_experts": 4, "moe_top_k": 2, "n_shared_experts": 1},
                                {"moe_layers": [0, 1], "moe_ffn_hidden": 48, "ffn_hidden": 100}])
def test_config_param_estimate_equals_the_model(kw):
    """The budget's parameter count (from the config alone) equals the built model's, exactly."""
    from codex_lab.data.weights_file import config_param_estimate

    cfg = ModelConfig(vocab_size=512, d_model=64, n_layer=2, n_head=4, max_seq_len=64, **kw)
    with torch.device("meta"):
        assert config_param_estimate(cfg) == CodexModel(cfg).num_params()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """A tiny Llama save_pretrained folder with a byte-level tokenizer."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    d = tmp_path_factory.mktemp("hf")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["def f(x):\n    return x\n"] * 4, trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=288, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                   eos_token_id=fast.eos_token_id)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)
    fast.save_pretrained(d)
    return d


@pytest.mark.parametrize("kind", ["4 KiB declaring 2.5 GiB", "config bigger than its weights", "config over the budget"])
def test_hf_folder_sizes_checked_before_allocation(hf_folder, tmp_path, kind, monkeypatch):
    from codex_lab.hf.folder import load_hf_folder

    d = copy(hf_folder, tmp_path / "hf")
    named = d / "model.safetensors"
    if kind == "4 KiB declaring 2.5 GiB":
        header = {"model.embed_tokens.weight": {"dtype": "F32", "shape": [655360, 1024],
                                                "data_offsets": [0, 655360 * 1024 * 4]}}
        raw = json.dumps(header).encode()
        named.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * (4096 - 8 - len(raw)))
    elif kind == "config bigger than its weights":
        cfg = json.loads((d / C).read_text())
        cfg.update(num_hidden_layers=400, hidden_size=4096, num_attention_heads=32, num_key_value_heads=32)
        (d / C).write_text(json.dumps(cfg))
        named = d / C
    else:
        monkeypatch.setenv("CODEX_LAB_MAX_LOAD_BYTES", "1000")
        named = d / C
    with pytest.raises(InputError) as ei:
        load_hf_folder(d)
    msg = str(ei.value)
    assert str(named) in msg and "\n" not in msg, msg
    monkeypatch.delenv("CODEX_LAB_MAX_LOAD_BYTES", raising=False)
    assert load_hf_folder(hf_folder).config.d_model == 32  # the untouched folder still loads


def _tokenizer_edit(small_tokenizer, tmp_path: Path, fn) -> Path:
    p = tmp_path / "tokenizer.json"
    small_tokenizer.save(p)
    d = json.loads(p.read_text())
    fn(d)
    p.write_text(json.dumps(d))
    return p


def _set(d, key, value):
    d[key] = value


# A Split pre-tokenizer with a catastrophically backtracking regex ((a+)+$ on "aaa...b"), a
# normalizer that doubles the text 40 times (2**40 x: the Rust library aborts the process), and
# ids past the vocabulary: none of them is handed to the Rust library, let alone run.
HOSTILE_TOKENIZERS = {
    "backtracking regex": lambda d: _set(d, "pre_tokenizer", {"type": "Split", "pattern": {"Regex": "(a+)+$"},
                                                              "behavior": "Isolated", "invert": False}),
    "regex inside a Sequence": lambda d: _set(d, "pre_tokenizer", {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(\\w+\\s*)+$"}, "behavior": "Isolated", "invert": False},
        d["pre_tokenizer"]]}),
    "multiplying normalizer": lambda d: _set(d, "normalizer", {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"String": "a"}, "content": "aa"}] * 40}),
    "vocab id past the vocabulary": lambda d: d["model"]["vocab"].update({"zz_evil": 99_999}),
    "vocab id duplicated": lambda d: d["model"]["vocab"].update({"zz_evil": 3}),
    "added token past the vocabulary": lambda d: d["added_tokens"].append(
        {"id": 70_000, "content": "<|evil|>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}),
    "padding to a million": lambda d: _set(d, "padding", {"strategy": {"Fixed": 1_000_000}, "direction": "Right",
                                                          "pad_to_multiple_of": None, "pad_id": 1, "pad_type_id": 0,
                                                          "pad_token": "<|pad|>"}),
    "WordPiece model": lambda d: d["model"].update(type="WordPiece"),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_TOKENIZERS))
def test_hostile_tokenizer_is_one_line_never_run(kind, small_tokenizer, good, tmp_path, capsys):
    p = _tokenizer_edit(small_tokenizer, tmp_path, HOSTILE_TOKENIZERS[kind])
    with pytest.raises(InputError) as ei:
        CodeTokenizer.load(p)
    msg = str(ei.value)
    assert "\n" not in msg and str(p) in msg and "CodeTokenizer.save" in msg, msg
    # the same file in a checkpoint, through the CLI: exit 2, one line naming it
    from codex_lab.cli import main

    ck = copy(good, tmp_path / "ck")
    (ck / T).write_bytes(p.read_bytes())
    assert main(["generate", "def f():", "--checkpoint", str(ck)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if " error: " in line]
    assert len(errors) == 1 and str(ck / T) in errors[0] and "Traceback" not in err, err


def test_decode_refuses_ids_outside_the_vocabulary(small_tokenizer):
    n = small_tokenizer.vocab_size
    ids = small_tokenizer.encode("def f(x):\n    return x\n")
    assert small_tokenizer.decode(ids) == "def f(x):\n    return x\n"
    assert small_tokenizer.decode([n - 1]) == small_tokenizer.tok.decode([n - 1])  # the last id is fine
    for bad in ([n], [*ids, n + 7], [-1], [10**12]):
        with pytest.raises(InputError, match=f"outside this tokenizer's vocabulary 0..{n - 1}"):
            small_tokenizer.decode(bad)


def test_hf_tokenizer_normalizer_growth_is_bounded(hf_folder, tmp_path):
    from codex_lab.hf.folder import load_tokenizer, normalizer_growth

    llama_like = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                      {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    assert normalizer_growth(llama_like) == 2 and normalizer_growth(None) == 1
    d = copy(hf_folder, tmp_path / "hf")
    tj = json.loads((d / T).read_text())
    tj["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"String": "a"}, "content": "aa"}] * 40}
    (d / T).write_text(json.dumps(tj))
    with pytest.raises(InputError) as ei:
        load_tokenizer(d)
    assert str(d / T) in str(ei.value) and "normalizer" in str(ei.value)
    tok = load_tokenizer(hf_folder)
    with pytest.raises(InputError):
        tok.decode([-1])
    assert tok.decode([tok.vocab_size + 3]) == ""  # a padding row of the model: no text


def test_corpus_never_reads_out_of_its_root(tmp_path):
    """*.py links to a file outside the corpus, to /proc/self/environ, and a folder link out:
    skipped unread and counted; links that stay inside the root are still read."""
    import os

    from codex_lab.data.corpus import load_corpus

    root, outside = tmp_path / "corpus", tmp_path / "secret"
    (root / "pkg").mkdir(parents=True)
    outside.mkdir()
    (outside / "key.py").write_text("API_KEY = 'sk-do-not-read'\n")
    (root / "good.py").write_text("x = 1\n")
    (root / "pkg" / "inner.py").write_text("y = 2\n")
    (root / "to_key.py").symlink_to(outside / "key.py")
    (root / "environ.py").symlink_to("/proc/self/environ")
    (root / "relative_escape.py").symlink_to("../secret/key.py")
    (root / "pkg" / "up.py").symlink_to("../../secret/key.py")
    (root / "inside_link.py").symlink_to("pkg/inner.py")  # stays in the root: read (then a duplicate)
    (root / "outdir").symlink_to(outside, target_is_directory=True)  # folder links are never walked
    os.environ["CODEX_LAB_TEST_SECRET"] = "environ-secret-value"
    try:
        c = load_corpus(root)
    finally:
        del os.environ["CODEX_LAB_TEST_SECRET"]
    text = "\n".join(c.texts())
    assert "sk-do-not-read" not in text and "environ-secret-value" not in text
    # inside_link.py comes first in sorted order; pkg/inner.py is then its exact duplicate
    assert sorted(f.path for f in c.files) == ["good.py", "inside_link.py"] and c.skipped_duplicates == 1
    assert sorted(c.skipped_outside) == ["environ.py", "pkg/up.py", "relative_escape.py", "to_key.py"]
    assert c.stats()["skipped_outside_root"] == 4
    # the corpus root itself may be a link (e.g. a symlinked checkout): files inside it still read
    (tmp_path / "alias").symlink_to(root, target_is_directory=True)
    assert sorted(f.path for f in load_corpus(tmp_path / "alias").files) == sorted(f.path for f in c.files)


QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def test_hf_tokenizer_backtracking_regex_is_refused_before_it_runs(hf_folder, tmp_path):
    """A --hf tokenizer.json whose Split regex repeats a group ((a+)+$: the Rust library panics
    with retry-limit-in-match on "aaa...b") is one line naming the file; the real models'
    pre-tokenizer patterns (Qwen2, Llama 3) pass."""
    from codex_lab.hf.folder import load_tokenizer, quantified_group

    assert quantified_group(QWEN2_SPLIT) is None and quantified_group(LLAMA3_SPLIT) is None
    for bad in ("(a+)+$", r"(\w+\s*)+$", "(a|aa)*$", "(ab){2,}"):
        assert quantified_group(bad), bad
    assert quantified_group(r"\(a+\)+") is None and quantified_group("[(]a+[)]+") is None  # literal parentheses
    d = copy(hf_folder, tmp_path / "hf")
    tj = json.loads((d / T).read_text())
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}, tj["pre_tokenizer"]]}
    (d / T).write_text(json.dumps(tj))
    with pytest.raises(InputError) as ei:
        load_tokenizer(d)
    assert str(d / T) in str(ei.value) and "(a+)+" in str(ei.value) and "\n" not in str(ei.value)
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2_SPLIT
    (d / T).write_text(json.dumps(tj))
    assert load_tokenizer(d).encode("def f(x): return x")  # a real model's pattern loads and runs


def test_train_state_zip_bomb_and_legacy_format_are_refused_before_loading(tmp_path):
    """A train_state.pt whose tensor record is deflated (4 MiB of zeros in a ~4 KB file) would
    make torch.load allocate what the record unpacks to (a few MB here, gigabytes from a file
    of megabytes); torch.save writes records stored, so a compressed one is refused. The
    legacy pre-zip format (allocates each storage at its declared size first) too."""
    import zipfile

    from codex_lab.training.checkpoint import load_train_state

    state = {"optimizer": {}, "step": 1, "history": [], "elapsed_s": 0.0, "generator": torch.zeros(4 << 20, dtype=torch.uint8)}
    plain = tmp_path / "plain.pt"
    torch.save(state, plain)
    assert load_train_state(plain)["step"] == 1  # what torch.save writes still loads
    bomb = tmp_path / "train_state.pt"
    with zipfile.ZipFile(plain) as zin, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    assert bomb.stat().st_size < 64 << 10
    with pytest.raises(InputError, match="compressed entry") as ei:
        load_train_state(bomb)
    assert str(bomb) in str(ei.value) and "\n" not in str(ei.value)
    legacy = tmp_path / "legacy.pt"
    torch.save(state, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(InputError, match="not a zip archive"):
        load_train_state(legacy)


# ---- the weight bytes a config implies against the bytes the weight files hold ------------------
# A config edited to declare 2.5 GiB (within CONFIG_LIMITS, and under the memory budget of a big
# machine), or a sparse weights file of 2.5 GiB that takes 4 KiB on disk, was allocated before its
# files were checked. Each loader now compares the two figures before it builds any model: the
# evidence below is that the model's constructor is never called (no timing, no RSS reading).

BIG_DIMS = {"d_model": 4096, "n_layer": 3, "n_head": 32, "ffn_hidden": 16384}  # ~3 GB of float32, within the limits


@pytest.fixture()
def built(monkeypatch) -> list[ModelConfig]:
    """The configs CodexModel is constructed with from now on (meta-device builds included). A real
    (not meta-device) build of over 1 GiB of weights raises instead of allocating them, so a loader
    that would build the bomb fails the test here rather than take the memory."""
    from codex_lab.data.weights_file import config_weight_numel

    calls: list[ModelConfig] = []
    real = CodexModel.__init__

    def recording(self, cfg, *a, **kw):
        calls.append(cfg)
        if torch.get_default_device().type != "meta" and 4 * config_weight_numel(cfg) > 1 << 30:
            raise AssertionError(f"the loader built a model of {4 * config_weight_numel(cfg):,} bytes of weights")
        real(self, cfg, *a, **kw)

    monkeypatch.setattr(CodexModel, "__init__", recording)
    return calls


@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": False, "n_kv_head": 2, "qkv_bias": True},
                                {"moe_layers": [1], "n_experts": 4, "moe_top_k": 2, "n_shared_experts": 1},
                                {"moe_layers": [0, 1], "moe_router_bias": True, "moe_ffn_hidden": 48}])
def test_config_weight_numel_equals_what_a_checkpoint_stores(kw):
    """The exact comparison's count (from the config alone) equals the values save_model writes:
    parameters (tied ones once) and persistent buffers (each MoE layer's expert_bias)."""
    from codex_lab.data.weights_file import config_weight_numel

    cfg = ModelConfig(vocab_size=512, d_model=64, n_layer=2, n_head=4, max_seq_len=64, **kw)
    with torch.device("meta"):
        stored = {id(t): t.numel() for t in CodexModel(cfg).state_dict(keep_vars=True).values()}
    assert config_weight_numel(cfg) == sum(stored.values())


def _sparse_file(path: Path, head: bytes, size: int) -> None:
    """``head`` then holes up to ``size`` bytes: the file reads as ``size`` bytes, takes ~4 KiB on disk."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)


def _skip_without_holes(path: Path) -> None:
    from codex_lab.data.weights_file import bytes_on_disk

    if bytes_on_disk(path) * 2 >= path.stat().st_size:
        pytest.skip(f"the filesystem of {path.parent} keeps no sparse files (or cannot report holes)")


def test_config_declaring_more_weights_than_its_files_is_refused_before_any_model_is_built(
        good, tmp_path, monkeypatch, built):
    from codex_lab.data.weights_file import config_weight_numel, read_safetensors_header, header_bytes

    monkeypatch.setenv("CODEX_LAB_MAX_LOAD_BYTES", str(1 << 50))  # the budget admits it: this check must not
    ck = copy(good, tmp_path / "ck")
    edit_config(**BIG_DIMS)(ck)
    declared = 4 * config_weight_numel(load_config_of(ck))
    held = header_bytes(read_safetensors_header(ck / W))
    assert declared > 2.5 * 2**30 and held < 1 << 20
    with pytest.raises(InputError) as ei:
        load_checkpoint(ck)
    msg = str(ei.value)
    assert f"the config declares {declared:,} bytes of weights, " in msg and f"the files hold {held:,} " in msg, msg
    assert str(ck / C) in msg and str(ck / W) in msg and "re-save the checkpoint" in msg and "\n" not in msg, msg
    assert built == [], "the model (even a meta-device one) was built before the sizes were compared"
    # the counterfactual: the unedited checkpoint loads, and is built once (on the meta device, then for real)
    assert load_checkpoint(good).config.d_model == 32 and len(built) == 2


def load_config_of(ck: Path) -> ModelConfig:
    from codex_lab.training.checkpoint import load_config

    return load_config(ck / C)


def test_sparse_weights_file_of_gigabytes_is_refused_before_any_model_is_built(good, tmp_path, monkeypatch, built):
    """The red team's folder: config and header agree on 2.9 GB, the file is that long, but sparse."""
    from codex_lab.data.weights_file import bytes_on_disk

    monkeypatch.setenv("CODEX_LAB_MAX_LOAD_BYTES", str(1 << 50))
    ck = copy(good, tmp_path / "ck")
    edit_config(**BIG_DIMS)(ck)
    cfg = load_config_of(ck)
    with torch.device("meta"):
        model = CodexModel(cfg)
    header, pos = {}, 0
    for k, t in model.state_dict().items():
        if k == "lm_head.weight":  # tied to embed.weight: stored once, as save_model does
            continue
        header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [pos, pos + t.numel() * 4]}
        pos += t.numel() * 4
    raw = json.dumps(header).encode()
    _sparse_file(ck / W, struct.pack("<Q", len(raw)) + raw, 8 + len(raw) + pos)
    _skip_without_holes(ck / W)
    built.clear()
    with pytest.raises(InputError) as ei:
        load_checkpoint(ck)
    msg = str(ei.value)
    on_disk = bytes_on_disk(ck / W)
    print(f"\n{(ck / W).stat().st_size:,}-byte sparse file ({on_disk:,} bytes on disk): {msg}")
    assert f"the config declares {pos:,} bytes of weights, the files hold {on_disk:,} on disk" in msg, msg
    assert "sparse" in msg and str(ck / W) in msg and "\n" not in msg, msg
    assert built == []
    assert load_checkpoint(good).config.d_model == 32


@pytest.mark.parametrize("loader", ["fine-tuned weights", "draft"])
def test_shipped_side_loaders_refuse_a_sparse_weights_file(tmp_path, loader, built):
    """load_codebench2_tuned(folder=...) and load_draft(target, path) read a user-given folder:
    its weights file is compared with the model they build it for before a tensor is read."""
    import shutil

    from safetensors.torch import load_file

    from codex_lab.lessons.l06_inference.draft import DRAFT_DIR, load_draft
    from codex_lab.training.checkpoint import load_codebench2_tuned, load_pretrained, tuned_path

    tuned = loader == "fine-tuned weights"
    src, name = (tuned_path(), "model_f16.safetensors") if tuned else (DRAFT_DIR, "draft.safetensors")
    d = tmp_path / "w"
    shutil.copytree(src, d)
    raw = (d / name).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    _sparse_file(d / name, raw[: 8 + n], len(raw))  # the same header, the data all holes
    _skip_without_holes(d / name)
    target = load_pretrained().model
    read: list[str] = []
    import safetensors.torch as st

    def no_read(path, *a, **kw):
        read.append(str(path))
        return load_file(path, *a, **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(st, "load_file", no_read)
        built.clear()
        with pytest.raises(InputError) as ei:
            load_codebench2_tuned(folder=d) if loader == "fine-tuned weights" else load_draft(target, d)
    msg = str(ei.value)
    assert str(d / name) in msg and "the config declares" in msg and "on disk" in msg and "\n" not in msg, msg
    assert str(d / name) not in read  # refused from the header: no tensor of the file was read
    # only the shipped base model was built (the fine-tuned loader builds it first), never one for the file
    assert len(built) <= 2 and all(c.d_model == target.cfg.d_model for c in built)
    # the counterfactual: the shipped files load
    if loader == "fine-tuned weights":
        assert load_codebench2_tuned().config == target.cfg
    else:
        assert len(load_draft(target).layers) >= 1


def test_hf_folder_with_a_sparse_weights_file_is_refused_before_transformers_loads_it(hf_folder, tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    from codex_lab.hf.folder import hf_param_estimate, load_hf_folder

    d = copy(hf_folder, tmp_path / "hf")
    cfg = json.loads((d / C).read_text())
    cfg.update(num_hidden_layers=3, hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
               intermediate_size=16384)
    (d / C).write_text(json.dumps(cfg))
    n = hf_param_estimate(transformers.AutoConfig.from_pretrained(d, local_files_only=True))
    header = {"model.embed_tokens.weight": {"dtype": "BF16", "shape": [n], "data_offsets": [0, 2 * n]}}
    raw = json.dumps(header).encode()
    _sparse_file(d / "model.safetensors", struct.pack("<Q", len(raw)) + raw, 8 + len(raw) + 2 * n)
    _skip_without_holes(d / "model.safetensors")
    monkeypatch.setenv("CODEX_LAB_MAX_LOAD_BYTES", str(1 << 50))

    def never(*a, **kw):
        raise AssertionError("transformers was asked to load the folder")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    with pytest.raises(InputError) as ei:
        load_hf_folder(d, dtype=torch.bfloat16)
    msg = str(ei.value)
    assert f"the config declares {2 * n:,} bytes of weights" in msg and "on disk" in msg, msg
    assert str(d / C) in msg and str(d / "model.safetensors") in msg and "\n" not in msg, msg


def test_gguf_reader_compares_the_file_with_the_model_before_reading_a_tensor(small_tokenizer, tmp_path):
    pytest.importorskip("gguf")
    from codex_lab.hf.gguf_export import export_gguf, read_gguf_state

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=small_tokenizer.vocab_size, d_model=64, n_layer=2, n_head=4, max_seq_len=64)
    model = CodexModel(cfg).eval()
    path = export_gguf(model, small_tokenizer, tmp_path / "m.gguf")
    assert set(read_gguf_state(path, model)) >= {"embed.weight", "layers.1.ffn.down_proj.weight"}  # it reads back
    # another model's shape: refused from the header, naming both figures
    bigger = CodexModel(ModelConfig(vocab_size=small_tokenizer.vocab_size, d_model=64, n_layer=3, n_head=4,
                                    max_seq_len=64))
    with pytest.raises(InputError, match="the config declares .* bytes of weights, the files hold"):
        read_gguf_state(path, bigger)
    # the same header, the tensors' bytes holes: refused before one is dequantised
    import gguf

    start = gguf.GGUFReader(str(path)).data_offset
    raw = path.read_bytes()
    _sparse_file(path, raw[:start], len(raw))
    _skip_without_holes(path)
    with pytest.raises(InputError, match="on disk"):
        read_gguf_state(path, model)
