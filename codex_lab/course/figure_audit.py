"""Every figure a page states is checked against a record, declared, or an error.

:func:`unchecked` reads the README, every docs page and the prose of every lesson and lists
each number with a unit of time, speed, size, ratio or share that no place of
:func:`codex_lab.course.figures.mismatches` covers (a timings, bench or asset record) and that
is not declared: a goal, threshold or limit (``GOAL_RE`` right before it), a parameter or claim
(:data:`DECLARED`), or a page's own limit or test input (:data:`PAGE_DECLARED`).
Measured numbers without a unit (a pass@1, a loss difference and its interval: any decimal
with two or more digits after the point) are audited too: on a page bound to records
(:data:`PAGE_RECORDS`) each must equal, at the precision it is written, a value one of those
records holds; anywhere else it must be declared (:data:`VALUE_DECLARED`, :data:`PAGE_DECLARED`).
``tests/test_figures.py`` fails on any. Counts and one-decimal numbers are not audited.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from pathlib import Path
from typing import Any

from codex_lab.course.figures import ROOT, _places, record

# a measured-looking figure: a number with a unit of time, speed, size, ratio or share
# (an optional range start, "8-15%", is part of it; "x" counts only attached, "2.5x", as
# "8 x 1,024" is a product)
FIGURE_RE = re.compile(r"(?<![\w.,-])((?:\d+(?:\.\d+)?[-–])?\d[\d,]*(?:\.\d+)?)"
                       r"(x|\s?(?:ms|s|tokens/s|%|MiB|GiB|GB|MB|KB|KiB|nats))(?![\w/])")
# a goal, target, threshold or limit (not a measurement) when one of these comes right before the figure
GOAL_RE = re.compile(r"(?:<|>|>=|<=|≥|≤|within|at least|at most|goal(?: of)?|target|limit|cap(?:ped at)?|"
                     r"over|under|above|below|default|budget|allows?)"
                     r"\s*\**~?$", re.I)
# figures the pages may state without a record: each is a parameter or a claim, not a measurement
DECLARED: dict[str, str] = {
    "95%": "the confidence level of every interval (codex_lab.stats)",
    "8-15%": "the article's multi-task claim (SEED_CLAIMS.md)",
    "100 ms": "the article's TTFT target",
    "20 ms": "the article's TBT target",
    "0.1 s": "the article's TTFT target, in seconds (a latency histogram's bucket edge)",
    "0.02 s": "the article's TBT target, in seconds (a latency histogram's bucket edge)",
    "40%": "the article's GQA claim (\"reduces KV-cache memory by about 40%\")",
    "75%": "1 - 1/g at g = 4: what GQA's cache saves by its definition",
    "87.5%": "1 - 1/g at g = 8",
    "5%": "a margin of 0.05 nats/token (exp(0.05) - 1: a 5% higher perplexity), and GQA's uptraining share in the paper",
    "90%": "a declared share: the top tokens' probability mass (lesson 00), a two-one-sided-tests interval",
    "10%": "GQA's uptraining share in standard mode (300 of 3,000 pre-training steps)",
    "0-20%": "the uptraining shares of the GQA paper's Fig. 6",
    "20%": "codebench 2's iid test share of structures (codex_lab.evals.codebench2.splits.TEST_BP)",
    "25%": "codebench 2's compose split: the share of reserved primitive pairs (HELD_BIGRAM_BP)",
    "2-3x": "the speculative-decoding formula at the article's draft cost (an illustration, not a measurement)",
    "30 s": "a declared window: the canary's and the monitor's sliding windows",
    "0.2 s": "the canary's decision interval",
    "30%": "the canary's share of live traffic",
}
# figures one page may state without a record: sandbox limits and the hostile suites' inputs
PAGE_DECLARED: dict[tuple[str, str], str] = {
    ("docs/CODEBENCH2.md", "4 GiB"): "the translated JavaScript's address-space limit (codebench2.js)",
    ("docs/CODEBENCH2.md", "1 GiB"): "what V8 reserves at start: the reason for that limit",
    ("docs/INSTRUCTORS.md", "600 s"): "the checker's allowance per exercise",
    ("docs/INSTRUCTORS.md", "3 GiB"): "the sandbox's address-space limit per process",
    ("docs/INSTRUCTORS.md", "1 KiB"): "the kernel's cost of an empty file on tmpfs (why inodes are limited)",
    ("docs/INSTRUCTORS.md", "150 MiB"): "an input of the hostile suite (a fork bomb's size per process)",
    ("docs/INSTRUCTORS.md", "10 ms"): "the sandbox's poll interval near the memory budget",
    ("docs/INSTRUCTORS.md", "1 ms"): "the cost of one poll, which sets the interval",
    ("docs/INSTRUCTORS.md", "64 MiB"): "the kernel's per-user pipe-buffer limit",
    ("docs/SECURITY.md", "500 MB"): "an input of the hostile suite (output flood)",
    ("docs/SECURITY.md", "10-20 ms"): "the sandbox's poll interval",
    ("docs/SECURITY.md", "1 ms"): "the cost of one poll, which sets the interval",
    ("docs/SECURITY.md", "224 MiB"): "an input of the hostile suite (the memory budget of a fork test)",
    ("docs/SECURITY.md", "4 s"): "an input of the registry's race test (its duration)",
    ("docs/SECURITY.md", "2.66 GiB"): "an input of the loader test (the size a 4 KiB file declares)",
    ("docs/SECURITY.md", "200 MB"): "an input of the hostile corpus (a file over the size limit)",
}
PAGE_DECLARED.update({
    ("notebooks/02_sparse_attention.py", "0.234"): "a pattern's density at N = 128 (a definition: geometry.densities)",
    ("notebooks/02_sparse_attention.py", "0.232"): "a pattern's density at N = 128 (a definition: geometry.densities)",
    ("notebooks/03_gqa.py", "1.67"): "arithmetic: the g whose saving 1 - 1/g is 40%",
    ("docs/INSTRUCTORS.md", "+0.25"): "an example of a learner's answer, quoted to show its form",
})
# a measured-looking number without a unit: a decimal with two or more digits after the point
# (signed or not; not a version "0.3.36", an address or an arXiv id), where FIGURE_RE finds no unit
VALUE_RE = re.compile(r"(?<![\w.,/-])([+\-−]?)(\d+\.\d{2,})(?![\w%]|\.\d|\s?(?:ms|s|x|tokens/s|MiB|GiB|GB|MB|KB|KiB|nats)\b)")
# unit-less values the pages may state anywhere: each is a parameter or a rule, not a measurement
VALUE_DECLARED: dict[str, str] = {
    "0.01": "the smallest change of a held-out loss that matters (nats/token), and the margin's share",
    "0.02": "the smallest change of an accuracy that matters (lesson 02), and a draft's cost ratio c in an illustration",
    "0.05": "a declared non-inferiority margin",
    "0.10": "a benchmark's floor (pass@1), and the canary's latency tolerance",
}
# the records a page's unit-less values come from (paths under codex_lab/assets, globs allowed)
PAGE_RECORDS: dict[str, tuple[str, ...]] = {
    "docs/CODEBENCH2.md": ("cb2_tuned/meta.json",),
    "docs/PERFORMANCE.md": ("bench_records.json",),
    "docs/RESULTS.md": ("tiny/meta.json", "reference/*.json"),
    "docs/SEED_CLAIMS.md": ("reference/*.json", "bench_records.json"),
}
_NUM_IN_TEXT = re.compile(r"[+\-−]?\d+(?:\.\d+)?(?:e[+-]?\d+)?")


def record_values(paths: list[Path]) -> list[float]:
    """Every finite number the JSON records at ``paths`` hold, sorted: scalars, and the numbers
    written inside their strings (a verdict line's difference and interval). Numeric lists longer
    than 4 (curves, per-problem scores, rounds) are left out: a page quotes summaries, and a long
    list would let almost any decimal match by chance."""
    out: set[float] = set()

    def walk(obj: Any) -> None:
        if isinstance(obj, bool):
            return
        if isinstance(obj, (int, float)):
            if math.isfinite(obj):
                out.add(float(obj))
        elif isinstance(obj, str):
            for m in _NUM_IN_TEXT.finditer(obj):
                try:
                    out.add(float(m.group(0).replace("−", "-")))
                except ValueError:
                    pass
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            if len(obj) > 4 and all(isinstance(v, (int, float, list)) for v in obj):
                return
            for v in obj:
                walk(v)

    for p in paths:
        walk(json.loads(p.read_text(encoding="utf-8")))
    return sorted(out)


def _holds(values: list[float], x: float, digits: int) -> bool:
    """Some value in ``values`` (sorted) rounds to ``x`` at ``digits`` decimals."""
    # |v - x| <= half a unit of the last written digit (plus float slack)
    tol = 0.5 * 10.0 ** -digits + 1e-12
    i = bisect.bisect_left(values, x - tol)
    return i < len(values) and values[i] <= x + tol


# the pages audited: the README, every docs page, and the prose (markdown cells) of every lesson
AUDITED = ("README.md", "docs/*.md", "notebooks/0*.py")


def _prose(text: str, notebook: bool) -> str:
    """``text`` with everything that is not prose blanked out (same length, so positions hold):
    code blocks, inline code, links' targets, HTML tags; in a notebook source, the code cells."""
    out = list(text)

    def blank(a: int, b: int) -> None:
        for i in range(a, b):
            if out[i] != "\n":
                out[i] = " "

    if notebook:  # jupytext percent format: keep the "# %% [markdown]" cells
        starts = [m.start() for m in re.finditer(r"^# %%", text, re.M)] + [len(text)]
        blank(0, starts[0])
        for a, b in zip(starts, starts[1:]):
            if not text.startswith("# %% [markdown]", a):
                blank(a, b)
    for pat in (r"```.*?```", r"`[^`\n]*`", r"\]\([^)\s]*\)", r"<[^>\n]*>"):
        for m in re.finditer(pat, text, re.S):
            blank(*m.span())
    return "".join(out)


def unchecked(rec: dict[str, Any] | None = None, root: Path = ROOT, bench: dict[str, Any] | None = None,
              assets: Path | None = None) -> list[str]:
    """Every figure the audited pages state that no record checks and that is not declared:
    ``"page:line: figure"`` (``tests/test_figures.py`` fails on any). A figure is checked where a
    place of :func:`mismatches` (timings or bench record) covers it, and declared where it is a
    goal (``GOAL_RE`` right before it) or in :data:`DECLARED`; a unit-less decimal is checked
    against the records of :data:`PAGE_RECORDS` under ``assets`` (default: the package's)."""
    rec = rec or record()
    assets = assets or ROOT / "codex_lab" / "assets"
    pats = [pat for _, pat, _ in _places(rec, root, bench)]
    bad = []
    for glob in AUDITED:
        for f in sorted(root.glob(glob)):
            text = f.read_text(encoding="utf-8")
            prose = _prose(text, f.suffix == ".py")
            page = str(f.relative_to(root))
            covered = [m.span(2) for pat in pats for m in pat.finditer(text)]
            for m in FIGURE_RE.finditer(prose):
                if any(a <= m.start(1) < b for a, b in covered):
                    continue
                if GOAL_RE.search(prose[max(0, m.start() - 16):m.start()]) or m.group(0) in DECLARED \
                        or (page, m.group(0)) in PAGE_DECLARED:
                    continue
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{page}:{line}: {m.group(0)}")
            bad += _unchecked_values(page, text, prose, assets)
    return bad


def _unchecked_values(page: str, text: str, prose: str, assets: Path) -> list[str]:
    """The unit-less decimals of one page that its records do not hold and nothing declares."""
    bound = [p for pat in PAGE_RECORDS.get(page, ()) for p in sorted(assets.glob(pat))]
    values = record_values(bound) if bound else []
    bad = []
    for m in VALUE_RE.finditer(prose):
        if "arxiv" in prose[max(0, m.start() - 8):m.start()].lower():
            continue
        figure = m.group(2)
        if figure in VALUE_DECLARED or (page, m.group(0)) in PAGE_DECLARED \
                or GOAL_RE.search(prose[max(0, m.start() - 16):m.start()]):
            continue
        digits = len(figure.split(".")[1])
        x = -float(figure) if m.group(1) in ("-", "−") else float(figure)
        # an unsigned figure may quote a signed value's size ("0.2800 lower")
        if values and (_holds(values, x, digits) or (not m.group(1) and _holds(values, -x, digits))):
            continue
        line = text.count("\n", 0, m.start()) + 1
        bad.append(f"{page}:{line}: {m.group(0)}" + ("" if bound else " (no record bound to this page)"))
    return bad
