"""Release gates: a fixed prompt suite scored on syntax, function, style and latency.

A candidate model passes only if it is no worse than the baseline on every gate
(:func:`gate_decision`). The gates:

- syntax: share of problems whose prompt + generated body parses (``ast``) with a
  non-empty body (a docstring-only function parses but is not an answer);
- functional: pass@1 on codebench 2's ``iid`` split (:mod:`codex_lab.evals.codebench2`:
  held-out programs of the training distribution, :data:`BENCH_PER_FAMILY` per family:
  completion, bug fix, test generation, fill-in-the-middle and, where Node is installed,
  Python -> JavaScript translation), each answer run by execution (Python in the sandbox,
  ``codex_lab.sandbox.run_python``: time and memory limits, no network; JavaScript by Node).
  A model this small scores 0 on hand-written prompts like :data:`SUITE`'s, so a functional
  gate on them cannot tell a good model from a damaged one; the release baseline is the
  shipped model fine-tuned on codebench 2 iid (``load_codebench2_tuned``: 4 of 5 families in
  the 20-80% band), so damage shows. ``bench="legacy"`` keeps the first codebench (one-line
  templates, where a copied template with a swapped constant passes). Scoring a custom
  ``suite`` without ``bench`` falls back to the suite's own tests;
- style: an explicit consistency measure of the generated lines against the prompt's own
  conventions (:func:`style_consistency`): 4-space indentation, no tabs, snake_case names,
  lines <= 79 characters;
- latency: SLO attainment, the share of first tokens within 100 ms and of gaps between
  tokens within 20 ms (the seed's targets).
"""

from __future__ import annotations

import ast
import math
import re
import secrets
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from codex_lab.evals import codebench as cb
from codex_lab.evals import codebench_run as cr
from codex_lab.infer.syntax import cut_function, parses
from codex_lab.sandbox import run_python

TTFT_SLO_S, TBT_SLO_S = 0.1, 0.02
BENCH_PER_FAMILY = 8  # 40 held-out codebench 2 problems (32 without Node): one sandboxed process per language
# the longest canonical codebench 2 answer (a 4-operation translation) is ~110 tokens; a tuned model ends earlier
BENCH_MAX_TOKENS = 160


@dataclass(frozen=True)
class Problem:
    """One suite entry: a prompt (signature + docstring) and tests that call the function.

    The prompt stops right after the docstring's closing quotes, without the newline: a
    byte-level BPE model writes newline + indentation as one token, so a prompt that ends
    in a bare newline leaves it off its usual path (it then tends to end the function).
    """

    name: str
    prompt: str
    tests: str


SUITE: tuple[Problem, ...] = (
    Problem("add", 'def add(a, b):\n    """Return the sum of a and b."""', "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"),
    Problem("is_even", 'def is_even(n):\n    """Return True if n is even."""', "assert is_even(4)\nassert not is_even(7)\n"),
    Problem("maximum", 'def maximum(items):\n    """Return the largest item of a non-empty list."""',
            "assert maximum([3, 9, 2]) == 9\nassert maximum([-5]) == -5\n"),
    Problem("reverse", 'def reverse(text):\n    """Return text reversed."""', "assert reverse('abc') == 'cba'\nassert reverse('') == ''\n"),
    Problem("factorial", 'def factorial(n):\n    """Return n! for n >= 0."""', "assert factorial(0) == 1\nassert factorial(5) == 120\n"),
    Problem("count_vowels", 'def count_vowels(text):\n    """Return the number of vowels (aeiou) in text."""',
            "assert count_vowels('banana') == 3\nassert count_vowels('xyz') == 0\n"),
    Problem("square_all", 'def square_all(numbers):\n    """Return a list of the squares of numbers."""',
            "assert square_all([1, 2, 3]) == [1, 4, 9]\nassert square_all([]) == []\n"),
    Problem("first_word", 'def first_word(line):\n    """Return the first whitespace-separated word of line."""',
            "assert first_word('hello big world') == 'hello'\n"),
)

_SNAKE = re.compile(r"^_{0,2}[a-z][a-z0-9_]*$|^_$|^[A-Z][A-Z0-9_]*$")  # snake_case or CONSTANT


@dataclass
class Sample:
    """One generated answer: the body, and token timestamps (seconds) if measured."""

    body: str
    arrival: float | None = None
    token_times: list[float] = field(default_factory=list)


