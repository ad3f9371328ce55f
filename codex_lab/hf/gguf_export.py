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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from codex_lab.data.tokenizer import SPECIAL_TOKENS, CodeTokenizer
from codex_lab.nn.model import CodexModel


def permute_rope(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """q/k projection rows (n_head * head_dim, d) from half-split RoPE order to adjacent pairs."""
    hd = w.shape[0] // n_head
    # (h, half, j, d) -> (h, j, half, d): row h*hd + half*hd/2 + j moves to h*hd + 2j + half
    return w.reshape(n_head, 2, hd // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def gguf_tensors(model: CodexModel) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 array (q and k permuted for llama.cpp's RoPE)."""
    cfg = model.cfg
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["embed.weight"], "output_norm.weight": sd["norm.weight"]}
    if not cfg.tie_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    names = {"attn_norm.weight": "attn_norm", "ffn_norm.weight": "ffn_norm", "attn.q_proj.weight": "attn_q",
             "attn.k_proj.weight": "attn_k", "attn.v_proj.weight": "attn_v", "attn.o_proj.weight": "attn_output",
             "ffn.gate_proj.weight": "ffn_gate", "ffn.up_proj.weight": "ffn_up", "ffn.down_proj.weight": "ffn_down"}
    for i in range(cfg.n_layer):
        for ours, theirs in names.items():
            w = sd[f"layers.{i}.{ours}"]
            if theirs == "attn_q":
                w = permute_rope(w, cfg.n_head)
            elif theirs == "attn_k":
                w = permute_rope(w, int(cfg.n_kv_head or cfg.n_head))
            out[f"blk.{i}.{theirs}.weight"] = w
    return {k: v.numpy().astype(np.float32) for k, v in out.items()}


def _check(model: CodexModel) -> None:
    cfg = model.cfg
    if cfg.qkv_bias:
        raise ValueError("the llama GGUF architecture has no q/k/v biases; this model has them (qkv_bias=True)")
    if cfg.moe_layers:
        raise ValueError(f"moe_layers={cfg.moe_layers}: export a dense model to the llama GGUF architecture")
    sparse = [i for i in range(cfg.n_layer) if not model.layers[i].attn.pattern.is_dense]
    if sparse:
        raise ValueError(f"layers {sparse} use sparse attention, which llama.cpp's llama does not have")


def export_gguf(model: CodexModel, tokenizer: CodeTokenizer, path: str | Path, *, name: str = "codex-lab") -> Path:
    """Write ``model`` + ``tokenizer`` as one llama-architecture GGUF file (float32 tensors).

    Raises ValueError naming what llama's architecture lacks (biases, MoE, sparse attention).
    """
    import gguf

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
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, tokenizer, cfg.vocab_size)
    for tname, arr in gguf_tensors(model).items():
        w.add_tensor(tname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_tokenizer(w: Any, tokenizer: CodeTokenizer, vocab_size: int) -> None:
    import gguf

    data = json.loads(tokenizer.tok.to_str())
    model, pre = data.get("model", {}), data.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel":
        raise ValueError(f"GGUF export supports byte-level BPE tokenizers; this one is {model.get('type')} with "
                         f"pre-tokenizer {pre.get('type')}")
    vocab = tokenizer.tok
    tokens = [vocab.id_to_token(i) or f"[PAD{i}]" for i in range(vocab_size)]  # ids past the tokenizer: unused rows
    special = {t.content for t in vocab.get_added_tokens_decoder().values() if t.special} | set(SPECIAL_TOKENS)
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # ByteLevel(use_regex=True) is GPT-2's split pattern
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokenizer.eot_id)
    w.add_pad_token_id(tokenizer.pad_id)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
