"""Load a Hugging Face checkpoint folder (``save_pretrained`` output) as a codex_lab model.

A folder with ``config.json``, safetensors weights (one file or shards) and
``tokenizer.json`` - what ``model.save_pretrained(d); tokenizer.save_pretrained(d)`` writes,
and what a model downloaded once from the Hub looks like on disk (e.g.
``~/.cache/huggingface/hub/models--Qwen--Qwen2.5-Coder-0.5B/snapshots/<hash>``). Llama and
Qwen2 go through :func:`codex_lab.hf.llama.from_hf`, Mixtral through
:func:`codex_lab.hf.mixtral.from_hf_mixtral`; nothing is downloaded (``local_files_only``).

The result, :class:`HFCheckpoint`, has the fields the commands use from a course
checkpoint (``model``, ``tokenizer``, ``config``, ``meta``, ``path``); its tokenizer is an
:class:`HFTokenizer`, which offers the :class:`~codex_lab.data.tokenizer.CodeTokenizer`
methods the engine and ``generate`` call (``encode``, ``encode_batch``, ``decode``,
``eot_id``, ``pad_id``, ``vocab_size``) over the folder's own ``tokenizer.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch
from tokenizers import Tokenizer

from codex_lab.data.tokenizer import MAX_TOKENIZER_BYTES, CodeTokenizer
from codex_lab.data.weights_file import check_budget, check_weights_held, safetensors_sizes
from codex_lab.errors import InputError, MissingFileError
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel

ARCHS = ("llama", "qwen2", "mixtral")
DEFAULT_MAX_SEQ_LEN = 4096  # RoPE tables; real models declare 32k+, which costs memory for nothing here


class HFTokenizer(CodeTokenizer):
    """A ``tokenizer.json`` from a Hugging Face folder: CodeTokenizer's encode/decode, the
    folder's own end-of-sequence and padding ids.

    ``encode`` applies the tokenizer's post-processor as ``AutoTokenizer`` does by default
    (e.g. Llama's BOS), so ids equal ``AutoTokenizer.from_pretrained(dir)(text).input_ids``.
    """

    def __init__(self, tok: Tokenizer, eos_id: int, pad_id: int | None = None) -> None:
        # not CodeTokenizer.__init__: a foreign vocabulary has none of the course's reserved tokens
        self.tok = tok
        self._eos = int(eos_id)
        self._pad = int(pad_id) if pad_id is not None else int(eos_id)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self.tok.get_vocab_size(with_added_tokens=True)

    @property
    def eot_id(self) -> int:
        """The end-of-sequence id (``generation_config.json`` or ``config.json``)."""
        return self._eos

    @property
    def pad_id(self) -> int:
        """The padding id (the eos id when the folder names none)."""
        return self._pad

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``. Ids past the tokenizer's vocabulary are the model's padding rows
        (real checkpoints pad the embedding, e.g. 151,646 tokenizer ids in 151,936 rows): they
        have no text and are skipped, as the Rust library does; a negative or non-integer id is
        an InputError."""
        ids = list(ids)
        bad = next((i for i in ids if not (isinstance(i, int) and i >= 0)), None)
        if bad is not None:
            raise InputError(f"token id {bad!r} is not a token id (0 or more); decode ids produced by this model")
        n = self.vocab_size
        return self.tok.decode([i for i in ids if i < n], skip_special_tokens=skip_special_tokens)


@dataclass
class HFCheckpoint:
    """A converted Hugging Face folder: the codex_lab model (eval mode), tokenizer, config."""

    model: CodexModel
    tokenizer: HFTokenizer
    config: ModelConfig
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def _first_id(v: Any) -> int | None:
    if isinstance(v, list):
        return int(v[0]) if v else None
    return None if v is None else int(v)


def _read_json(p: Path) -> dict:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{p}: not readable JSON ({exc}); re-save the folder with save_pretrained") from None


MAX_NORMALIZER_GROWTH = 8  # Llama's " " -> "▁" and Prepend("▁") grow a text by at most 2x


def normalizer_growth(d: Any) -> int:
    """An upper bound on how many times a tokenizer.json normalizer can multiply a text's length
    (a ``Replace`` writes ``len(content)`` characters per match of at least one; a ``Sequence``
    multiplies its steps' bounds; ``Prepend`` at most doubles a one-character text), so a
    normalizer that multiplies the text until the process aborts is refused before it runs."""
    if d is None:
        return 1
    if not isinstance(d, dict):
        return 1 << 30
    kind = d.get("type")
    if kind == "Sequence":
        out = 1
        for step in d.get("normalizers") or []:
            out = min(out * normalizer_growth(step), 1 << 30)
        return out
    if kind == "Replace":
        pat = d.get("pattern") if isinstance(d.get("pattern"), dict) else {}
        content, lit = len(str(d.get("content", ""))), pat.get("String")
        if isinstance(lit, str) and lit:  # ceil(len(content) / len(pattern)) per character
            return max(1, -(-content // len(lit)))
        return 1 + content  # a Regex may match one character, or none (then content goes between characters)
    if kind == "Prepend":
        return 1 + len(str(d.get("prepend", "")))
    return 1  # NFC/NFKC/Lowercase/Strip...: at most a small constant factor per character


def quantified_group(pattern: str) -> str | None:
    """The first group of ``pattern`` that is itself repeated (``(...)+``, ``(...)*``,
    ``(...){n,}``), or None. A repeated group holding a repeat or an alternation (``(a+)+$``,
    ``(a|aa)*$``) backtracks exponentially on a near-match, and the Rust library panics on it
    (``retry-limit-in-match over``); the pre-tokenizer patterns of GPT-2, Llama 3 and Qwen2
    repeat no group at all, so a tokenizer that does is refused rather than analysed."""
    starts: list[int] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "]":  # "[]...]": a leading ] is literal
                i += 1
        elif c == "(":
            starts.append(i)
        elif c == ")" and starts:
            start = starts.pop()
            if pattern[i + 1 : i + 2] in ("+", "*") or (pattern[i + 1 : i + 2] == "{" and "," in pattern[i + 1 : i + 12]):
                return pattern[start : i + 2]
        i += 1
    return None


def _regexes(d: Any) -> list[str]:
    """Every ``{"Regex": ...}`` pattern anywhere in a tokenizer.json component."""
    if isinstance(d, dict):
        out = [d["Regex"]] if isinstance(d.get("Regex"), str) else []
        return out + [r for v in d.values() for r in _regexes(v)]
    if isinstance(d, list):
        return [r for v in d for r in _regexes(v)]
    return []


def load_tokenizer(path: str | Path) -> HFTokenizer:
    """The folder's ``tokenizer.json`` with its eos/pad ids (see :class:`HFTokenizer`)."""
    path = Path(path)
    tj = path / "tokenizer.json"
    if not tj.is_file():
        raise MissingFileError(f"{path}: no tokenizer.json; save the tokenizer with tokenizer.save_pretrained({str(path)!r})")
    if tj.stat().st_size > MAX_TOKENIZER_BYTES:
        raise InputError(f"{tj}: over the {MAX_TOKENIZER_BYTES >> 20} MiB limit for a tokenizer; re-save the folder")
    spec = _read_json(tj)
    for part in ("normalizer", "pre_tokenizer"):
        bad = next((g for g in map(quantified_group, _regexes(spec.get(part))) if g), None)
        if bad:
            raise InputError(f"{tj}: the {part} regex repeats the group {bad[:60]!r}, which backtracks "
                             "exponentially on some inputs; use the model's original tokenizer.json")
    growth = normalizer_growth(spec.get("normalizer"))
    if growth > MAX_NORMALIZER_GROWTH:
        raise InputError(f"{tj}: its normalizer can multiply a text's length by {growth:,} (limit "
                         f"{MAX_NORMALIZER_GROWTH}); remove the Replace/Prepend steps that grow it, or re-save the tokenizer")
    try:
        tok = Tokenizer.from_file(str(tj))
    except Exception as exc:  # the Rust library raises plain Exception
        raise InputError(f"{tj}: not a readable tokenizer.json ({' '.join(str(exc).split())[:200]})") from None
    cfg = _read_json(path / "config.json") if (path / "config.json").is_file() else {}
    gen = _read_json(path / "generation_config.json") if (path / "generation_config.json").is_file() else {}
    eos = _first_id(gen.get("eos_token_id")) if gen.get("eos_token_id") is not None else _first_id(cfg.get("eos_token_id"))
    if eos is None and (path / "tokenizer_config.json").is_file():
        name = _read_json(path / "tokenizer_config.json").get("eos_token")
        name = name.get("content") if isinstance(name, dict) else name
        eos = tok.token_to_id(name) if name else None
    if eos is None:
        raise InputError(f"{path}: no eos_token_id in config.json / generation_config.json and no eos_token in "
                         "tokenizer_config.json; set one so generation can stop")
    return HFTokenizer(tok, eos, _first_id(cfg.get("pad_token_id")))


def hf_param_estimate(hf_cfg: Any) -> int:
    """Parameters a Llama / Qwen2 / Mixtral config describes (from the config alone).

    ``V * h`` (twice when untied) + per layer: attention ``2 * h * (heads * hd) + 2 * h * (kv * hd)``,
    SwiGLU ``3 * h * I`` per expert (one expert when dense) plus a router ``h * E``, two norms.
    """
    h, n_layer, n_head = int(hf_cfg.hidden_size), int(hf_cfg.num_hidden_layers), int(hf_cfg.num_attention_heads)
    n_kv = int(getattr(hf_cfg, "num_key_value_heads", None) or n_head)
    hd = int(getattr(hf_cfg, "head_dim", None) or h // max(n_head, 1))
    experts = int(getattr(hf_cfg, "num_local_experts", None) or 1)
    tied = bool(getattr(hf_cfg, "tie_word_embeddings", False))
    ffn = int(hf_cfg.intermediate_size)
    # params = V*h*(1 + untied) + L * (attention + experts * 3*h*I + router + 2 norms) + final norm
    per_layer = 2 * h * n_head * hd + 2 * h * n_kv * hd + experts * 3 * h * ffn + (h * experts if experts > 1 else 0) + 2 * h
    return int(hf_cfg.vocab_size) * h * (1 if tied else 2) + n_layer * per_layer + h


def check_hf_weights(path: Path, hf_cfg: Any, dtype: torch.dtype) -> None:
    """Refuse a folder before transformers allocates anything for it: every ``*.safetensors``
    header must match its file (declared sizes within the file), the weights must cover the
    model ``config.json`` describes (else transformers would allocate and randomly fill the
    rest) and be on disk, not holes of a sparse file
    (:func:`~codex_lab.data.weights_file.check_weights_held`), and the two copies that exist
    during conversion must fit the memory budget.

    Raises:
        InputError: one line naming the file and the fix.
    """
    files = {f: safetensors_sizes(f) for f in sorted(path.glob("*.safetensors"))}
    numel = sum(n for n, _ in files.values())
    try:
        n_params = hf_param_estimate(hf_cfg)
    except (AttributeError, TypeError, ValueError) as exc:
        raise InputError(f"{path / 'config.json'}: {exc}; re-save the folder with save_pretrained") from None
    # not exact: biases and norms the estimate leaves out only add to the files' count (2% slack)
    check_weights_held(path / "config.json", n_params, files, exact=False,
                       fix="the config and weights come from different models, re-save the folder with save_pretrained")
    per = torch.empty(0, dtype=dtype).element_size()
    # the Hugging Face model and the converted one are both in memory during the conversion
    check_budget(2 * per * max(n_params, numel), path / "config.json",
                 f"loading and converting this model ({max(n_params, numel):,} parameters, two copies)")


def load_hf_folder(path: str | Path, device: torch.device | str | None = None, *, dtype: torch.dtype = torch.float32,
                   max_seq_len: int | None = None) -> HFCheckpoint:
    """Convert a Llama / Qwen2 / Mixtral ``save_pretrained`` folder into an :class:`HFCheckpoint`.

    Args:
        path: the folder (config.json, *.safetensors, tokenizer.json).
        device: where the model goes (default CPU).
        dtype: parameter dtype (default float32; bfloat16 halves memory on a GPU).
        max_seq_len: RoPE table length in tokens (default min(max_position_embeddings, 4096)).

    Raises:
        MissingFileError: the folder or one of its files is missing (names which).
        InputError: an unsupported architecture or setting (named), or unreadable files.
    """
    from transformers import AutoConfig, AutoModelForCausalLM  # the "hf" extra

    from codex_lab.hf.llama import from_hf
    from codex_lab.hf.mixtral import from_hf_mixtral

    path = Path(path)
    if not path.is_dir():
        raise MissingFileError(f"no Hugging Face folder at {str(path)!r}; point --hf at a save_pretrained folder")
    if not (path / "config.json").is_file():
        raise MissingFileError(f"{path}: no config.json; this is not a save_pretrained folder")
    if not any(path.glob("*.safetensors")):
        raise MissingFileError(f"{path}: no *.safetensors weights; save with model.save_pretrained(dir) "
                               "(safe_serialization is the default)")
    tokenizer = load_tokenizer(path)
    hf_cfg = AutoConfig.from_pretrained(path, local_files_only=True)
    arch = getattr(hf_cfg, "model_type", None)
    if arch not in ARCHS:
        raise InputError(f"{path}: model_type={arch!r} is not supported; --hf converts {ARCHS}")
    check_hf_weights(path, hf_cfg, dtype)
    seq = max_seq_len or min(int(hf_cfg.max_position_embeddings), DEFAULT_MAX_SEQ_LEN)
    hf = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype).eval()
    try:
        model = from_hf_mixtral(hf, max_seq_len=seq) if arch == "mixtral" else from_hf(hf, max_seq_len=seq, dtype=dtype)
    except ValueError as exc:
        raise InputError(f"{path}: {exc}") from None
    del hf
    if tokenizer.vocab_size > model.cfg.vocab_size:
        raise InputError(f"{path}: tokenizer has {tokenizer.vocab_size} ids but the model only {model.cfg.vocab_size}")
    model = model.to(device or "cpu").eval()
    return HFCheckpoint(model, tokenizer, model.cfg, {"source": "hf", "model_type": arch}, path)
