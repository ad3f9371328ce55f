"""Export a dense codex_lab model as a llama-architecture GGUF file (llama.cpp's format).

Written with the ``gguf`` package (``pip install codex_lab[gguf]``), the way llama.cpp's own
``convert_hf_to_gguf.py`` writes a Llama: metadata ``llama.*`` (context, widths, heads, RoPE
base, RMSNorm epsilon), the tokenizer as ``gpt2`` byte-level BPE with the GPT-2
pre-tokenizer (the course tokenizer's ``ByteLevel(use_regex=True)``), its tokens, merges and
control tokens (eos, pad and the reserved tokens), and the tensors ``token_embd``,
``blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up,
ffn_down}``, ``output_norm`` (and ``output`` when the embeddings are not tied: llama.cpp then
reuses ``token_embd``).

RoPE layout: codex_lab (like Hugging Face) rotates the two halves of each head; llama.cpp's
``llama`` rotates adjacent pairs. The q and k rows are reordered so both compute the same
thing (:func:`permute_rope`, as ``convert_hf_to_gguf.py`` does):
row ``(h, j, half)`` -> ``(h, 2j + half)`` within each head.

Fill-in-the-middle: the sentinels' ids are written under llama.cpp's keys
``tokenizer.ggml.fim_pre_token_id`` / ``fim_suf_token_id`` / ``fim_mid_token_id`` (and
``eot_token_id``), so llama.cpp's infill (``/infill``) finds them without a table of its own.

Where generation ends: every id of :func:`~codex_lab.data.fim.stop_token_ids` (end-of-text
and the FIM sentinels, where codex-lab ends a plain answer) is a CONTROL token, and
``eos_token_id`` / ``eot_token_id`` are end-of-text. llama.cpp ends generation at eos, eot,
eom, ``fim_pad`` / ``fim_rep`` / ``fim_sep`` and a fixed list of token texts (``<|endoftext|>``
among them), not at ``fim_pre`` / ``fim_suf`` / ``fim_mid``, and GGUF has no key for a list of
end ids. Two of those keys end generation and build no prompt (llama.cpp's server and tools
read ``eom`` and ``fim_pad`` only into that end set; ``fim_rep`` / ``fim_sep`` would be written
into ``/infill`` prompts): ``eom_token_id`` carries ``<|fim_middle|>`` and ``fim_pad_token_id``
``<|fim_suffix|>``, the two sentinels the shipped model was seen to open a plain answer with, so
llama.cpp stops where codex-lab does. ``<|fim_prefix|>`` has no key left: a llama.cpp run that
samples it outside FIM goes on (a control token, it shows no text), where codex-lab and the
exported Hugging Face folder stop.

Tensor types (``gguf_type``), as ``convert_hf_to_gguf.py --outtype`` writes them: ``f32``;
``f16`` (the 2-D weights in half precision, the 1-D norm weights kept in F32 as llama.cpp
does); ``q8_0`` (the 2-D weights in llama.cpp's Q8_0: blocks of 32 values sharing one F16
scale ``max|w| / 127``, each value an int8; a weight whose rows are not a multiple of 32 long
falls back to F16, norms stay F32). :func:`read_gguf_state` reads a file back (dequantised)
into the course model's state dict.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from codex_lab.data.tokenizer import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, SPECIAL_TOKENS, CodeTokenizer
from codex_lab.nn.model import CodexModel


def permute_rope(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """q/k projection rows (n_head * head_dim, d) from half-split RoPE order to adjacent pairs."""
    hd = w.shape[0] // n_head
    # (h, half, j, d) -> (h, j, half, d): row h*hd + half*hd/2 + j moves to h*hd + 2j + half
    return w.reshape(n_head, 2, hd // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


_LAYER_NAMES = {"attn_norm.weight": "attn_norm", "ffn_norm.weight": "ffn_norm", "attn.q_proj.weight": "attn_q",
                "attn.k_proj.weight": "attn_k", "attn.v_proj.weight": "attn_v", "attn.o_proj.weight": "attn_output",
                "ffn.gate_proj.weight": "ffn_gate", "ffn.up_proj.weight": "ffn_up", "ffn.down_proj.weight": "ffn_down"}


def gguf_tensors(model: CodexModel) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 array (q and k permuted for llama.cpp's RoPE)."""
    cfg = model.cfg
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["embed.weight"], "output_norm.weight": sd["norm.weight"]}
    if not cfg.tie_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    for i in range(cfg.n_layer):
        for ours, theirs in _LAYER_NAMES.items():
            w = sd[f"layers.{i}.{ours}"]
            if theirs == "attn_q":
                w = permute_rope(w, cfg.n_head)
            elif theirs == "attn_k":
                w = permute_rope(w, int(cfg.n_kv_head or cfg.n_head))
            out[f"blk.{i}.{theirs}.weight"] = w
    return {k: v.numpy().astype(np.float32) for k, v in out.items()}


