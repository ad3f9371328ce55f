"""Lessons 05 and 06 exercise checks against wrong answers.

One test per exercise: the reference solution passes, and each plausible wrong answer
fails with feedback that names its bug (the keyword asserted is part of that message).
A weakened check lets one of these through and fails here.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from codex_lab.course.checks import load_all
from codex_lab.course.exercises import load_definitions
from codex_lab.course.grading import FAILED, PASSED, ERROR, run_check

ROOT = Path(__file__).resolve().parents[1]
SOL = {les: load_definitions(next((ROOT / "solutions").glob(f"{les}_*.py"))) for les in ("05", "06")}


def _grade(lesson: str, name: str, fn):
    return run_check(load_all()[(lesson, name)], fn)


def _assert_wrong(lesson: str, name: str, wrongs: dict[str, tuple]) -> None:
    ok = _grade(lesson, name, getattr(SOL[lesson], name))
    assert ok.status == PASSED, ok.message
    for label, (fn, keyword) in wrongs.items():
        r = _grade(lesson, name, fn)
        assert r.status in (FAILED, ERROR), f"wrong answer {label!r} passed"
        assert keyword.lower() in r.message.lower(), f"{label}: feedback {r.message!r} does not name the bug ({keyword!r})"


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
        return float(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1), ignore_index=-100))

    _assert_wrong("05", "masked_token_loss", {
        "mean over every position": (all_positions, "carry loss"),
        "divides by B*T": (divide_by_all, "divided by all"),
        "mean of row means": (row_means, "per-row means"),
        "no log_softmax": (raw_logits, "log_softmax"),
        "shifts again": (shifted, "do not shift"),
        "detached": (detached, "detached"),
        "python float": (as_float, "return a torch tensor"),
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
    })
