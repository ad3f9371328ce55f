"""Checks on a weights file before anything is allocated for it: a safetensors header read by
hand (every declared tensor must lie inside the file, its byte range must equal its shape times
its dtype's size, and the ranges must fill the data exactly), and a memory budget for the
model a config or a header describes.

A 4 KiB file that declares 2.5 GiB of weights is refused here, in one line naming the file,
instead of the loader allocating the model it describes and then failing to fill it.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from codex_lab.errors import InputError, MissingFileError
from codex_lab.nn.config import ModelConfig

# bytes per element of each safetensors dtype
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit on the JSON header
BUDGET_ENV = "CODEX_LAB_MAX_LOAD_BYTES"


def memory_budget_bytes() -> int:
    """Bytes a loader may allocate for one model: ``$CODEX_LAB_MAX_LOAD_BYTES`` when set, else
    3/4 of the machine's physical memory (a model larger than that cannot run here anyway)."""
    env = os.environ.get(BUDGET_ENV, "").strip()
    if env:
        try:
            return max(int(float(env)), 0)
        except ValueError:
            raise InputError(f"{BUDGET_ENV}={env!r} is not a number of bytes; set it to e.g. 8e9 or unset it") from None
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on every platform
        phys = 16 << 30
    return phys * 3 // 4


def check_budget(nbytes: int, path: str | Path, what: str) -> None:
    """InputError naming ``path`` when ``nbytes`` (what loading it would allocate) is over the budget."""
    budget = memory_budget_bytes()
    if nbytes > budget:
        raise InputError(
            f"{path}: {what} needs {nbytes / 2**30:,.2f} GiB, over the {budget / 2**30:,.2f} GiB memory budget; "
            f"use a smaller model, or raise {BUDGET_ENV} (bytes) if this machine really holds it"
        )


def config_param_estimate(cfg: ModelConfig) -> int:
    """Parameters of the model ``cfg`` describes, from the config alone (no tensor is built).

    embeddings ``vocab * d`` (twice when untied) + per layer: attention
    ``d * (n_head * hd) * 2 + d * (n_kv * hd) * 2`` (q, o, k, v), the FFN ``3 * d * ffn`` (SwiGLU),
    or in a mixture-of-experts layer ``(E + shared) * 3 * d * ffn_moe + d * E`` (router), and norms.
    """
    d, hd = cfg.d_model, cfg.head_dim
    n_kv = cfg.n_kv_head or cfg.n_head
    ffn = cfg.ffn_hidden or 4 * d
    moe_ffn = cfg.moe_ffn_hidden or ffn
    # params = V*d*(1 + untied) + final norm + sum over layers (attention + FFN + two norms)
    total = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2) + d
    moe = set(cfg.moe_layers)
    for layer in range(cfg.n_layer):
        attn = 2 * d * cfg.n_head * hd + 2 * d * n_kv * hd + (cfg.n_head + 2 * n_kv) * hd * cfg.qkv_bias
        if layer in moe:
            ffn_p = (cfg.n_experts + cfg.n_shared_experts) * 3 * d * moe_ffn + d * cfg.n_experts
        else:
            ffn_p = 3 * d * ffn
        total += attn + ffn_p + 2 * d
    return total


def read_safetensors_header(path: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{name: (shape, dtype)}`` of a safetensors file, every entry checked against the file.

    The 8-byte header length must fit in the file; each tensor's ``data_offsets`` must lie in
    the data section with ``end - begin == prod(shape) * dtype bytes``; and the ranges must
    cover the data section exactly (what the format requires), so the declared sizes are
    the bytes really on disk. Nothing but the header is read.

    Raises:
        MissingFileError: no file at ``path``.
        InputError: one line naming the file, what is wrong and the fix.
    """
    path = Path(path)
    fix = "the file is truncated or not a safetensors file: re-save the weights (save_checkpoint, save_pretrained)"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: a FIFO must not hang the open
    except FileNotFoundError:
        raise MissingFileError(f"{path}: no such file; point at a folder with the weights") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror}); {fix}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file; {fix}")
        size = st.st_size
        head = f.read(8)
        if len(head) < 8:
            raise InputError(f"{path}: {size} bytes, too short for a safetensors header; {fix}")
        n = int.from_bytes(head, "little")
        if not 2 <= n <= min(MAX_HEADER_BYTES, size - 8):
            raise InputError(f"{path}: declares a {n:,}-byte header in a {size:,}-byte file; {fix}")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: the header is not JSON ({' '.join(str(exc).split())[:120]}); {fix}") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: the header is not a JSON object; {fix}")
    data = size - 8 - n
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    spans: list[tuple[int, int]] = []
    for name, e in header.items():
        if name == "__metadata__":
            continue
        ok = (isinstance(e, dict) and e.get("dtype") in DTYPE_BYTES and isinstance(e.get("shape"), list)
              and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in e["shape"])
              and isinstance(e.get("data_offsets"), list) and len(e["data_offsets"]) == 2
              and all(isinstance(o, int) and not isinstance(o, bool) for o in e["data_offsets"]))
        if not ok:
            raise InputError(f"{path}: tensor {name[:80]!r} has a malformed header entry; {fix}")
        begin, end = e["data_offsets"]
        # bytes = prod(shape) * bytes per element
        nbytes = math.prod(e["shape"]) * DTYPE_BYTES[e["dtype"]]
        if end - begin != nbytes:
            raise InputError(f"{path}: tensor {name[:80]!r} declares shape {e['shape']} ({nbytes:,} bytes) "
                             f"but a {end - begin:,}-byte range; {fix}")
        if not 0 <= begin <= end <= data:
            raise InputError(f"{path}: tensor {name[:80]!r} declares bytes {begin:,}..{end:,} but the file holds "
                             f"only {data:,} bytes of data ({size:,} bytes in all); {fix}")
        spans.append((begin, end))
        out[name] = (tuple(e["shape"]), e["dtype"])
    spans.sort()
    pos = 0
    for begin, end in spans:
        if begin != pos:
            raise InputError(f"{path}: tensor data overlaps or leaves a gap at byte {pos:,}; {fix}")
        pos = end
    if pos != data:
        raise InputError(f"{path}: the tensors declare {pos:,} bytes of data but the file holds {data:,}; {fix}")
    return out


def header_bytes(header: dict[str, Any], as_dtype_bytes: int | None = None) -> int:
    """Bytes the tensors of a header take in memory (each at ``as_dtype_bytes`` when given,
    e.g. 4 for a model that loads every weight as float32)."""
    total = 0
    for shape, dtype in header.values():
        total += math.prod(shape) * (as_dtype_bytes or DTYPE_BYTES[dtype])
    return total
