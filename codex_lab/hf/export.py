"""Export a codex_lab model as a Hugging Face folder that ``transformers`` loads on its own.

``export_hf_folder(model, tokenizer, out)`` writes::

    out/config.json               LlamaConfig (or Qwen2Config for q/k/v biases), eos / pad ids
    out/generation_config.json    greedy by default, eos / pad ids, max_length = the context;
                                  eos_token_id is the list :func:`~codex_lab.data.fim.stop_token_ids`
    out/model.safetensors         the weights (tied embeddings stay tied)
    out/tokenizer.json            the course tokenizer, byte for byte
    out/tokenizer_config.json     model_max_length = the context; eos, pad and every reserved
                                  token (FIM sentinels, task tags, <|answer|>) listed as special
    out/special_tokens_map.json
    out/codex_lab_meta.json       where the weights came from (the checkpoint's meta)

so ``AutoModelForCausalLM.from_pretrained(out)`` and ``AutoTokenizer.from_pretrained(out)``
need nothing else (no network, no codex_lab). Every file gets the mode a plain ``open()``
would give under the user's umask (0644 with the usual 022), as ``save_pretrained``'s JSON
files do: safetensors 0.8's ``save_file`` writes ``model.safetensors`` through a private
temporary file that it renames into place, which leaves it 0600 (owner only), so another
user or a container's user could not load the folder; :func:`umask_mode` puts it right. The tokenizer config names
``PreTrainedTokenizerFast`` and ``additional_special_tokens``, which transformers 4.x and
5.x both read.

Where generation ends: codex-lab ends a plain (non-FIM) answer at end-of-text and at a FIM
sentinel (:mod:`codex_lab.infer.sampling`); :func:`~codex_lab.data.fim.stop_token_ids` is that set, and both
``config.json`` and ``generation_config.json`` carry it as ``eos_token_id`` (a list, which
transformers' ``generate`` accepts), so transformers stops where ``codex-lab generate`` does.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from codex_lab.data.fim import stop_token_ids
from codex_lab.data.tokenizer import SPECIAL_TOKENS, CodeTokenizer
from codex_lab.hf.llama import to_hf
from codex_lab.nn.model import CodexModel

TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def current_umask() -> int:
    """The process's umask, read without changing it where Linux reports it (/proc/self/status);
    elsewhere by setting and restoring it at once."""
    try:
        m = re.search(r"^Umask:\s*([0-7]+)", Path("/proc/self/status").read_text(), re.M)
        if m:
            return int(m.group(1), 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_mode(path: str | Path) -> None:
    """Give the regular file ``path`` the mode ``open()`` creates files with: 0666 minus the umask."""
    os.chmod(path, 0o666 & ~current_umask())


def special_tokens_of(tokenizer: CodeTokenizer) -> tuple[str, str | None, list[str]]:
    """(eos, pad, other special tokens) as strings, for the course tokenizer or a foreign one."""
    vocab = tokenizer.tok
    eos = vocab.id_to_token(tokenizer.eot_id)
    pad = vocab.id_to_token(tokenizer.pad_id)
    reserved = [s for s in SPECIAL_TOKENS if vocab.token_to_id(s) is not None and s not in (eos, pad)]
    # a foreign tokenizer's own added special tokens (e.g. Qwen's) are kept special too
    added = [t.content for t in vocab.get_added_tokens_decoder().values() if t.special and t.content not in (eos, pad)]
    return eos, pad, list(dict.fromkeys(reserved + added))


def tokenizer_files(tokenizer: CodeTokenizer, out: Path, max_len: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into ``out``."""
    eos, pad, others = special_tokens_of(tokenizer)
    tokenizer.tok.save(str(out / "tokenizer.json"))
    cfg: dict[str, Any] = {
        "tokenizer_class": TOKENIZER_CLASS, "model_max_length": int(max_len), "eos_token": eos, "pad_token": pad,
        "bos_token": None, "unk_token": None, "additional_special_tokens": others,
        "clean_up_tokenization_spaces": False, "add_bos_token": False, "add_eos_token": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    smap = {"eos_token": eos, "pad_token": pad, "additional_special_tokens": others}
    (out / "special_tokens_map.json").write_text(json.dumps(smap, indent=2) + "\n")


def export_hf_folder(model: CodexModel, tokenizer: CodeTokenizer, out: str | Path, *, meta: dict[str, Any] | None = None,
                     arch: str | None = None) -> Path:
    """Write ``model`` and ``tokenizer`` as a transformers folder at ``out`` (created; files replaced).

    Args:
        model: a dense codex_lab model (:func:`~codex_lab.hf.llama.to_hf` names what it refuses).
        tokenizer: its tokenizer (:class:`~codex_lab.data.tokenizer.CodeTokenizer` or an HF one).
        meta: the checkpoint's metadata, kept in ``codex_lab_meta.json`` (provenance only).
        arch: "llama" or "qwen2" (default: qwen2 when the model has q/k/v biases, else llama).

    Returns:
        The folder.
    """
    from transformers import GenerationConfig

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = model.cfg.max_seq_len
    stops = stop_token_ids(tokenizer)  # end-of-text first: readers that take one id get it
    hf = to_hf(model, arch=arch, eos_token_id=stops, pad_token_id=tokenizer.pad_id)
    hf.generation_config = GenerationConfig(eos_token_id=stops, pad_token_id=tokenizer.pad_id,
                                            bos_token_id=None, do_sample=False, max_length=ctx)
    hf.save_pretrained(str(out), safe_serialization=True)
    conf = json.loads((out / "config.json").read_text())
    conf.setdefault("rope_theta", float(model.cfg.rope_theta))  # transformers 4.x reads this key (5.x: rope_parameters)
    (out / "config.json").write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
    tokenizer_files(tokenizer, out, ctx)
    (out / "codex_lab_meta.json").write_text(json.dumps(meta or {}, indent=2, sort_keys=True, default=str) + "\n")
    for f in out.iterdir():  # what this call wrote (and files it replaced): the user's umask, not 0600
        if f.is_file() and not f.is_symlink() and (f.name in WRITTEN or f.suffix == ".safetensors"):
            umask_mode(f)
    return out


# the files export_hf_folder writes (besides model*.safetensors shards)
WRITTEN = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
           "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "codex_lab_meta.json")


__all__ = ["export_hf_folder", "special_tokens_of", "tokenizer_files"]
