"""Scoring codebench 2: execution (Python in the sandbox, JavaScript under Node), pass@k and its intervals.

- :func:`execute`: Python programs go through the first codebench's batched sandbox path
  (:func:`codex_lab.evals.codebench_run.execute_batched`, or one process per program with
  ``batched=False``); ``translate`` programs run under Node (:mod:`.js`).
- pass@k: the unbiased estimator of Chen et al. 2021, ``1 - C(n-c, k) / C(n, k)`` per problem
  (:func:`codex_lab.evals.humaneval.pass_at_k`), averaged over problems.
- :func:`bootstrap_interval`: the uncertainty from *which problems* were drawn: a
  percentile interval over 2000 resamples of the problems (with replacement, seeded).
- :func:`seed_problem_interval`: the uncertainty from training seeds *and* problems, given
  per-seed, per-problem scores: a two-level (hierarchical) bootstrap: each resample draws
  the seeds with replacement, then, within every drawn seed, its problems with
  replacement, and takes the mean. A single seed reduces it to :func:`bootstrap_interval`;
  many seeds with identical scores reduce it to the problem-level interval; seeds that
  disagree widen it. (The two-stage bootstrap of Davison & Hinkley 1997, section 3.8, for
  nested data.)
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Sequence

import numpy as np

from codex_lab.evals import codebench_run as cr
from codex_lab.evals.codebench2.audit import Audit, audit
from codex_lab.evals.codebench2.js import run_js
from codex_lab.evals.codebench2.problems import FAMILIES, training_tasks
from codex_lab.evals.humaneval import SampleResult, pass_at_k

RESAMPLES = 2000
LEVEL = 0.95


def execute(problems: Sequence[Any], completions: Sequence[Sequence[str]], *, timeout_s: float = 2.0,
            batched: bool = True, workers: int | None = None) -> list[list[SampleResult]]:
    """Run every completion's program; ``results[i][j]`` is problem i's sample j.

    Python: the sandbox (batched, or one process per program); JavaScript (``translate``):
    Node, many programs per process (:func:`.js.run_js`). ``timeout_s``: seconds per program.
    """
    if len(completions) != len(problems):
        raise ValueError(f"{len(completions)} completion lists for {len(problems)} problems")
    out: list[list[SampleResult]] = [[] for _ in problems]
    py = [i for i, p in enumerate(problems) if getattr(p, "language", "python") == "python"]
    js = [i for i, p in enumerate(problems) if getattr(p, "language", "python") == "javascript"]
    if py:
        probs, comps = [problems[i] for i in py], [completions[i] for i in py]
        res = (cr.execute_batched(probs, comps, timeout_s=timeout_s) if batched
               else cr.execute(probs, comps, workers=workers, timeout_s=timeout_s))
        for i, r in zip(py, res):
            out[i] = r
    if js:
        jobs = [(i, j) for i in js for j in range(len(completions[i]))]
        rows = run_js([problems[i].program(completions[i][j]) for i, j in jobs], timeout_s=timeout_s)
        for (i, j), (ok, why) in zip(jobs, rows):
            out[i].append(SampleResult(problems[i].task_id, completions[i][j], ok, why))
    return out


def problem_pass_at_k(results: Sequence[Sequence[SampleResult]], k: int) -> list[float]:
    """pass@k of each problem (unbiased estimator; needs k <= samples of every problem)."""
    return [pass_at_k(len(rs), sum(r.passed for r in rs), k) for rs in results]


def bootstrap_interval(values: Sequence[float], *, resamples: int = RESAMPLES, seed: int = 0,
                       level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of the mean of ``values`` (one per problem) over ``resamples`` resamples of problems.

    Raises:
        ValueError: no values, or ``resamples`` < 1, or ``level`` outside (0, 1).
    """
    if not len(values) or resamples < 1 or not 0.0 < level < 1.0:
        raise ValueError(f"need values, resamples >= 1 and 0 < level < 1; got {len(values)} values, "
                         f"{resamples} resamples, level {level}")
    v = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(v), size=(resamples, len(v)))
    means = v[idx].mean(axis=1)  # (resamples,)
    # [lo, hi] = the (1 - level)/2 and (1 + level)/2 quantiles of the resampled means
    lo, hi = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def seed_problem_interval(scores: Sequence[Sequence[float]], *, resamples: int = RESAMPLES, seed: int = 0,
                          level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, lo, hi) from per-seed, per-problem scores ``scores[s][i]`` (e.g. pass@1 of problem i under seed s).

    The mean is the mean over seeds of each seed's mean over its problems. The interval is a
    two-level bootstrap (see the module docstring): seeds resampled, then problems within
    each resampled seed; seeds may have different problems (each its own evaluation sample).
    """
    if not scores or any(not len(s) for s in scores) or resamples < 1:
        raise ValueError("need at least one seed, each with at least one problem score, and resamples >= 1")
    rows = [np.asarray(s, dtype=np.float64) for s in scores]
    rng = np.random.default_rng(seed)
    n_seeds = len(rows)
    means = np.empty(resamples)
    for b in range(resamples):
        picked = rng.integers(0, n_seeds, size=n_seeds)
        # mean_b = (1 / S) sum_{s in resampled seeds} mean(resampled problems of s)
        means[b] = np.mean([rows[s][rng.integers(0, len(rows[s]), size=len(rows[s]))].mean() for s in picked])
    lo, hi = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(np.mean([r.mean() for r in rows])), float(lo), float(hi)


def score_rows(problems: Sequence[Any], results: Sequence[Sequence[SampleResult]], *, split: str,
               ks: Iterable[int] = (1,), resamples: int = RESAMPLES, seed: int = 0, source: str = "",
               seconds: float = 0.0, audit_result: Audit | None = None) -> list[dict]:
    """Flat records, one per (family, k) and per k over all families (``"all"``), with bootstrap intervals."""
    ks = tuple(ks)
    n = min(len(rs) for rs in results)
    groups = {**{f: [i for i, p in enumerate(problems) if p.family == f] for f in FAMILIES},
              "all": list(range(len(problems)))}
    rows = []
    for fam, idx in groups.items():
        if not idx:
            continue
        rs = [results[i] for i in idx]
        for k in (k for k in ks if k <= n):
            vals = problem_pass_at_k(rs, k)
            lo, hi = bootstrap_interval(vals, resamples=resamples, seed=seed)
            row = {"benchmark": "codebench2", "split": split, "family": fam, "source": source, "k": k,
                   "pass_at_k": round(float(np.mean(vals)), 6), "lo": round(lo, 6), "hi": round(hi, 6),
                   "problems": len(idx), "samples": n, "passed_samples": sum(r.passed for s in rs for r in s),
                   "time_s": round(seconds, 2)}
            if audit_result is not None:
                row |= {"near_duplicates": audit_result.near, "exact_duplicates": audit_result.exact,
                        "audited": audit_result.test_items}
            rows.append(row)
    return rows


def split_audit(split: str, problems: Sequence[Any]) -> Audit:
    """The near-duplicate audit of ``problems`` against ``split``'s whole training set (every family, train + val)."""
    fams = sorted({p.family for p in problems}, key=lambda f: FAMILIES.index(f))
    ts = training_tasks(split, fams)
    train = [e for d in ts.examples.values() for exs in d.values() for e in exs]
    return audit(problems, train)


def format_rows(rows: Sequence[dict]) -> list[str]:
    """One printed line per record: split, family, pass@k with its 95% bootstrap interval over problems."""
    return [f"{r['benchmark']} {r['split']:<7} {r['source']} {r['family']:<10}: pass@{r['k']} = {r['pass_at_k']:.4f} "
            f"(95% bootstrap over problems [{r['lo']:.3f}, {r['hi']:.3f}]) over {r['problems']} problems "
            f"({r['samples']} samples each, {r['time_s']:.1f} s)" for r in rows]


def score_canonical(split: str, families: Sequence[str] = FAMILIES, *, n: int | None = None, seed: int = 0,
                    part: str = "test") -> tuple[list[dict], Audit]:
    """The oracle run: the canonical answers of ``split`` scored through :func:`execute` (must be 1.0 everywhere)."""
    from codex_lab.evals.codebench2.problems import canonical_completions, load_problems

    t0 = time.perf_counter()
    problems = load_problems(split, families, part=part, n=n, seed=seed)
    results = execute(problems, canonical_completions(problems))
    au = split_audit(split, problems)
    return score_rows(problems, results, split=split, source="canonical", seconds=time.perf_counter() - t0,
                      audit_result=au), au
