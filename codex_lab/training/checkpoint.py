"""Checkpoints on disk: ``model.safetensors`` + ``config.json`` + ``tokenizer.json`` + ``meta.json``.

Writes are atomic: everything goes into a temporary sibling folder that is renamed into
place only when complete, so a crash mid-write never leaves a half checkpoint behind.
The shipped tiny checkpoint lives in the package (``codex_lab/assets/tiny``).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import types
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import torch
from safetensors.torch import load_model, save_model

from codex_lab.errors import InputError, MissingFileError

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.data.weights_file import (
    check_budget, check_weights_held, config_param_estimate, config_weight_numel, header_bytes,
    read_safetensors_header,
)

WEIGHTS, CONFIG, TOKENIZER, META = "model.safetensors", "config.json", "tokenizer.json", "meta.json"


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model (eval mode), its tokenizer, config and metadata."""

    model: CodexModel
    tokenizer: CodeTokenizer
    config: ModelConfig
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def pretrained_path() -> Path:
    """Folder of the shipped tiny checkpoint (inside the installed package)."""
    return Path(__file__).resolve().parents[1] / "assets" / "tiny"  # codex_lab/assets/tiny


def write_checkpoint_files(
    folder: Path, model: CodexModel, tokenizer: CodeTokenizer, meta: dict[str, Any] | None = None
) -> None:
    """Write the four checkpoint files into an existing (private, temporary) folder, fsynced."""
    save_model(model, str(folder / WEIGHTS), metadata={"format": "pt"})
    model.cfg.save(folder / CONFIG)
    tokenizer.save(folder / TOKENIZER)
    (folder / META).write_text(json.dumps(meta or {}, indent=2, sort_keys=True, default=str) + "\n")
    for name in (WEIGHTS, CONFIG, TOKENIZER, META):  # on disk before the folder is renamed into place
        with open(folder / name, "rb") as f:
            os.fsync(f.fileno())


def save_checkpoint(
    path: str | Path, model: CodexModel, tokenizer: CodeTokenizer, meta: dict[str, Any] | None = None
) -> Path:
    """Write a checkpoint folder atomically (replacing any folder already at ``path``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is an ordinary folder
    try:
        write_checkpoint_files(tmp, model, tokenizer, meta)
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_checkpoint(path: str | Path, device: torch.device | str | None = None) -> Checkpoint:
    """Read a checkpoint folder written by :func:`save_checkpoint`, validating every file first.

    The config is type- and range-checked, the weights' header is compared (names, shapes,
    dtypes) with the model the config describes before any real weight is allocated, and
    the weights must be finite.

    Raises:
        MissingFileError: the folder or one of its files is missing (names which).
        InputError: a file is truncated, garbage or does not fit the others (names the file and the fix).
    """
    path = Path(path)
    if not path.is_dir():
        raise MissingFileError(
            f"no checkpoint folder at {str(path)!r}; train one with `codex-lab train` "
            "or use the shipped one (codex_lab.load_pretrained())"
        )
    missing = [n for n in (WEIGHTS, CONFIG, TOKENIZER) if not (path / n).is_file()]
    if missing:
        raise MissingFileError(
            f"checkpoint {str(path)!r} is incomplete: missing {missing}; "
            "point at a folder written by `codex-lab train` (or save_checkpoint)"
        )
    cfg = load_config(path / CONFIG)
    tokenizer = CodeTokenizer.load(path / TOKENIZER)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise InputError(
            f"{path / TOKENIZER}: the tokenizer has {tokenizer.vocab_size} ids but {path / CONFIG} says "
            f"vocab_size={cfg.vocab_size}; the files come from different checkpoints, re-save the checkpoint"
        )
    check_weights_header(path / WEIGHTS, cfg)
    model = CodexModel(cfg)
    weights = path / WEIGHTS
    try:
        load_model(model, str(weights), strict=True)
    except Exception as exc:  # safetensors/torch raise several types; all mean a bad file
        raise InputError(f"{weights}: cannot load the weights ({_one_line(exc)}); {_REDO}") from None
    bad = [n for n, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise InputError(f"{weights}: non-finite values (NaN/inf) in {bad[:3]}; {_REDO}")
    if device is not None:
        model = model.to(device)
    model.eval()
    meta = _load_meta(path / META)
    return Checkpoint(model=model, tokenizer=tokenizer, config=cfg, meta=meta, path=path)


_REDO = "the file is truncated or corrupt: re-save the checkpoint (codex-lab train, or save_checkpoint)"
MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; anything over 1 MiB is not one
# Upper bounds for a config read from disk: they stop a hostile config from making the loader
# allocate terabytes (RoPE tables, KV caches) before the weights' shapes are checked.
CONFIG_LIMITS = {"vocab_size": 1 << 22, "d_model": 1 << 16, "n_layer": 1024, "n_head": 1024, "n_kv_head": 1024,
                 "ffn_hidden": 1 << 18, "max_seq_len": 1 << 17, "n_experts": 1024, "moe_top_k": 1024,
                 "n_shared_experts": 64, "moe_ffn_hidden": 1 << 18}
REQUIRED_CONFIG_KEYS = ("vocab_size", "d_model", "n_layer", "n_head", "max_seq_len")


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line, at most 200 characters."""
    msg = " ".join(str(exc).split()) or type(exc).__name__
    return msg[:200]


