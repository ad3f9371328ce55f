"""Lessons 05 and 06 exercise checks against wrong answers.

One test per exercise: the reference solution passes, and each plausible wrong answer
fails with feedback that names its bug (the keyword asserted is part of that message).
A weakened check lets one of these through and fails here.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

import codex_lab as cl
from codex_lab.training import balancing

from codex_lab.course.checks import load_all
from codex_lab.course.exercises import load_definitions
from codex_lab.course.outcome import ERROR, FAILED, PARTIAL, PASSED, run_check

ROOT = Path(__file__).resolve().parents[1]
SOL = {les: load_definitions(next((ROOT / "solutions").glob(f"{les}_*.py"))) for les in ("05", "06")}


def _grade(lesson: str, name: str, fn):
    return run_check(load_all()[(lesson, name)], fn)


def _assert_wrong(lesson: str, name: str, wrongs: dict[str, tuple]) -> None:
    ok = _grade(lesson, name, getattr(SOL[lesson], name))
    assert ok.status == PASSED and ok.points == ok.max_points, ok.message
    for label, (fn, keyword) in wrongs.items():
        r = _grade(lesson, name, fn)
        assert r.status in (FAILED, ERROR, PARTIAL) and r.points < r.max_points, f"wrong answer {label!r} passed"
        assert keyword.lower() in r.message.lower(), f"{label}: feedback {r.message!r} does not name the bug ({keyword!r})"


SHORTCUT = "write this one yourself"  # the grader's words when a package answer is called


# ====================================================================== lesson 05
def _nll(logits, targets):
    return -F.log_softmax(logits.float(), -1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]


def test_masked_token_loss_wrong_answers():
    def all_positions(lg, y):
        return _nll(lg, y).mean()

    def divide_by_all(lg, y):
        v = (y != -100).float()
        return (_nll(lg, y) * v).sum() / y.numel()

    def row_means(lg, y):
        v = (y != -100).float()
        return ((_nll(lg, y) * v).sum(1) / v.sum(1)).mean()

    def raw_logits(lg, y):
        v = (y != -100).float()
        return (-lg.gather(-1, y.clamp(min=0)[..., None])[..., 0] * v).sum() / v.sum()

    def shifted(lg, y):
        v = (y[:, 1:] != -100).float()
        return (_nll(lg[:, :-1], y[:, 1:]) * v).sum() / v.sum()

    def detached(lg, y):
        v = (y != -100).float()
        return ((_nll(lg, y) * v).sum() / v.sum()).detach()

    def as_float(lg, y):
        return float(F.cross_entropy(lg.detach().reshape(-1, lg.shape[-1]), y.reshape(-1), ignore_index=-100))

    def zero_is_padding(lg, y):  # the red team's miss: token id 0 treated as padding
        v = (y > 0).float()
        return (_nll(lg, y) * v).sum() / v.sum()

    _assert_wrong("05", "masked_token_loss", {
        "mean over every position": (all_positions, "carry loss"),
        "divides by B*T": (divide_by_all, "divided by all"),
        "mean of row means": (row_means, "per-row means"),
        "no log_softmax": (raw_logits, "log_softmax"),
        "shifts again": (shifted, "do not shift"),
        "detached": (detached, "detached"),
        "python float via F.cross_entropy": (as_float, "write this one yourself"),  # the built-in is off limits
        "target 0 as padding": (zero_is_padding, "token id 0 is a real token"),
        "package token_losses": (lambda lg, y: cl.token_losses(lg, y).sum() / (y != -100).sum(), SHORTCUT),
        "package balancer": (lambda lg, y: cl.make_balancer("token", 1)(cl.token_losses(lg, y), y, torch.zeros(len(y), dtype=torch.long))[0], SHORTCUT),
    })


def test_task_token_mean_loss_wrong_answers():
    def pooled(tl, y, task, K):
        v = (y != -100).float()
        return (tl * v).sum() / v.sum()

    def sample_means(tl, y, task, K):
        v = (y != -100).float()
        return ((tl * v).sum(1) / v.sum(1)).mean()

    def divide_by_k(tl, y, task, K):
        v = (y != -100).float()
        return sum((tl * v)[task == k].sum() / v[task == k].sum().clamp(min=1) for k in range(K)) / K

    def no_mask(tl, y, task, K):
        means = [tl[task == k].mean() for k in range(K) if (task == k).any()]
        return torch.stack(means).mean()

    def per_row_count(tl, y, task, K):
        v = (y != -100).float()
        means = [(tl * v)[task == k].sum() / (task == k).sum() for k in range(K) if (task == k).any()]
        return torch.stack(means).mean()

    _assert_wrong("05", "task_token_mean_loss", {
        "pooled token mean": (pooled, "pooled token mean"),
        "mean of sample means": (sample_means, "per-sample means"),
        "absent task counted": (divide_by_k, "tasks present only"),
        "masked positions counted": (no_mask, "masked positions"),
        "divides by rows": (per_row_count, "number of rows"),
        "package case 3": (lambda tl, y, task, K: cl.make_balancer("task_token", K)(tl, y, task)[0], SHORTCUT),
    })


def _slopes(h):
    W = h.shape[0]
    x = torch.arange(W, dtype=h.dtype) - (W - 1) / 2
    return (x[:, None] * (h - h.mean(0))).sum(0) / (x**2).sum()


def _w(a, floor, cut=True, sign=1.0, k_factor=True, use_floor=True):
    K = a.numel()
    r = torch.softmax(sign * (K if k_factor else 1) * a / a.abs().sum(), 0)
    if cut:
        r = torch.where(a > 0, torch.zeros_like(r), r)
    r = r / r.sum()
    return floor + (1 - K * floor) * r if use_floor else r


def test_convergence_weights_wrong_answers():
    def not_normalised(h, floor):
        return _w(_slopes(h), floor)

    def no_cut(h, floor):
        return _w(_slopes(h / h[0]), floor, cut=False)

    def no_floor(h, floor):
        return _w(_slopes(h / h[0]), floor, use_floor=False)

    def reversed_softmax(h, floor):
        return _w(_slopes(h / h[0]), floor, sign=-1.0)

    def endpoints(h, floor):
        n = h / h[0]
        return _w((n[-1] - n[0]) / (h.shape[0] - 1), floor)

    def no_k(h, floor):
        return _w(_slopes(h / h[0]), floor, k_factor=False)

    _assert_wrong("05", "convergence_weights", {
        "not normalised": (not_normalised, "normalise each task"),
        "diverging task not cut": (no_cut, "rises"),
        "no floor": (no_floor, "at least the floor"),
        "softmax reversed": (reversed_softmax, "wrong way round"),
        "endpoint slope": (endpoints, "least-squares"),
        "no K factor": (no_k, "factor K"),
        "package coba_weights": (lambda h, floor: balancing.coba_weights(balancing.slopes(h / h[0]), floor=floor), SHORTCUT),
    })


# ====================================================================== lesson 06
def _attn(q, k, v, scale=True, dim=-1):
    s = q @ k.transpose(-2, -1)
    if scale:
        s = s / math.sqrt(q.shape[-1])
    return torch.softmax(s, dim=dim) @ v


def test_cached_attention_wrong_answers():
    def all_slots(kb, vb, n, q, k, v):
        kb[:, :, n : n + 1], vb[:, :, n : n + 1] = k, v
        return _attn(q, kb, vb)

    def without_new(kb, vb, n, q, k, v):
        out = _attn(q, kb[:, :, :n], vb[:, :, :n]) if n else torch.zeros_like(q)
        kb[:, :, n : n + 1], vb[:, :, n : n + 1] = k, v
        return out

    def no_write(kb, vb, n, q, k, v):
        kk = torch.cat([kb[:, :, :n], k], 2)
        vv = torch.cat([vb[:, :, :n], v], 2)
        return _attn(q, kk, vv)

    def off_by_one(kb, vb, n, q, k, v):
        kb[:, :, n + 1 : n + 2], vb[:, :, n + 1 : n + 2] = k, v
        return _attn(q, kb[:, :, : n + 2], vb[:, :, : n + 2])

    def unscaled(kb, vb, n, q, k, v):
        kb[:, :, n : n + 1], vb[:, :, n : n + 1] = k, v
        return _attn(q, kb[:, :, : n + 1], vb[:, :, : n + 1], scale=False)

    def static_cache(kb, vb, n, q, k, v):
        c = cl.StaticKVCache(kb.shape[0], kb.shape[1], kb.shape[3], kb.shape[2])
        c.k, c.v, c.length = kb, vb, n
        c.pos[:, :n] = torch.arange(n)
        kk, vv, _ = c.update(k, v, torch.full((kb.shape[0], 1), n))
        return _attn(q, kk, vv)

    def wrong_axis(kb, vb, n, q, k, v):
        kb[:, :, n : n + 1], vb[:, :, n : n + 1] = k, v
        return _attn(q, kb[:, :, : n + 1], vb[:, :, : n + 1], dim=-2)

    _assert_wrong("06", "cached_attention", {
        "attends to empty slots": (all_slots, "past `length`"),
        "leaves out the new token": (without_new, "new token is left out"),
        "never writes the buffer": (no_write, "in place"),
        "writes slot length + 1": (off_by_one, "next free one"),
        "no 1/sqrt(D)": (unscaled, "sqrt(D)"),
        "softmax over queries": (wrong_axis, "wrong axis"),
        "package StaticKVCache": (static_cache, SHORTCUT),
    })


def _nucleus(logits, p, *, crossing=True, descending=True, scatter=True, per_row=True, fill=float("-inf")):
    x = logits if per_row else logits.reshape(1, -1)
    s, order = torch.sort(x, dim=-1, descending=descending)
    pr = torch.softmax(s, -1)
    drop = (pr.cumsum(-1) - pr >= p) if crossing else (pr.cumsum(-1) > p)
    s = s.masked_fill(drop, fill)
    if not scatter:
        return s.reshape(logits.shape)
    return torch.full_like(x, fill).scatter(-1, order, s).reshape(logits.shape)


def test_nucleus_filter_wrong_answers():
    _assert_wrong("06", "nucleus_filter", {
        "stops before the crossing token": (lambda lg, p: _nucleus(lg, p, crossing=False), "crosses p"),
        "keeps the least likely": (lambda lg, p: _nucleus(lg, p, descending=False), "least likely"),
        "never scatters back": (lambda lg, p: _nucleus(lg, p, scatter=False), "sorted order"),
        "whole batch as one row": (lambda lg, p: _nucleus(lg, p, per_row=False), "per row"),
        "fills with 0": (lambda lg, p: _nucleus(lg, p, fill=0.0), "-inf"),
        "package top_p_filter": (lambda lg, p: cl.top_p_filter(lg, p), SHORTCUT),
        "package function itself": (cl.top_p_filter, SHORTCUT),
    })


def _schedule(waiting, n_running, free, max_batch, bs, *, decrement=True, floor=False, skip=False, ignore_running=False, strict=False):
    out = []
    for rid, tokens in waiting:
        need = tokens // bs if floor else math.ceil(tokens / bs)
        if (0 if ignore_running else n_running) + len(out) >= max_batch:
            break
        if need > free or (strict and need >= free):
            if skip:
                continue
            break
        if decrement:
            free -= need
        out.append(rid)
    return out


def test_schedule_step_wrong_answers():
    from collections import deque

    from codex_lab.infer.engine import scheduler

    def package_admit(waiting, n_running, free, max_batch, bs):
        pool = cl.PagedKVPool(1, 1, 1, free, bs)
        reqs = deque(scheduler.Request(rid, [1] * tokens, cl.SamplingParams(max_tokens=1), None, None, 0.0, -(-tokens // bs), None)
                     for rid, tokens in waiting)
        return [r.rid for r in scheduler.admit(reqs, dict.fromkeys(range(n_running)), max_batch, pool)]

    def variant(**kw):
        return lambda *a: _schedule(*a, **kw)

    _assert_wrong("06", "schedule_step", {
        "free blocks not decremented": (variant(decrement=False), "free blocks are not used up"),
        "floor instead of ceil": (variant(floor=True), "rounded down"),
        "overtaking": (variant(skip=True), "no overtaking"),
        "running requests ignored": (variant(ignore_running=True), "count the running"),
        "exact fit refused": (variant(strict=True), "exactly the free blocks"),
        "package admit": (package_admit, SHORTCUT),
    })


def test_expected_tokens_wrong_answers():
    """Lesson 06's derivation: the expected tokens of one speculative round when each guess has
    its own acceptance rate. Each plausible wrong derivation fails, named."""
    def rates(p, q):
        return torch.minimum(p[:-1], q).sum(-1)

    def no_bonus(p, q):
        alive, total = 1.0, 0.0
        for b in rates(p, q).tolist():
            alive *= b
            total += alive
        return total

    def mean_rate(p, q):
        a, gamma = float(rates(p, q).mean()), q.shape[0]
        return gamma + 1.0 if a == 1.0 else (1 - a ** (gamma + 1)) / (1 - a)

    def added(p, q):
        return 1.0 + float(rates(p, q).sum())

    def product_rate(p, q):
        alive, total = 1.0, 1.0
        for b in (p[:-1] * q).sum(-1).tolist():
            alive *= b
            total += alive
        return total

    _assert_wrong("06", "expected_tokens", {
        "no correction or bonus token": (no_bonus, "bonus token"),
        "the constant-rate formula at the mean rate": (mean_rate, "mean rate"),
        "rates added, not multiplied": (added, "multiply the rates"),
        "p q in place of min(p, q)": (product_rate, "sum_x min(p, q)"),
        "a constant": (lambda p, q: 2.0, "expected_tokens"),
        "the package's constant-rate helper": (lambda p, q: cl.expected_tokens_per_round(0.5, q.shape[0]), SHORTCUT),
    })
