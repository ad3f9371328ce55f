"""The model a measurement runs on: the shipped checkpoint, or a random model of its shape."""

from __future__ import annotations

import torch

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.nn.model import CodexModel


def load_model_and_tokenizer(random: bool = False) -> tuple[CodexModel, CodeTokenizer]:
    """The shipped checkpoint on CPU, or (``random``) a random model of its shape."""
    if not random:
        from codex_lab.training.checkpoint import load_pretrained

        ck = load_pretrained("cpu")
        return ck.model.eval(), ck.tokenizer
    from codex_lab.nn.config import ModelConfig
    from codex_lab.data.corpus import load_corpus
    from codex_lab.data.tokenizer import train_tokenizer

    tok = train_tokenizer(load_corpus(max_files=30).texts("train"), vocab_size=1024)
    torch.manual_seed(0)
    return CodexModel(ModelConfig(vocab_size=tok.vocab_size)).eval(), tok


__all__ = ["load_model_and_tokenizer"]