def _type_ok(value: Any, tp: Any) -> bool:
    """Whether a JSON value has the annotated type (bool is not an int; floats must be finite)."""
    origin = get_origin(tp)
    if tp is type(None):
        return value is None
    if origin in (Union, types.UnionType):
        return any(_type_ok(value, a) for a in get_args(tp))
    if origin is list:
        return isinstance(value, list) and all(_type_ok(v, get_args(tp)[0]) for v in value)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is str:
        return isinstance(value, str)
    return True


def load_config(path: str | Path) -> ModelConfig:
    """Read and validate a ``config.json``: a JSON object, known keys, right types, sane ranges.

    Raises:
        InputError: one line naming the file, what is wrong and the fix.
    """
    path = Path(path)
    fix = "re-save the checkpoint (codex-lab train, or save_checkpoint) or repair the file by hand"
    try:
        if path.exists() and not path.is_file():  # a FIFO would block the read
            raise InputError(f"{path}: not a regular file; {fix}")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise InputError(f"{path}: {path.stat().st_size:,} bytes is not a model config (limit 1 MiB); {fix}")
        d = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingFileError(f"{path}: no such file; point at a checkpoint folder with a config.json") from None
    except (ValueError, OSError, RecursionError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{path}: not valid JSON ({_one_line(exc)}); {fix}") from None
    if not isinstance(d, dict):
        raise InputError(f"{path}: expected a JSON object of ModelConfig fields, got {type(d).__name__}; {fix}")
    hints = get_type_hints(ModelConfig)
    known = {f.name for f in fields(ModelConfig)}
    unknown = sorted(k for k in d if k not in known)
    if unknown:
        raise InputError(f"{path}: unknown config keys {unknown[:5]}; {fix}")
    missing = [k for k in REQUIRED_CONFIG_KEYS if k not in d]
    if missing:
        raise InputError(f"{path}: missing config keys {missing}; {fix}")
    for k, v in d.items():
        if not _type_ok(v, hints[k]):
            want = getattr(hints[k], "__name__", str(hints[k]))
            raise InputError(f"{path}: {k}={json.dumps(v)[:40]} should be of type {want}; {fix}")
        lim = CONFIG_LIMITS.get(k)
        if lim is not None and v is not None and not 1 <= v <= lim and not (k == "n_shared_experts" and v == 0):
            raise InputError(f"{path}: {k}={v} is outside 1..{lim}; {fix}")
    for k in ("rope_theta", "norm_eps", "moe_capacity_factor"):
        if d.get(k) is not None and not d[k] > 0:
            raise InputError(f"{path}: {k}={d[k]} must be > 0; {fix}")
    try:
        cfg = ModelConfig.from_dict(d)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{path}: {_one_line(exc)}; {fix}") from None
    # RoPE tables hold max_seq_len * head_dim floats each: keep them under 2**25 (128 MiB)
    if cfg.max_seq_len * cfg.head_dim > 1 << 25:
        raise InputError(f"{path}: max_seq_len * head_dim = {cfg.max_seq_len * cfg.head_dim:,} is over 2**25; {fix}")
    # the model is built in float32 before its weights are read: 4 bytes per parameter
    n_params = config_param_estimate(cfg)
    check_budget(4 * n_params, path, f"the model it describes ({n_params:,} parameters in float32)")
    return cfg


def check_weights_header(path: str | Path, cfg: ModelConfig, config_path: str | Path | None = None) -> None:
    """Compare a safetensors file's header (sizes, names, shapes, dtypes) with the model ``cfg`` describes.

    Every declared tensor must lie inside the file with the byte size its shape implies
    (:func:`~codex_lab.data.weights_file.read_safetensors_header`). Then, from the config alone
    (no model built, not even on the meta device), the weight bytes it implies must equal the
    bytes the file declares and those bytes must really be on disk
    (:func:`~codex_lab.data.weights_file.check_weights_held`: a config edited to declare 2.5 GiB,
    or a sparse 2.5 GiB file taking 4 KiB on disk, is refused here). Only then is the model
    built, on the meta device (no memory), to compare names and shapes.

    Args:
        path: the safetensors file.
        cfg: the config the weights must fit.
        config_path: the file ``cfg`` was read from, named in errors (default: ``config.json`` beside ``path``).

    Raises:
        InputError: the file is truncated/garbage, holds another amount of weights than the
            config declares, or names/shapes do not match (names the file).
    """
    path = Path(path)
    config_path = Path(config_path) if config_path is not None else path.parent / CONFIG
    # declared sizes against the file's size, before anything is allocated for them
    header = read_safetensors_header(path)
    numel = sum(math.prod(shape) for shape, _ in header.values())
    # the config's weight bytes against the file's, before any model (even a meta one) is built
    check_weights_held(config_path, config_weight_numel(cfg), {path: (numel, header_bytes(header))})
    try:
        with torch.device("meta"):
            shape_model = CodexModel(cfg)
    except (ValueError, TypeError, KeyError, RuntimeError) as exc:  # e.g. a bad attention pattern spec
        raise InputError(f"{config_path}: {_one_line(exc)}; re-save the checkpoint or repair the file by hand") from None
    groups: dict[int, list[str]] = {}  # tied parameters share one tensor and are stored once
    for name, p in shape_model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    expected = {n: tuple(t.shape) for n, t in shape_model.state_dict().items()}
    extra = sorted(set(header) - set(expected))
    if extra:
        raise InputError(f"{path}: tensors {extra[:3]} are not in the model {config_path} describes; {_REDO}")
    param_names = {n for names in groups.values() for n in names}
    wanted = [names for names in groups.values()] + [[n] for n in expected if n not in param_names]
    absent = [names[0] for names in wanted if not any(n in header for n in names)]
    if absent:
        raise InputError(f"{path}: missing tensors {absent[:3]} for the model {config_path} describes; {_REDO}")
    for n, (shape, dtype) in header.items():
        if shape != expected[n]:
            raise InputError(
                f"{path}: {n} has shape {list(shape)} but {config_path} implies {list(expected[n])}; "
                "the config and weights come from different models, re-save the checkpoint"
            )
        if dtype not in ("F16", "BF16", "F32", "F64"):
            raise InputError(f"{path}: {n} has dtype {dtype}, not a floating-point weight; {_REDO}")


def _load_meta(path: Path) -> dict[str, Any]:
    """``meta.json`` as a dict (``{}`` when absent); InputError naming the file when it is garbage."""
    if not path.is_file():
        return {}
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"{path.stat().st_size:,} bytes, over the 1 MiB limit")
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError, RecursionError) as exc:
        raise InputError(f"{path}: not valid JSON ({_one_line(exc)}); delete it or re-save the checkpoint") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(meta).__name__}; delete it or re-save the checkpoint")
    return meta


