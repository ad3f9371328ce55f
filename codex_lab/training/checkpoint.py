"""Checkpoints on disk: ``model.safetensors`` + ``config.json`` + ``tokenizer.json`` + ``meta.json``.

Writes are atomic: everything goes into a temporary sibling folder that is renamed into
place only when complete, so a crash mid-write never leaves a half checkpoint behind.
The shipped tiny checkpoint lives in the package (``codex_lab/assets/tiny``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.data.tokenizer import CodeTokenizer

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


def save_checkpoint(
    path: str | Path, model: CodexModel, tokenizer: CodeTokenizer, meta: dict[str, Any] | None = None
) -> Path:
    """Write a checkpoint folder atomically (replacing any folder already at ``path``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is an ordinary folder
    try:
        save_model(model, str(tmp / WEIGHTS), metadata={"format": "pt"})
        model.cfg.save(tmp / CONFIG)
        tokenizer.save(tmp / TOKENIZER)
        (tmp / META).write_text(json.dumps(meta or {}, indent=2, sort_keys=True, default=str) + "\n")
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
    """Read a checkpoint folder written by :func:`save_checkpoint`.

    Raises:
        FileNotFoundError: the folder or one of its files is missing (names which).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"no checkpoint folder at {str(path)!r}; train one with `codex-lab train` "
            "or use the shipped one (codex_lab.load_pretrained())"
        )
    missing = [n for n in (WEIGHTS, CONFIG, TOKENIZER) if not (path / n).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint {str(path)!r} is incomplete: missing {missing}")
    cfg = ModelConfig.load(path / CONFIG)
    model = CodexModel(cfg)
    load_model(model, str(path / WEIGHTS), strict=True)
    if device is not None:
        model = model.to(device)
    model.eval()
    meta = json.loads((path / META).read_text()) if (path / META).is_file() else {}
    return Checkpoint(model=model, tokenizer=CodeTokenizer.load(path / TOKENIZER), config=cfg, meta=meta, path=path)


def load_pretrained(device: torch.device | str | None = None) -> Checkpoint:
    """The shipped tiny checkpoint, trained on the Python standard library (see its meta)."""
    return load_checkpoint(pretrained_path(), device=device)
