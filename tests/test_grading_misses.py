"""The plausible wrong answers that passed the checks before (issue 26, item 4), one test
each: every one now fails with feedback naming its bug; a correct answer returning NumPy
scalars passes; answers hard-coded for the checks' fixed inputs fail on the drawn ones."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from codex_lab.course.checks import load_all
from codex_lab.course.exercises import load_definitions
from codex_lab.course.outcome import ERROR, FAILED, PARTIAL, PASSED, run_check

ROOT = Path(__file__).resolve().parents[1]


def _sol(lesson: str) -> Any:
    return load_definitions(next((ROOT / "solutions").glob(f"{lesson}_*.py")))


def _grade(lesson: str, name: str, fn: Callable[..., Any]):
    return run_check(load_all()[(lesson, name)], fn)


def _fails(lesson: str, name: str, fn: Callable[..., Any], keyword: str) -> None:
    r = _grade(lesson, name, fn)
    assert r.status in (FAILED, ERROR, PARTIAL) and r.points < r.max_points, f"{name}: the wrong answer got {r.status}"
    assert re.search(keyword, r.message, re.I), f"{name}: feedback {r.message!r} does not name the bug ({keyword!r})"


def _naive_softmax(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    e = torch.exp(s)  # no row max subtracted: overflows for scores > 88.7
    return e / e.sum(dim, keepdim=True)


def test_softmax_without_the_row_max_fails():
    def probs(q, k):
        T, D = q.shape[-2], q.shape[-1]
        s = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        return _naive_softmax(s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")))

    _fails("01", "causal_attention_probs", probs, "row's max")

    def cached(kb, vb, n, q, k, v):
        kb[:, :, n : n + 1], vb[:, :, n : n + 1] = k, v
        s = q @ kb[:, :, : n + 1].transpose(-2, -1) / math.sqrt(q.shape[-1])
        return _naive_softmax(s) @ vb[:, :, : n + 1]

    _fails("06", "cached_attention", cached, "row's max")

    def route(logits, k):
        p = _naive_softmax(logits)
        top = p.topk(k, dim=-1)
        return top.indices, top.values / top.values.sum(-1, keepdim=True)

    _fails("04", "top_k_route", route, "row's max")


def test_tiles_one_row_and_column_short_fail():
    def tiles(mask, block):
        n = mask.shape[0]
        nb = -(-n // block)
        return [(a, b) for a in range(nb) for b in range(nb)
                if bool(mask[a * block : (a + 1) * block - 1, b * block : (b + 1) * block - 1].any())]

    _fails("02", "touched_tiles", tiles, "exclusive")


def test_scaling_the_callers_q_in_place_fails():
    def cached(kb, vb, n, q, k, v):
        kb[:, :, n : n + 1], vb[:, :, n : n + 1] = k, v
        q *= 1 / math.sqrt(q.shape[-1])  # the caller's q, scaled in place
        return torch.softmax(q @ kb[:, :, : n + 1].transpose(-2, -1), -1) @ vb[:, :, : n + 1]

    _fails("06", "cached_attention", cached, "changed the caller's q in place")

    def probs(q, k):
        T = q.shape[-2]
        q /= math.sqrt(q.shape[-1])
        s = q @ k.transpose(-2, -1)
        return torch.softmax(s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")), -1)

    _fails("01", "causal_attention_probs", probs, "argument `q` in place")


def test_routing_weights_detached_from_the_graph_fail():
    def route(logits, k):
        top = torch.softmax(logits, -1).topk(k, dim=-1)
        w = top.values / top.values.sum(-1, keepdim=True)
        return top.indices, w.detach()

    _fails("04", "top_k_route", route, "detached")


def test_writing_into_the_callers_expert_idx_fails():
    sol = _sol("04").capacity_mask

    def capacity(idx, n_experts, capacity):
        keep = sol(idx, n_experts, capacity)
        idx[~keep] = -1  # marks dropped assignments in the caller's tensor
        return keep

    _fails("04", "capacity_mask", capacity, "argument `expert_idx` in place")


def test_empty_slots_found_as_all_zero_keys_fail():
    def cached(kb, vb, n, q, k, v):
        kb[:, :, n : n + 1], vb[:, :, n : n + 1] = k, v
        s = q @ kb.transpose(-2, -1) / math.sqrt(q.shape[-1])
        empty = (kb.abs().sum(-1) == 0)[:, :, None, :]  # "empty" = all-zero key: wrong for a reused cache
        return torch.softmax(s.masked_fill(empty, float("-inf")), -1) @ vb

    _fails("06", "cached_attention", cached, "not empty because it is zero|reused")


def test_passes_gates_relative_tolerance_and_missing_as_zero_fail():
    def relative(c, b, t):
        return all(g in c and c[g] >= v * (1 - t.get(g, 0.0)) for g, v in b.items())

    def missing_is_zero(c, b, t):
        return all(c.get(g, 0.0) >= v - t.get(g, 0.0) for g, v in b.items())

    _fails("07", "passes_gates", relative, "absolute")
    _fails("07", "passes_gates", missing_is_zero, "not a score of 0.0")


def test_numpy_scalars_are_accepted_where_bool_or_float_is_asked():
    gates = _sol("07").passes_gates
    assert _grade("07", "passes_gates", lambda c, b, t: np.bool_(gates(c, b, t))).status == PASSED
    cpt = _sol("00").chars_per_token
    assert _grade("00", "chars_per_token", lambda tok, texts: np.float64(cpt(tok, texts))).status == PASSED


def test_answers_hard_coded_for_the_fixed_inputs_fail():
    ttft = _sol("07").ttft_tbt
    fixed = {(10.0, (10.08, 10.095, 10.125)): ttft(10.0, [10.08, 10.095, 10.125]), (0.0, (0.5,)): ttft(0.0, [0.5]),
             (0.0, ()): ttft(0.0, [])}
    _fails("07", "ttft_tbt", lambda a, ts: fixed.get((a, tuple(ts)), (0.0, [])), "drawn for this run")

    kv = _sol("03").kv_cache_bytes
    table = {c: kv(*c) for c in [(6, 3, 64, 1000, 5, 4), (4, 4, 64, 1024, 3, 4), (24, 2, 64, 32768, 2, 2),
                                 (28, 4, 128, 32768, 8, 2), (1, 1, 2, 3, 5, 1)]}
    _fails("03", "kv_cache_bytes", lambda *a: table.get(a, 0), "expected")

    sched = _sol("06").schedule_step
    seen = {}
    for args in [([(1, 16), (2, 17), (3, 5)], 0, 10, 8, 16), ([(1, 16), (2, 17), (3, 5)], 0, 3, 8, 16),
                 ([(1, 40), (2, 4)], 0, 2, 8, 16), ([(1, 4), (2, 4), (3, 4)], 6, 99, 8, 16), ([], 0, 5, 8, 16),
                 ([(7, 33), (8, 1)], 1, 4, 4, 16), ([(1, 20), (2, 20), (3, 20)], 0, 4, 8, 16), ([(1, 10), (2, 10)], 0, 1, 8, 16)]:
        seen[repr(args)] = sched(*args)
    _fails("06", "schedule_step", lambda *a: seen.get(repr((list(a[0]), *a[1:])), []), "schedule_step")


def test_drawn_inputs_change_between_runs():
    import subprocess
    import sys

    import os

    code = "from codex_lab.course.check_tools import pyrng; print(pyrng('x').random())"
    env = {k: v for k, v in os.environ.items() if k != "CODEX_LAB_CHECK_SEED"}
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
            for _ in range(2)}
    assert len(outs) == 2, "two grading processes drew the same inputs"
