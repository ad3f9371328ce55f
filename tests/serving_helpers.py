"""Helpers the server tests share (tests/test_server.py, tests/test_engine_process.py)."""

from __future__ import annotations

import time

import torch

from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.serve.router import ModelServer


def make_model(vocab: int, seed: int = 0) -> CodexModel:
    """A small 2-layer model the servers serve (seeded)."""
    torch.manual_seed(seed)
    return CodexModel(ModelConfig(vocab_size=vocab, d_model=64, n_layer=2, n_head=4, max_seq_len=256)).eval()


def wait_idle(srv: ModelServer, timeout: float = 120.0) -> dict:
    """Wait until the server holds no request and no KV memory; its health then."""
    # a hang guard, not a speed goal: the engine frees the finished requests' memory on its next step
    # (an engine process also reports it in its next stats message), which a loaded 2-core machine
    # can delay by seconds; it returns as soon as idle
    t0 = time.time()
    while time.time() - t0 < timeout:
        h = srv.health()
        if h["in_flight"] == 0 and h["running"] == 0 and h["waiting"] == 0 and h["kv_used_tokens"] == 0:
            return h
        time.sleep(0.05)
    raise AssertionError(f"server not idle after {timeout} s: {srv.health()}")


def run_greedy(eng, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Submit each prompt for ``n`` tokens (end-of-text ignored) to an engine, step it until it is
    idle, and return each request's tokens in submission order."""
    from codex_lab.infer.sampling import SamplingParams

    for p in prompts:
        eng.submit(p, SamplingParams(max_tokens=n, ignore_eos=True))
    done = {}
    while eng.has_work():
        done.update({f.rid: f.output_ids for f in eng.step()})
    return [done[r] for r in sorted(done)]