def _zip_sizes_problem(path: Path) -> str:
    """"" when ``path`` is a zip whose entries are stored uncompressed, as torch.save writes them,
    so what loading allocates is bounded by the file's own size; else what is wrong.

    A deflated entry (a zip bomb: a 260 KB file held a 256 MiB tensor) or the legacy
    pre-zip format (which allocates each storage at its declared size before reading it)
    is refused before torch.load sees it.
    """
    import zipfile

    try:
        size = path.stat().st_size
        if not zipfile.is_zipfile(path):
            return "not a zip archive"
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as exc:
        return f"unreadable zip archive: {_one_line(exc)[:80]}"
    packed = [i.filename for i in infos if i.compress_type != zipfile.ZIP_STORED]
    if packed:
        return f"compressed entry {packed[0][:60]!r}"
    # stored entries: the bytes they unpack to are the bytes in the file
    total = sum(i.file_size for i in infos)
    if total > size:
        return f"entries declare {total:,} bytes in a {size:,}-byte file"
    return ""


def load_train_state(path: str | Path) -> dict[str, Any]:
    """A ``train_state.pt`` (optimizer state, step, history, RNG states) read with ``weights_only=True``.

    Only tensors and plain containers are unpickled: a file carrying any other object (a
    pickle payload planted in the run folder) is refused before that object is built, so
    its code never runs.

    Raises:
        MissingFileError: no file at ``path``.
        InputError: the file holds anything but tensors/containers, or is unreadable (names the file and the fix).
    """
    path = Path(path)
    fix = (f"delete {path.name} and the run's checkpoint and train again without --resume "
           "(files written by codex-lab train hold only tensors and numbers)")
    if not path.is_file():
        raise MissingFileError(f"{path}: no such file; train without --resume first")
    why = _zip_sizes_problem(path)
    if why:
        raise InputError(f"{path}: refused, not a training state written by torch.save ({why}); {fix}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for a payload, RuntimeError/EOFError for a truncated file
        # torch's message is a page of advice; the line that matters names the object the file asked for
        found = re.search(r"unsupported (?:global|operand|class)[^\n]*", str(exc), re.I)
        why = found.group(0).strip().rstrip(".") if found else _one_line(exc).split(". ")[0][:120]
        raise InputError(f"{path}: refused, not a training state of plain tensors and numbers ({why}); {fix}") from None
    missing = [k for k in ("optimizer", "step", "history", "elapsed_s", "generator") if not isinstance(state, dict) or k not in state]
    if missing:
        raise InputError(f"{path}: not a training state (missing {missing}); {fix}")
    return state


TUNED_WEIGHTS = "model_f16.safetensors"


def tuned_path() -> Path:
    """Folder of the shipped model fine-tuned on codebench 2 iid (float16 weights + meta)."""
    return Path(__file__).resolve().parents[1] / "assets" / "cb2_tuned"


def save_tuned_weights(folder: str | Path, model: CodexModel, meta: dict[str, Any]) -> Path:
    """Write ``model``'s weights in float16 and ``meta`` (JSON) into ``folder``, atomically per file.

    Only weights: the architecture and the tokenizer are the shipped model's, so
    :func:`load_codebench2_tuned` rebuilds it from those (half the bytes of a float32 copy)."""
    import copy

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    half = copy.deepcopy(model).to(torch.float16)
    tmp = folder / (TUNED_WEIGHTS + ".tmp")
    save_model(half, str(tmp), metadata={"format": "pt"})
    tmp.chmod(0o644)  # an ordinary shipped file (the writer may create it private)
    os.replace(tmp, folder / TUNED_WEIGHTS)
    (folder / (META + ".tmp")).write_text(json.dumps(meta, indent=1, sort_keys=True, default=str) + "\n")
    os.replace(folder / (META + ".tmp"), folder / META)
    return folder


def load_codebench2_tuned(device: torch.device | str | None = None, *, folder: str | Path | None = None) -> Checkpoint:
    """The shipped model fine-tuned on codebench 2's ``iid`` training split
    (``scripts/l05_calibrate_shipped.py --save``), float16 weights read back into float32: the
    release baseline of the server's functional gate. ``meta`` holds the run's scores and provenance.

    Raises:
        MissingFileError: the weights are not shipped (names the command that makes them).
    """
    folder = Path(folder) if folder is not None else tuned_path()
    weights = folder / TUNED_WEIGHTS
    if not weights.is_file():
        raise MissingFileError(f"no fine-tuned weights at {str(weights)!r}; make them with `python "
                               "scripts/l05_calibrate_shipped.py --steps 1000 --n 48 --save codex_lab/assets/cb2_tuned`")
    base = load_pretrained()
    # the file against the shipped config (sizes, bytes on disk, names, shapes) before the model is built
    check_weights_header(weights, base.config, pretrained_path() / CONFIG)
    model = CodexModel(base.config).to(torch.float16)
    try:
        load_model(model, str(weights), strict=True)
    except Exception as exc:  # safetensors/torch raise several types; all mean a bad file
        raise InputError(f"{weights}: cannot load the weights ({_one_line(exc)}); {_REDO}") from None
    model = model.float().eval()
    if device is not None:
        model = model.to(device)
    return Checkpoint(model=model, tokenizer=base.tokenizer, config=base.config, meta=_load_meta(folder / META),
                      path=folder)


def load_pretrained(device: torch.device | str | None = None) -> Checkpoint:
    """The shipped tiny checkpoint, trained on the Python standard library (see its meta)."""
    return load_checkpoint(pretrained_path(), device=device)
