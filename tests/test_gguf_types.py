"""codex-lab export as the ecosystem expects it: files written with the user's umask (0644 by default, as
``save_pretrained``'s own JSON files), and a GGUF that carries llama.cpp's FIM token-id keys and can be
written as F32, F16 and Q8_0, each read back with gguf-py's reader, dequantised, and run through the
course model's own forward against the original logits.

Tolerances, set once from the number formats (not from a run): each weight written as F16 is off by at
most its unit round-off, eps = 2**-11 relative; as Q8_0 by at most half a step of its block, eps =
1/254 of the block's largest magnitude (scale = max|w| / 127, round to nearest). A logit is a chain
of n_layer blocks of such products; we allow 2 * n_layer * eps * max|logit| (the error enters each
block's attention and MLP once: 2 per layer). F32 is bit-exact. Measured on the shipped model
(4 layers, |logit| <= 11.8): F16 4.7e-3 (bound 4.6e-2), Q8_0 0.12 (bound 0.37).
"""

from __future__ import annotations

import copy
import os
import stat

import pytest
import torch

from codex_lab.cli import main as cli
from codex_lab.data.tokenizer import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX
from codex_lab.training.checkpoint import load_pretrained

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed: pip install 'codex_lab[gguf]' "
                                          "(or pip install gguf)")

EPS = {"f32": 0.0, "f16": 2.0 ** -11, "q8_0": 1 / 254}
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


@pytest.fixture(scope="module")
def shipped():
    return load_pretrained("cpu")


@pytest.fixture(scope="module")
def exports(tmp_path_factory, shipped):
    from codex_lab.hf.gguf_export import export_gguf

    d = tmp_path_factory.mktemp("gguf")
    return {t: export_gguf(shipped.model, shipped.tokenizer, d / f"model-{t}.gguf", gguf_type=t) for t in EPS}


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.mark.parametrize("gguf_type", list(EPS))
def test_each_type_reads_back_and_computes_the_model(exports, shipped, gguf_type):
    from codex_lab.hf.gguf_export import read_gguf_state

    path, cfg = exports[gguf_type], shipped.model.cfg
    r = gguf.GGUFReader(str(path))
    types = {t.name: t.tensor_type for t in r.tensors}
    want2d = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
              "q8_0": gguf.GGMLQuantizationType.Q8_0}[gguf_type]
    for name, t in types.items():  # 2-D weights in the asked type, norms kept in F32 (llama.cpp's converter)
        assert t == (gguf.GGMLQuantizationType.F32 if name.endswith("norm.weight") else want2d), name
    ft = r.fields["general.file_type"].contents()
    assert ft == {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                  "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[gguf_type]
    model = copy.deepcopy(shipped.model).eval()
    sd = read_gguf_state(path, model)
    missing = model.load_state_dict(sd, strict=False).missing_keys
    assert missing == (["lm_head.weight"] if cfg.tie_embeddings else [])  # tied: shares token_embd
    x = torch.tensor([shipped.tokenizer.encode(PROMPT)])
    with torch.no_grad():
        ref, got = shipped.model(x).logits[0], model(x).logits[0]  # (T, V)
    err, scale = (got - ref).abs().max().item(), ref.abs().max().item()
    bound = 2 * cfg.n_layer * EPS[gguf_type] * scale
    print(f"\n{gguf_type}: {path.stat().st_size / 2**20:.1f} MiB, max |logit error| {err:.2e} (bound {bound:.2e})")
    assert err <= bound, (gguf_type, err, bound)
    if gguf_type != "f32":
        assert err > 0  # really rounded (a writer that kept F32 would pass the bound too)


def test_sizes_shrink_with_the_type(exports):
    size = {t: p.stat().st_size for t, p in exports.items()}
    # F16 is 2 of 4 bytes per weight; Q8_0 is 34 bytes per 32 weights (1.0625 of 4); the norms and header are small
    assert 0.45 < size["f16"] / size["f32"] < 0.55 and 0.24 < size["q8_0"] / size["f32"] < 0.30


def test_gguf_carries_llama_cpp_fim_keys(exports, shipped):
    r = gguf.GGUFReader(str(exports["f32"]))
    f = {k: v.contents() for k, v in r.fields.items()}
    vocab, keys = shipped.tokenizer, gguf.Keys.Tokenizer
    assert f[keys.FIM_PRE_ID] == vocab.token_id(FIM_PREFIX)
    assert f[keys.FIM_SUF_ID] == vocab.token_id(FIM_SUFFIX)
    assert f[keys.FIM_MID_ID] == vocab.token_id(FIM_MIDDLE)
    assert f[keys.EOT_ID] == f[keys.EOS_ID] == vocab.eot_id


def test_gguf_marks_where_generation_ends(exports, shipped):
    """The ids codex-lab ends a plain answer at (:func:`stop_token_ids`: end-of-text and the FIM sentinels)
    are CONTROL tokens in every GGUF type, end-of-text is eos and eot, and the sentinels are the FIM keys.
    (llama.cpp ends at eos / eot / eom / fim_pad, not at the fim_pre / suf / mid ids: see codex_lab.hf.gguf_export.)"""
    from codex_lab.hf.export import stop_token_ids

    tok, keys = shipped.tokenizer, gguf.Keys.Tokenizer
    stops = stop_token_ids(tok)
    assert stops == [tok.eot_id, tok.token_id(FIM_PREFIX), tok.token_id(FIM_SUFFIX), tok.token_id(FIM_MIDDLE)]
    plain = tok.encode("for i in range(10):\n    print(i)")
    for gguf_type, path in exports.items():
        f = {k: v.contents() for k, v in gguf.GGUFReader(str(path)).fields.items()}
        types = f[keys.TOKEN_TYPE]
        assert len(types) == shipped.model.cfg.vocab_size, gguf_type
        assert [types[i] for i in stops] == [gguf.TokenType.CONTROL] * len(stops), gguf_type
        assert all(types[i] == gguf.TokenType.NORMAL for i in plain), gguf_type  # ordinary text stays NORMAL
        assert f[keys.EOS_ID] == f[keys.EOT_ID] == stops[0], gguf_type
        assert [f[keys.FIM_PRE_ID], f[keys.FIM_SUF_ID], f[keys.FIM_MID_ID]] == stops[1:], gguf_type
        # two keys llama.cpp reads only into its end-of-generation set carry two sentinels, so it stops there
        assert (f[keys.EOM_ID], f[keys.FIM_PAD_ID]) == (tok.token_id(FIM_MIDDLE), tok.token_id(FIM_SUFFIX)), gguf_type
        assert keys.FIM_REP_ID not in f and keys.FIM_SEP_ID not in f, gguf_type  # llama.cpp writes these into /infill prompts


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_export_files_follow_the_umask(tmp_path, umask, capsys):
    old = os.umask(umask)
    try:
        out = tmp_path / "hf"
        assert cli(["export", str(out), "--gguf-type", "q8_0"]) == 0
    finally:
        os.umask(old)
    assert "q8_0" in capsys.readouterr().out
    files = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" in files and "model.gguf" in files
    for name in files:  # save_pretrained's JSON files, the weights and the GGUF alike
        assert mode(out / name) == 0o666 & ~umask, (name, oct(mode(out / name)))
    r = gguf.GGUFReader(str(out / "model.gguf"))
    assert r.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q8_0
