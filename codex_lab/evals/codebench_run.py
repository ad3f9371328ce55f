"""codebench scoring: generation and execution through HumanEval's path, plus a batched fast path.

- :func:`complete` is :func:`codex_lab.evals.humaneval.complete` (the course's engine, greedy
  or sampled, cut at HumanEval's stop strings; an answer ends at ``<|endoftext|>``).
- :func:`execute` is :func:`codex_lab.evals.humaneval.execute`: one sandboxed process per
  program (:func:`codex_lab.sandbox.run_python`) - the reference path, used by
  ``codex-lab eval codebench``.
- :func:`execute_batched` runs many programs in *one* sandboxed process, each in a fresh
  namespace with its own time limit: a sandbox start costs ~0.1-0.3 s, so a lesson that
  scores hundreds of answers per model uses this path. Tests hold it equal to
  :func:`execute`. A batch that dies as a whole (``os._exit``, memory) is rerun one process
  per program. Programs of one batch share the interpreter: a program that rebinds a
  builtin could affect the next one (a model writes no such code; the reference path has
  no such coupling).
- :func:`score` / :func:`family_scores`: mean pass@k with the unbiased estimator
  (:func:`codex_lab.evals.humaneval.pass_at_k`), overall and per family.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Callable, Iterable, Sequence

from codex_lab.evals import humaneval as he
from codex_lab.evals.codebench import FAMILIES, Problem
from codex_lab.sandbox import run_python

SampleResult = he.SampleResult
MAX_NEW_TOKENS = 32  # the longest canonical answer (a testgen assertion) is ~20 tokens

_MARK = "@@codebench-results@@"
_DRIVER = r'''
import contextlib, io, json, signal, sys
_PROGRAMS = json.loads(__PROGRAMS__)
_LIMIT = __LIMIT__
_write = sys.stdout.write
class _Timeout(BaseException):
    pass
def _alarm(signum, frame):
    raise _Timeout()
signal.signal(signal.SIGALRM, _alarm)
_results = []
for _src in _PROGRAMS:
    _ok, _why = False, ""
    _sink = io.StringIO()
    try:
        signal.setitimer(signal.ITIMER_REAL, _LIMIT)
        with contextlib.redirect_stdout(_sink), contextlib.redirect_stderr(_sink):
            exec(compile(_src, "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        _ok = True
    except _Timeout:
        _why = "timed out"
    except SystemExit as _e:  # leaving early is not passing, whatever the code (as the official harness)
        _why = f"SystemExit({_e.code!r}): the program exited before its tests finished"
    except BaseException as _e:
        _why = f"{type(_e).__name__}: {_e}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    _results.append([_ok, "passed" if _ok else _why.strip().splitlines()[-1][:200] if _why.strip() else "failed"])
_write("\n" + "__MARK__" + json.dumps(_results) + "\n")
'''


def complete(model: Any, tokenizer: Any, problems: Sequence[Problem], *, n_samples: int = 1, temperature: float = 0.0,
             top_p: float = 1.0, max_new_tokens: int = MAX_NEW_TOKENS, batch_size: int = 32, seed: int = 0,
             progress: Callable[[], None] | None = None) -> list[list[str]]:
    """``n_samples`` answers per problem from the course's engine (HumanEval's :func:`~he.complete`)."""
    out, _cut = he.complete(model, tokenizer, problems, n_samples=n_samples, temperature=temperature, top_p=top_p,
                            max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed, progress=progress)
    return out


def execute(problems: Sequence[Problem], completions: Sequence[Sequence[str]], *, workers: int | None = None,
            timeout_s: float = 5.0, progress: Callable[[], None] | None = None) -> list[list[SampleResult]]:
    """The reference path: one sandboxed process per program (HumanEval's runner)."""
    return he.execute(problems, completions, workers=workers, timeout_s=timeout_s, memory_mb=512, progress=progress)


def _run_batch(programs: list[str], timeout_s: float) -> list[tuple[bool, str]] | None:
    code = (_DRIVER.replace("__PROGRAMS__", repr(json.dumps(programs))).replace("__LIMIT__", repr(float(timeout_s)))
            .replace("__MARK__", _MARK))
    # the whole batch may use every program's limit, plus the interpreter's start
    res = run_python(code, timeout_s=timeout_s * len(programs) + 10.0, memory_mb=1024)
    at = res.stdout.rfind(_MARK)
    if at < 0:
        return None
    rows = json.loads(res.stdout[at + len(_MARK):].strip())
    return [(bool(ok), str(why)) for ok, why in rows] if len(rows) == len(programs) else None


def execute_batched(problems: Sequence[Problem], completions: Sequence[Sequence[str]], *, batch: int = 256,
                    timeout_s: float = 2.0) -> list[list[SampleResult]]:
    """The fast path: every program of up to ``batch`` answers in one sandboxed process.

    Each program runs with ``exec`` in a fresh namespace under a ``timeout_s`` timer
    (``SIGALRM``), its output discarded; it passes when it finishes without an exception
    (or with ``SystemExit(0)``), the rule of a process of its own. Same results as
    :func:`execute` (tests hold them equal); a batch that produced no result line is rerun
    one process per program.
    """
    if len(completions) != len(problems):
        raise ValueError(f"{len(completions)} completion lists for {len(problems)} problems")
    jobs = [(i, j) for i, cs in enumerate(completions) for j in range(len(cs))]
    out: list[list[SampleResult]] = [[] for _ in problems]
    for start in range(0, len(jobs), batch):
        chunk = jobs[start:start + batch]
        programs = [problems[i].program(completions[i][j]) for i, j in chunk]
        rows = _run_batch(programs, timeout_s)
        if rows is None:  # the batch died as a whole: one process per program
            rows = [(r.passed, r.detail) for r in (he.run_one(problems[i], completions[i][j], timeout_s=timeout_s,
                                                               memory_mb=512) for i, j in chunk)]
        for (i, j), (ok, why) in zip(chunk, rows):
            out[i].append(SampleResult(problems[i].task_id, completions[i][j], ok, why))
    return out


def score(results: Sequence[Sequence[SampleResult]], ks: Iterable[int] = (1,)) -> dict[int, float]:
    """Mean pass@k over problems (HumanEval's estimator), for every k <= samples per problem."""
    return he.score(results, ks)


def family_scores(problems: Sequence[Problem], results: Sequence[Sequence[SampleResult]],
                  ks: Iterable[int] = (1,)) -> dict[str, dict[int, float]]:
    """pass@k per family: ``{family: {k: value}}`` (families with no problem are left out)."""
    ks = tuple(ks)
    out = {}
    for fam in FAMILIES:
        rs = [r for p, r in zip(problems, results) if p.family == fam]
        if rs:
            out[fam] = he.score(rs, ks)
    return out


def half_width(p: float, n: int) -> float:
    """95% half-width of a pass rate ``p`` measured on ``n`` problems (normal approximation).

    ``1.96 * sqrt(p (1 - p) / n)``: at p = 0.5 and n = 128 it is 0.087.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    # h = z_{0.975} sqrt(p (1 - p) / n)
    return 1.96 * math.sqrt(max(p * (1.0 - p), 0.0) / n)


def records(problems: Sequence[Problem], results: Sequence[Sequence[SampleResult]], *, seconds: float, source: str,
            temperature: float | None, ks: Iterable[int] = (1,)) -> list[dict]:
    """Flat JSON records: one per (family, k) and one per k over all families ("all")."""
    ks = tuple(ks)
    n = min(len(rs) for rs in results)
    rows = []
    groups = {**{f: [i for i, p in enumerate(problems) if p.family == f] for f in FAMILIES}, "all": list(range(len(problems)))}
    for fam, idx in groups.items():
        if not idx:
            continue
        rs = [results[i] for i in idx]
        for k, v in he.score(rs, ks).items():
            rows.append({"benchmark": "codebench", "family": fam, "source": source, "problems": len(idx), "k": k,
                         "pass_at_k": round(v, 6), "samples": n, "passed_samples": sum(r.passed for s in rs for r in s),
                         "temperature": temperature, "time_s": round(seconds, 2)})
    return rows


def evaluate(model: Any, tokenizer: Any, problems: Sequence[Problem], *, batched: bool = True,
             max_new_tokens: int = MAX_NEW_TOKENS, batch_size: int = 32) -> tuple[dict[str, float], list[list[SampleResult]]]:
    """Greedy pass@1 of ``model`` per family (and ``"all"``): generation, then execution.

    ``batched`` chooses :func:`execute_batched` (the fast path) or :func:`execute`.
    Returns ({family: pass@1, ..., "all": pass@1}, per-sample results).
    """
    t0 = time.perf_counter()
    comps = complete(model.eval(), tokenizer, problems, max_new_tokens=max_new_tokens, batch_size=batch_size)
    results = execute_batched(problems, comps) if batched else execute(problems, comps)
    out = {f: v[1] for f, v in family_scores(problems, results).items()}
    out["all"] = score(results)[1]
    out["time_s"] = time.perf_counter() - t0
    return out, results