GGUF_TYPES = ("f32", "f16", "q8_0")


def _encode(name: str, arr: np.ndarray, gguf_type: str) -> tuple[np.ndarray, Any]:
    """The array written for tensor ``name`` and its GGML type (None = the array's own dtype)."""
    import gguf

    if gguf_type == "f32" or arr.ndim < 2:  # norms stay F32 (llama.cpp's converter does the same)
        return arr.astype(np.float32), None
    if gguf_type == "q8_0" and arr.shape[-1] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0] == 0:
        return gguf.quants.quantize(arr.astype(np.float32), gguf.GGMLQuantizationType.Q8_0), \
            gguf.GGMLQuantizationType.Q8_0
    return arr.astype(np.float16), None


def read_gguf_state(path: str | Path, model: CodexModel) -> dict[str, torch.Tensor]:
    """The state dict of ``model``'s shape read back from a GGUF this module wrote: every tensor
    dequantised to float32 (gguf-py's reader and ``gguf.quants.dequantize``) and q / k
    un-permuted to codex_lab's RoPE layout. Load it with ``model.load_state_dict(..., strict=False)``.

    Before any tensor is read, the values the file declares must be the ``model``'s parameters
    and really on disk (:func:`~codex_lab.data.weights_file.check_weights_held`): a file
    declaring more, or a sparse one, is an InputError instead of an allocation of its size.
    """
    import gguf

    from codex_lab.data.weights_file import check_weights_held, config_param_estimate

    cfg = model.cfg
    r = gguf.GGUFReader(str(path))  # memory-maps the file: the header is parsed, no tensor is read yet
    sizes = (sum(int(t.n_elements) for t in r.tensors), sum(int(t.n_bytes) for t in r.tensors))
    check_weights_held(Path(path), config_param_estimate(cfg), {Path(path): sizes},
                       fix="the GGUF was exported from another model: export it again from this one (export_gguf)")
    got: dict[str, np.ndarray] = {}
    for t in r.tensors:
        arr = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        got[t.name] = arr.reshape([int(n) for n in reversed(t.shape)])  # GGUF lists dims fastest first
    sd = {"embed.weight": got["token_embd.weight"], "norm.weight": got["output_norm.weight"]}
    if "output.weight" in got:
        sd["lm_head.weight"] = got["output.weight"]
    for ours, theirs in _LAYER_NAMES.items():
        for i in range(cfg.n_layer):
            w = torch.from_numpy(got[f"blk.{i}.{theirs}.weight"])
            if theirs in ("attn_q", "attn_k"):
                heads = cfg.n_head if theirs == "attn_q" else int(cfg.n_kv_head or cfg.n_head)
                hd = w.shape[0] // heads
                # the inverse of permute_rope: (h, j, half, d) -> (h, half, j, d)
                w = w.reshape(heads, hd // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
            sd[f"layers.{i}.{ours}"] = w
    return {k: torch.as_tensor(v) for k, v in sd.items()}


def _check(model: CodexModel) -> None:
    cfg = model.cfg
    if cfg.qkv_bias:
        raise ValueError("the llama GGUF architecture has no q/k/v biases; this model has them (qkv_bias=True)")
    if cfg.moe_layers:
        raise ValueError(f"moe_layers={cfg.moe_layers}: export a dense model to the llama GGUF architecture")
    sparse = [i for i in range(cfg.n_layer) if not model.layers[i].attn.pattern.is_dense]
    if sparse:
        raise ValueError(f"layers {sparse} use sparse attention, which llama.cpp's llama does not have")


def export_gguf(model: CodexModel, tokenizer: CodeTokenizer, path: str | Path, *, name: str = "codex-lab",
                gguf_type: str = "f32") -> Path:
    """Write ``model`` + ``tokenizer`` as one llama-architecture GGUF file, its tensors in
    ``gguf_type`` (:data:`GGUF_TYPES`: "f32", "f16" or "q8_0"), with the user's umask (0644 by default).

    Raises ValueError naming what llama's architecture lacks (biases, MoE, sparse attention),
    or an unknown ``gguf_type``.
    """
    import gguf

    from codex_lab.hf.export import umask_mode

    if gguf_type not in GGUF_TYPES:
        raise ValueError(f"gguf_type {gguf_type!r}; choose one of {GGUF_TYPES}")
    _check(model)
    cfg, path = model.cfg, Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.ffn_hidden)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(int(cfg.n_kv_head or cfg.n_head))
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(float(cfg.rope_theta))
    w.add_layer_norm_rms_eps(float(cfg.norm_eps))
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[gguf_type])
    _add_tokenizer(w, tokenizer, cfg.vocab_size)
    for tname, arr in gguf_tensors(model).items():
        data, qtype = _encode(tname, arr, gguf_type)
        if qtype is None:
            w.add_tensor(tname, data)
        else:  # quantised bytes (uint8): the writer derives the logical shape from the byte shape and type
            w.add_tensor(tname, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    umask_mode(path)
    return path


def _add_tokenizer(w: Any, tokenizer: CodeTokenizer, vocab_size: int) -> None:
    import gguf

    data = json.loads(tokenizer.tok.to_str())
    model, pre = data.get("model", {}), data.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel":
        raise ValueError(f"GGUF export supports byte-level BPE tokenizers; this one is {model.get('type')} with "
                         f"pre-tokenizer {pre.get('type')}")
    from codex_lab.data.fim import stop_token_ids

    vocab = tokenizer.tok
    tokens = [vocab.id_to_token(i) or f"[PAD{i}]" for i in range(vocab_size)]  # ids past the tokenizer: unused rows
    special = {t.content for t in vocab.get_added_tokens_decoder().values() if t.special} | set(SPECIAL_TOKENS)
    stops = stop_token_ids(tokenizer)  # where codex-lab ends a plain answer: control tokens, end-of-text first
    special |= {tokens[i] for i in stops if i < vocab_size}
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # ByteLevel(use_regex=True) is GPT-2's split pattern
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    # eot and the FIM keys by llama.cpp's key names, which gguf-py releases before them lack as constants
    keys = gguf.Keys.Tokenizer
    w.add_eos_token_id(stops[0])  # end-of-text
    w.add_uint32(getattr(keys, "EOT_ID", "tokenizer.ggml.eot_token_id"), stops[0])  # end of an infill too
    w.add_pad_token_id(tokenizer.pad_id)
    # llama.cpp's FIM keys (llama-vocab reads them for /infill): the sentinels the tokenizer has
    for key, token in ((getattr(keys, "FIM_PRE_ID", "tokenizer.ggml.fim_pre_token_id"), FIM_PREFIX),
                       (getattr(keys, "FIM_SUF_ID", "tokenizer.ggml.fim_suf_token_id"), FIM_SUFFIX),
                       (getattr(keys, "FIM_MID_ID", "tokenizer.ggml.fim_mid_token_id"), FIM_MIDDLE)):
        idx = vocab.token_to_id(token)
        if idx is not None:
            w.add_uint32(key, idx)
    # end-of-generation for llama.cpp at two more stop ids: keys it reads only into its end set
    for key, token in ((getattr(keys, "EOM_ID", "tokenizer.ggml.eom_token_id"), FIM_MIDDLE),
                       (getattr(keys, "FIM_PAD_ID", "tokenizer.ggml.fim_pad_token_id"), FIM_SUFFIX)):
        idx = vocab.token_to_id(token)
        if idx is not None and idx in stops:
            w.add_uint32(key, idx)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
