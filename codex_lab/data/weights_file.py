"""Checks on a weights file before anything is allocated for it: a safetensors header read by
hand (every declared tensor must lie inside the file, its byte range must equal its shape times
its dtype's size, and the ranges must fill the data exactly), the weight bytes a config implies
against the bytes the weight files really hold (:func:`check_weights_held`), and a memory
budget for the model a config or a header describes.

A 4 KiB file that declares 2.5 GiB of weights is refused here, in one line naming the file,
instead of the loader allocating the model it describes and then failing to fill it. So is a
*sparse* file of 2.5 GiB that takes 4 KiB on disk: its header is consistent with its size, but
its data are holes, so the bytes it holds are counted on disk (``SEEK_DATA``/``SEEK_HOLE``), not
read off ``st_size``; the memory budget alone (3/4 of physical memory) admitted it.
"""

from __future__ import annotations

import errno
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
# Share of a weight file's declared bytes that must really be on disk (not holes). A file
# written by save_model has no holes; a filesystem that compresses (ZFS) may turn an all-zero
# record into a hole, so a real checkpoint can fall a little short, never to half. Below half,
# loading it would allocate more than twice the disk it takes: the sparse-file bomb.
MIN_ON_DISK_FRACTION = 0.5


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


def config_weight_numel(cfg: ModelConfig) -> int:
    """Values a checkpoint of ``cfg`` stores: its parameters (tied ones once,
    :func:`config_param_estimate`) plus its persistent buffers (each mixture-of-experts
    layer's ``expert_bias``, ``n_experts`` values); the RoPE tables are not saved."""
    moe_layers = set(cfg.moe_layers) & set(range(cfg.n_layer))
    return config_param_estimate(cfg) + len(moe_layers) * cfg.n_experts


def bytes_on_disk(path: str | Path, enough: int | None = None) -> int:
    """Bytes of ``path`` that hold data on disk: its size less the holes of a sparse file.

    Walks the data extents with ``SEEK_DATA``/``SEEK_HOLE`` (not ``st_blocks``, which ZFS
    reports late for a file just written and some FUSE filesystems report as 0); stops once
    ``enough`` bytes are counted, so a file cut into many small holes costs no more than that.
    Where the filesystem cannot tell holes (no ``SEEK_HOLE``), the whole file counts as data.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: a FIFO must not hang the open
    try:
        size = os.fstat(fd).st_size
        if not hasattr(os, "SEEK_DATA"):
            return size
        held, pos = 0, 0
        while pos < size and (enough is None or held < enough):
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data after pos: the rest is one hole
                    break
                return size  # EINVAL etc.: holes cannot be told here, count it all
            end = os.lseek(fd, start, os.SEEK_HOLE)
            held += end - start
            pos = end
        return min(held, size)
    finally:
        os.close(fd)


def check_weights_held(config_path: str | Path, config_numel: int, files: dict[Path, tuple[int, int]], *,
                       exact: bool = True, fix: str = "") -> None:
    """Refuse weight files that do not hold the weights a config declares, before any model is built.

    ``files`` maps each weight file to ``(values, bytes)`` its header declares (already checked
    against the file's size by :func:`read_safetensors_header`). The config's weight bytes are
    ``config_numel`` values at the files' own bytes per value; they must equal what the headers
    declare (``exact``; else the headers must declare at least 98% of them, for an estimate that
    leaves out biases and norms), and at least :data:`MIN_ON_DISK_FRACTION` of the declared bytes must be data on disk
    (a sparse file's holes read as zeros but cost no disk: 4 KiB on disk made a loader allocate
    2.5 GiB). Both figures and the fix are in the one-line error.

    Raises:
        InputError: ``{config}: the config declares X bytes of weights, the files hold Y ({files}); fix``.
    """
    fix = fix or ("the config and weights come from different models, or the weights were not fully copied: "
                  "re-save the checkpoint")
    numel = sum(n for n, _ in files.values())
    declared = sum(b for _, b in files.values())
    per_value = declared / numel if numel else 4.0  # bytes per value in the files (mixed dtypes: the mean)
    implied = round(config_numel * per_value)
    names = ", ".join(str(p) for p in list(files)[:2]) + (f" and {len(files) - 2} more" if len(files) > 2 else "")
    mismatch = numel != config_numel if exact else numel < 0.98 * config_numel
    if mismatch:
        raise InputError(f"{config_path}: the config declares {implied:,} bytes of weights, the files hold {declared:,} "
                         f"({config_numel:,} values against {numel:,} in {names}); {fix}")
    # the headers agree with the config; now what is really on disk behind them
    want = math.ceil(MIN_ON_DISK_FRACTION * declared)
    held = 0
    for p, (_, nbytes) in files.items():
        if held >= want:
            break
        held += min(nbytes, bytes_on_disk(p, enough=want - held))
    if held >= want:
        return
    raise InputError(f"{config_path}: the config declares {implied:,} bytes of weights, the files hold {held:,} "
                     f"on disk ({names}: a sparse file whose {declared - held:,} other declared bytes are holes); "
                     "copy the real weight files (not a sparse or partial copy), or re-save the checkpoint")


def safetensors_sizes(path: str | Path) -> tuple[int, int]:
    """``(values, bytes)`` the tensors of a safetensors file declare, checked against the file."""
    header = read_safetensors_header(path)
    return (sum(math.prod(shape) for shape, _ in header.values()), header_bytes(header))


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
