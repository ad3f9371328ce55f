"""Shared fixtures. The suite always runs in fast mode (small sizes, few steps); the
notebooks run by nbval inherit the variable, since kernels start from this environment."""

from __future__ import annotations

import os

os.environ.setdefault("CODEX_LAB_FAST", "1")
os.environ.setdefault("CODEX_LAB_MODE", "fast")  # stronger than CODEX_LAB_FAST (codex_lab.runtime)
os.environ.setdefault("MPLBACKEND", "Agg")
# Seeds and arms in this process (codex_lab.parallel): pytest's own workers already hold the cores, and a
# pool's start-up costs more than tiny fast-mode units save; tests of the pool pass jobs= themselves.
os.environ.setdefault("CODEX_LAB_JOBS", "1")
# Two xdist workers (plus the notebook kernels they start) share 2 cores: one math thread
# per process avoids oversubscription, where OpenMP threads spin waiting for each other.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from codex_lab.nn.config import ModelConfig  # noqa: E402
from codex_lab.data.corpus import load_corpus  # noqa: E402
from codex_lab.nn.model import CodexModel  # noqa: E402
from codex_lab.data.tokenizer import CodeTokenizer, train_tokenizer  # noqa: E402

# Also for this process, whatever torch read at import: tiny models' ops are too small to
# split, and two spinning threads per process made engine tests 20-50x slower on 2 busy cores.
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def small_corpus():
    """The first 40 files of the standard library (fast to read and tokenize)."""
    return load_corpus(max_files=40)


@pytest.fixture(scope="session")
def small_tokenizer(small_corpus) -> CodeTokenizer:
    """A 512-token byte-level BPE trained on the small corpus."""
    return train_tokenizer(small_corpus.texts("train"), vocab_size=512)


@pytest.fixture(scope="session")
def tok() -> CodeTokenizer:
    """A 300-token BPE on the first 10 files: the engine tests' tokenizer (one per session)."""
    return train_tokenizer(load_corpus(max_files=10).texts("train"), vocab_size=300)


# How long a test waits for a background compile (or a phase that follows one): a guard against
# a compile that never ends, not a speed goal (a compile's time belongs to the benchmarks).
# Dynamo tracing every bucket of the served step took more than 120 s on 2 cores at a load of
# 8-10 (a clean-clone suite run beside a training and two other test processes, 2026-12-07); a
# healthy compile ends far sooner, and every wait returns as soon as its condition holds.
COMPILE_HANG_S = 900


def seeded_model(tok: CodeTokenizer, **kw) -> CodexModel:
    """A tiny model (seed 0, eval mode) over ``tok``'s vocabulary; ``kw`` override the config."""
    torch.manual_seed(0)
    return CodexModel(tiny_config(vocab_size=tok.vocab_size, **kw)).eval()


def tiny_config(**kw) -> ModelConfig:
    """A 2-layer, 64-wide model config; keyword arguments override fields."""
    base = dict(vocab_size=512, d_model=64, n_layer=2, n_head=4, max_seq_len=128)
    base.update(kw)
    return ModelConfig(**base)


@pytest.fixture
def tiny_model() -> CodexModel:
    """A randomly initialised tiny model in eval mode (seeded)."""
    torch.manual_seed(0)
    return CodexModel(tiny_config()).eval()


@pytest.fixture(autouse=True)
def _no_compile_left_running():
    """Wait for any background compile an earlier test started (``compile_in_background``'s
    ``codex-lab-compile`` threads) before this test starts: dynamo's graph counter, which the
    recompile checks read, is one per process, and a graph finished there mid-test counted as
    this test's recompile (tests/test_mixed_step.py failed so once, 2026-12-06)."""
    import threading

    for t in threading.enumerate():
        if t.name == "codex-lab-compile" and t is not threading.current_thread():
            t.join(timeout=600)  # the longest background compile in the suite takes well under this
    yield