@dataclass
class GateReport:
    """Scores of one model on the suite (each in [0, 1]) and the raw samples."""

    syntax: float
    functional: float
    style: float
    ttft_attainment: float
    tbt_attainment: float
    ttft_p95_s: float
    tbt_p95_s: float
    samples: list[tuple[str, str, bool, bool, float]] = field(default_factory=list)  # name, body, parses, passes, style
    bench_passed: list[bool] = field(default_factory=list)  # per codebench problem, when the functional gate ran one
    bench_rows: list[tuple[bool, float]] = field(default_factory=list)  # (parses, style) per Python codebench 2 answer

    def per_item(self, gate: str) -> list[float]:
        """One score per problem of ``gate`` ("syntax", "functional" or "style"), in problem order:
        what a paired comparison of two models on the same problems needs. Syntax and style: the
        suite's problems, then the Python codebench 2 answers of the functional gate (each
        assembled into the file that runs it, :meth:`~codex_lab.evals.codebench2.problems.Problem.program`)."""
        if gate == "functional":
            return [float(x) for x in self.bench_passed] if self.bench_passed else [float(r[3]) for r in self.samples]
        col = {"syntax": 2, "style": 4}.get(gate)
        if col is None:
            raise ValueError(f"gate {gate!r} has no per-problem scores; one of syntax, functional, style")
        return [float(r[col]) for r in self.samples] + [float(r[col // 2 - 1]) for r in self.bench_rows]

    def scores(self) -> dict[str, float]:
        """The gated numbers (higher is better for each)."""
        return {"syntax": self.syntax, "functional": self.functional, "style": self.style,
                "ttft_attainment": self.ttft_attainment, "tbt_attainment": self.tbt_attainment}


def style_consistency(prompt: str, body: str) -> float:
    """Share of the body's checks that follow the prompt's conventions, in [0, 1].

    Per non-blank line: indentation is a multiple of 4 spaces (no tabs), and the line is at
    most 79 characters; per name the body binds (assignments, arguments, functions): it
    is snake_case (or an UPPER_CASE constant). An empty body scores 0 (nothing to judge is
    not good style). The prompts in :data:`SUITE` follow all of these conventions.
    """
    del prompt  # the suite's prompts fix the conventions; kept for the signature's meaning
    lines = [ln for ln in body.splitlines() if ln.strip()]
    if not lines:
        return 0.0
    checks: list[bool] = []
    for ln in lines:
        indent = ln[: len(ln) - len(ln.lstrip())]
        checks.append("\t" not in indent and len(indent) % 4 == 0)
        checks.append(len(ln) <= 79)
    names: list[str] = []
    try:
        tree = ast.parse("def _f():\n" + "\n".join("    " + ln for ln in lines))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.append(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "_f":
                names.append(node.name)
            elif isinstance(node, ast.arg):
                names.append(node.arg)
    except SyntaxError:
        pass  # names are only judged when the body parses; the syntax gate scores the rest
    checks += [bool(_SNAKE.match(n)) for n in names]
    # consistency = checks passed / checks made
    return sum(checks) / len(checks)


def functional_pass(problem: Problem, body: str, *, timeout_s: float = 5.0) -> bool:
    """True when prompt + body + the problem's tests run to completion in the sandbox."""
    code = problem.prompt + body
    if not parses(code):
        return False
    # passed = the tests ran to their end (an early sys.exit(0) / os._exit(0) is not a pass)
    marker = f"codex-lab-tests-finished-{secrets.token_hex(8)}"
    res = run_python(code + "\n\n" + problem.tests + f"\n\nprint({marker!r}, flush=True)\n", timeout_s=timeout_s,
                     memory_mb=256)
    return res.ok and res.stdout.rstrip().endswith(marker)


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation; nan for no data."""
    if not xs:
        return math.nan
    s = sorted(xs)
    # rank = q/100 * (n - 1), interpolated between its neighbours
    pos = q / 100 * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def bench_problems(per_family: int = BENCH_PER_FAMILY, seed: int = 0, *, split: str = "iid") -> list[Any]:
    """The functional gate's problems: ``per_family`` held-out test problems per family of
    codebench 2's ``split`` (``"legacy"``: the first codebench). Translation (JavaScript) is
    included only where Node is installed (``apt-get install nodejs``): without it the gate
    scores the four Python families."""
    if split == "legacy":
        return cb.load_problems(per_family, seed=seed)
    from codex_lab.evals import codebench2 as cb2
    from codex_lab.evals.codebench2.js import node_path

    fams = [f for f in cb2.FAMILIES if f != "translate" or node_path() is not None]
    return cb2.load_problems(split, fams, n=per_family, seed=seed)


def bench_pass_rate(problems: Sequence[Any], answers: Sequence[str]) -> tuple[float, list[bool]]:
    """Pass@1 of one greedy answer per problem (codebench 2 or the first codebench) and each verdict."""
    if len(answers) != len(problems):
        raise ValueError(f"got {len(answers)} answers for {len(problems)} codebench problems; give one per problem")
    if problems and all(isinstance(p, cb.Problem) for p in problems):
        results = cr.execute_batched(problems, [[a] for a in answers])
    else:
        from codex_lab.evals import codebench2 as cb2

        results = cb2.execute(problems, [[a] for a in answers])
    passed = [rs[0].passed for rs in results]
    return sum(passed) / len(passed), passed


def functional_score(model, tokenizer, *, per_family: int = BENCH_PER_FAMILY, seed: int = 0,  # noqa: ANN001
                     split: str = "iid") -> dict[str, float]:
    """Pass@1 of ``model`` (greedy) on the functional gate's problems, per family and over all (``"all"``).

    The function other gates and scorecards call for the functional number (lesson 08's
    scorecard): the same held-out problems as :func:`run_gates` with the defaults.
    """
    problems = bench_problems(per_family, seed, split=split)
    if split == "legacy":
        sc, _ = cr.evaluate(model, tokenizer, problems)
        return {k: v for k, v in sc.items() if k != "time_s"}
    answers = [c[0] for c in cr.complete(model.eval(), tokenizer, problems, max_new_tokens=BENCH_MAX_TOKENS)]
    _, passed = bench_pass_rate(problems, answers)
    out: dict[str, list[bool]] = {}
    for p, ok in zip(problems, passed):
        out.setdefault(p.family, []).append(ok)
    return {**{f: sum(v) / len(v) for f, v in out.items()}, "all": sum(passed) / len(passed)}


def score(samples: Sequence[Sample], suite: Sequence[Problem] = SUITE, *,
          bench: Sequence[Any] | None = None, bench_answers: Sequence[str] | None = None) -> GateReport:
    """Score generated answers (one per problem, in order) on every gate.

    With ``bench`` (codebench problems) and ``bench_answers`` (one each), the functional
    gate is their pass@1; without, it is the share of ``suite`` problems whose tests pass.
    """
    if len(samples) != len(suite):
        raise ValueError(f"got {len(samples)} samples for {len(suite)} problems; give one per problem")
    if (bench is None) != (bench_answers is None):
        raise ValueError("give both bench and bench_answers, or neither")
    rows = []
    ttfts: list[float] = []
    tbts: list[float] = []
    for prob, s in zip(suite, samples):
        body = cut_function(s.body)
        ok = bool(body.strip()) and parses(prob.prompt + body)
        passed = ok and bench is None and functional_pass(prob, body)  # with a bench, its own tests decide
        rows.append((prob.name, body, ok, passed, style_consistency(prob.prompt, body)))
        if s.arrival is not None and s.token_times:
            ttfts.append(s.token_times[0] - s.arrival)
            tbts += [b - a for a, b in zip(s.token_times, s.token_times[1:])]
    n = len(rows)
    share = lambda xs, t: sum(x <= t for x in xs) / len(xs) if xs else math.nan  # noqa: E731
    functional, bench_passed, bench_rows = sum(r[3] for r in rows) / n, [], []
    if bench is not None and bench_answers is not None:
        functional, bench_passed = bench_pass_rate(bench, bench_answers)
        for p, a in zip(bench, bench_answers):  # codebench 2's Python answers, in the file that runs them
            if getattr(p, "language", None) == "python" and hasattr(p, "program"):
                bench_rows.append((bool(a.strip()) and parses(p.program(a)), style_consistency(p.code, a)))
    return GateReport(
        syntax=sum(r[2] for r in rows) / n, functional=functional,
        style=statistics.fmean(r[4] for r in rows),
        ttft_attainment=share(ttfts, TTFT_SLO_S), tbt_attainment=share(tbts, TBT_SLO_S),
        ttft_p95_s=percentile(ttfts, 95), tbt_p95_s=percentile(tbts, 95), samples=rows,
        bench_passed=list(bench_passed), bench_rows=bench_rows,
    )


# Latency attainment is measured on a shared machine: 10 points of slack so that timing
# noise alone (a few slow steps among ~100 token gaps) does not fail an identical model.
LATENCY_TOLERANCE = 0.10


def gate_decision(candidate: dict[str, float], baseline: dict[str, float], *,
                  tolerance: dict[str, float] | None = None) -> tuple[bool, list[str]]:
    """Pass only if the candidate is no worse than the baseline on every gate.

    Each gate passes when ``candidate[g] >= baseline[g] - tolerance[g]`` (default tolerance
    0 for quality gates, :data:`LATENCY_TOLERANCE` for latency attainment). A gate the
    baseline has a number for but the candidate has not (nan or missing) fails.
    Returns (passed, reasons for each failed gate).
    """
    tol = {"ttft_attainment": LATENCY_TOLERANCE, "tbt_attainment": LATENCY_TOLERANCE, **(tolerance or {})}
    reasons = []
    for g, base in baseline.items():
        if base is None or math.isnan(base):
            continue
        cand = candidate.get(g, math.nan)
        t = tol.get(g, 0.0)
        if cand is None or math.isnan(cand) or cand < base - t:
            reasons.append(f"{g}: candidate {cand:.3f} < baseline {base:.3f} - {t:.2f}")
    return not reasons, reasons


# The release margins, declared before any candidate is gated: the largest loss on a quality gate (share of
# problems, or mean style score, candidate minus baseline) that still counts as "no worse". 0.10 is one problem
# in ten; a candidate passes a gate only when the one-sided 95% bound of its loss is below the margin.
GATE_MARGINS = {"syntax": 0.10, "functional": 0.10, "style": 0.10}


def paired_noninferiority(baseline: Sequence[float], candidate: Sequence[float], *, margin: float, metric: str,
                          level: float = 0.95) -> Any:
    """"The candidate is no worse than the baseline by more than ``margin``" on per-problem scores
    in [0, 1] of the same problems (paired), as a :class:`~codex_lab.stats.Comparison`
    (non-inferiority, the two-sided ``2 level - 1`` interval of candidate minus baseline).

    The interval is a t interval of the per-problem differences with one pseudo-problem won by
    each side added (differences +1 and -1: Agresti and Min's 2005 adjustment for paired
    proportions, which adds half a count to each cell): two identical models on n problems
    then have an interval of width ~ 1/sqrt(n), not zero, so a small suite cannot show that a
    candidate is no worse, and the gate says so ("not resolved")."""
    from codex_lab.stats import FAILS, HOLDS, NOT_RESOLVED, Comparison, t_quantile

    if len(baseline) != len(candidate) or len(baseline) < 2:
        raise ValueError(f"need the same problems (>= 2) for both models, got {len(baseline)} and {len(candidate)}")
    if not margin > 0:
        raise ValueError(f"margin must be a positive share (e.g. 0.10), got {margin}")
    real = [c - b for b, c in zip(baseline, candidate)]
    d = real + [1.0, -1.0]  # the pseudo-problems
    n = len(d)
    mean = sum(d) / n
    # se = sample sd of the differences / sqrt(n)
    se = (sum((x - mean) ** 2 for x in d) / (n - 1)) ** 0.5 / n ** 0.5
    t = t_quantile(level, n - 1)
    lo, hi = mean - t * se, mean + t * se
    # cost = baseline - candidate: holds when its upper bound (-lo) is below the margin
    v = HOLDS if -lo < margin else (FAILS if -hi > margin else NOT_RESOLVED)
    note = (f"{len(real)} problems, paired; one-sided {level:.0%} bound of the loss {-lo:+.3f} against the margin "
            f"{margin:g}")
    return Comparison(metric, sum(real) / len(real), lo, hi, v, len(baseline), len(candidate), True,
                      level=round(2 * level - 1, 12), kind="non-inferiority", margin=margin, note=note,
                      measured_verdict=v, df=float(n - 1), unit="problems")


def release_decision(candidate: GateReport, baseline: GateReport, *,
                     margins: dict[str, float] | None = None) -> tuple[bool, list[str], dict[str, Any]]:
    """The capstone's release gates with intervals: (passed, reasons, comparisons).

    Each quality gate (syntax, functional, style) is a paired non-inferiority comparison on the
    same problems at its declared margin (:data:`GATE_MARGINS`, :func:`paired_noninferiority`);
    it passes only when it *holds* (a gate that cannot tell, "not resolved", refuses: the
    candidate has to show it is no worse). Latency attainment keeps :func:`gate_decision`'s
    rule (the tolerance :data:`LATENCY_TOLERANCE` is its margin): the gaps of one run are not
    independent draws, so a per-gap interval would overstate what one run shows."""
    from codex_lab.stats import HOLDS

    m = {**GATE_MARGINS, **(margins or {})}
    comps = {g: paired_noninferiority(baseline.per_item(g), candidate.per_item(g), margin=m[g],
                                      metric=f"{g} gate, candidate minus baseline")
             for g in ("syntax", "functional", "style")}
    reasons = [f"{g}: {c.verdict} (loss bound {-c.lo:+.3f}, margin {c.margin:g}, {c.n_a} problems)"
               for g, c in comps.items() if c.verdict != HOLDS]
    lat = {g: v for g, v in baseline.scores().items() if g.endswith("attainment")}
    _, why = gate_decision({g: candidate.scores()[g] for g in lat}, lat)
    reasons += why
    return not reasons, reasons, comps


Completer = Callable[[Sequence[str], int], list[Sample]]


def engine_completer(model, tokenizer, *, max_batch_size: int = 8, step_delay_s: float = 0.0) -> Completer:  # noqa: ANN001
    """A completer that runs every prompt through a continuous-batching engine (greedy),
    recording token timestamps. ``step_delay_s`` injects a delay per engine step (a
    deliberately slow candidate for demonstrations and tests)."""
    import time

    from codex_lab.infer.engine.loop import Engine
    from codex_lab.infer.sampling import SamplingParams

    def complete(prompts: Sequence[str], max_tokens: int) -> list[Sample]:
        eng = Engine(model, tokenizer, max_batch_size=max_batch_size)
        samples = [Sample(body="", arrival=time.perf_counter()) for _ in prompts]
        rid_to_i: dict[int, int] = {}
        limit = int(model.cfg.max_seq_len)
        for i, p in enumerate(prompts):
            ids = tokenizer.encode(p)
            # a model whose context cannot hold the prompt and one token answers nothing (the problem fails);
            # otherwise the answer is cut to the room its context leaves
            room = min(max_tokens, limit - len(ids))
            if room < 1:
                continue
            params = SamplingParams(max_tokens=room, temperature=0.0)

            def on_token(tok_id: int, text: str, i: int = i) -> None:
                samples[i].token_times.append(time.perf_counter())

            rid_to_i[eng.submit(ids, params, on_token=on_token)] = i
        while eng.has_work():
            if step_delay_s:
                time.sleep(step_delay_s)
            for fin in eng.step():
                samples[rid_to_i[fin.rid]].body = fin.text
        return samples

    return complete


def run_gates(complete: Completer, *, suite: Sequence[Problem] = SUITE, max_tokens: int = 48,
              bench: Sequence[Any] | None | str = "default") -> GateReport:
    """Generate an answer to every problem with ``complete`` and score them.

    ``bench``: the functional gate's problems (``"default"``: :func:`bench_problems`, codebench
    2 iid; ``"legacy"``: the first codebench; ``None``: score the functional gate on ``suite``'s
    own tests). They are answered in a second call; latency is measured on the suite's answers only.
    """
    if isinstance(bench, str):
        if bench not in ("default", "legacy"):
            raise ValueError(f"bench={bench!r}: give 'default' (codebench 2 iid), 'legacy', None or a list of problems")
        problems = bench_problems(split="iid" if bench == "default" else "legacy")
    else:
        problems = list(bench) if bench is not None else []
    head = complete([p.prompt for p in suite], max_tokens)
    if not problems:
        return score(head, suite)
    # a second call: bench answers end at <|endoftext|> (or the length limit); latency stays the suite's
    legacy = all(isinstance(p, cb.Problem) for p in problems)
    tail = complete([p.prompt for p in problems], cr.MAX_NEW_TOKENS if legacy else BENCH_MAX_TOKENS)
    # codebench 2 answers end where the evaluation harness ends them (HumanEval's stop sequences)
    from codex_lab.evals.humaneval import cut_at_stop

    answers = [s.body if legacy else cut_at_stop(s.body) for s in tail]
    return score(head, suite, bench=problems, bench_answers=answers)
