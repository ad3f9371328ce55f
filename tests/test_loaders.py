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
