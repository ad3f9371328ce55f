"""One source for the figures the README and the notebook headers state.

Run times, the report's total, the test count and the CI duration are written in one record,
``codex_lab/assets/timings.json`` (lessons by ``scripts/time_notebooks.py``, report sections by
``codex-lab report``, the suite by ``scripts/update_figures.py --suite``). The README and each
notebook's first cell carry them between fixed words; :func:`mismatches` lists every place
where the text and the record disagree (``tests/test_figures.py`` fails on any), and
:func:`apply` rewrites the text from the record (``scripts/update_figures.py``).

Places (each a regular expression with one number group):

- a notebook header: ``**Run time:** fast mode on CPU: <N> s``;
- the README lesson table: the last cell of the row ``| [NN topic](notebooks/NN_topic.ipynb) | ... | <N> s |``;
- the README report total: ``fast mode (CI's) | <N> s``;
- the README test suite: ``<N> tests in``, and ``took <N> s`` for the CI run;
- the standard-mode report: each lesson appendix's section, and docs/RESULTS.md's sections,
  their sum, the run they were scaled from, and the full-mode extrapolation in hours;
- the shipped assets: file sizes and the shipped model's syntax validity (its ``meta.json``).

Performance figures (tokens/s, speed-ups, latency percentiles) come from a second record,
``codex_lab/assets/bench_records.json``, through :mod:`codex_lab.course.bench_figures`.
:mod:`codex_lab.course.figure_audit` lists any figure on the pages that neither record checks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

from codex_lab.course.bench_figures import BENCH_FIGURES, bench_record

ROOT = Path(__file__).resolve().parents[2]
RECORD = Path(__file__).resolve().parents[1] / "assets" / "timings.json"

HEADER_RE = re.compile(r"(\*\*Run time:\*\* fast mode on CPU: )(\d+)( s)")
REPORT_RE = re.compile(r"(\| fast mode \(CI's\) \| )(\d+)( s)")
TESTS_RE = re.compile(r"(: )(\d[\d,]*)( tests in)")
CI_RE = re.compile(r"(the rendered course site\) took )(\d+)( s)")
# the standard-mode report: a lesson appendix's section, and the results page's sections and sum
STD_SECTION_RE = lambda key: re.compile(rf"(the report's section {key}, )(\d+)( s on the reference machine)")  # noqa: E731
STD_TOTAL_RE = re.compile(r"(scaled to the reference machine: )(\d[\d,]*)( s of sections)")
STD_ROW_RE = lambda key: re.compile(rf"(scaled to the reference machine: [^|]*?\b{key}: )(\d+)( s)")  # noqa: E731
RUN_CMD_RE = re.compile(r"(the command took )(\d[\d,]*)( s on that machine)")
RUN_SECTIONS_RE = re.compile(r"(s on that machine \()(\d[\d,]*)( s of sections)")
RUN_CALIBRATION_RE = re.compile(r"(whose matmul calibration is )(\d+\.\d+)(x the reference machine's)")
FULL_TOTAL_RE = re.compile(r"(Full mode, scaled to the reference machine: )(\d[\d,]*)( h of sections)")
FULL_ROW_RE = lambda key: re.compile(rf"(Full mode, scaled to the reference machine: [^|]*?\b{key} )(\d+)( h)")  # noqa: E731


def record(path: Path = RECORD) -> dict[str, Any]:
    """The timings record (``codex_lab/assets/timings.json``)."""
    return json.loads(path.read_text(encoding="utf-8"))


def lesson_seconds(rec: dict[str, Any]) -> dict[str, int]:
    """Lesson key ("00".."08") -> whole seconds, fast mode on the reference CPU."""
    return {k: round(v) for k, v in rec["lesson"]["fast/cpu"].items()}


def report_seconds(rec: dict[str, Any]) -> int:
    """The whole fast-mode report on the reference CPU: the sum of its sections, in whole seconds."""
    # total = sum over sections of their recorded seconds
    return round(sum(rec["report"]["fast/cpu"].values()))


def _row_re(key: str) -> re.Pattern[str]:
    # the README lesson table's row of lesson `key`: its last cell holds the run time
    return re.compile(rf"(\| \[{key} [^\n]*\| )(\d+)( s \|)")


# the pages that carry figures: the README (lesson and suite times) and the docs pages the
# results and performance records moved to; a figure lives on the first page that states it
TEXTS = ("README.md", "docs/PERFORMANCE.md", "docs/RESULTS.md", "docs/USAGE.md")


def _home(root: Path, pat: re.Pattern[str]) -> str:
    """The page that states a figure matching ``pat`` (README.md when none does: the check then names it)."""
    for t in TEXTS:
        f = root / t
        if f.is_file() and pat.search(f.read_text(encoding="utf-8")):
            return t
    return "README.md"


def _places(rec: dict[str, Any], root: Path = ROOT, bench: dict[str, Any] | None = None) -> list[tuple[str, re.Pattern[str], str]]:
    """(file, pattern, recorded value as the text must state it) for every figure the text carries."""
    out: list[tuple[str, re.Pattern[str], str]] = []
    for key, secs in lesson_seconds(rec).items():
        for nb in sorted((root / "notebooks").glob(f"{key}_*.py")):
            out.append((str(nb.relative_to(root)), HEADER_RE, str(secs)))
        out.append(("README.md", _row_re(key), str(secs)))
    out.append(("README.md", REPORT_RE, str(report_seconds(rec))))
    std = rec["report"].get("standard/cpu", {})
    for key, secs in std.items():
        # a lesson's appendix states its standard-mode report section
        for nb in sorted((root / "notebooks").glob(f"{key}_*.py")):
            out.append((str(nb.relative_to(root)), STD_SECTION_RE(key), str(round(secs))))
    if std:
        # the results page: the standard report's sections on the reference machine, and their sum
        out.append(("docs/RESULTS.md", STD_TOTAL_RE, str(round(sum(std.values())))))
        for key, secs in std.items():
            out.append(("docs/RESULTS.md", STD_ROW_RE(key), str(round(secs))))
    run = rec.get("runs", {}).get("report standard/cpu")
    if run:  # the run those sections were scaled from, on its own machine
        out += [("docs/RESULTS.md", RUN_CMD_RE, str(run["command_s"])),
                ("docs/RESULTS.md", RUN_SECTIONS_RE, str(run["sections_s"])),
                ("docs/RESULTS.md", RUN_CALIBRATION_RE, f"{run['calibration_ratio']:.2f}")]
    full = rec["report"].get("full/cpu", {})
    if full:  # the full-mode extrapolation, in hours on the reference machine
        out.append(("docs/RESULTS.md", FULL_TOTAL_RE, str(round(sum(full.values()) / 3600))))
        for key, secs in full.items():
            if secs >= 3600:
                out.append(("docs/RESULTS.md", FULL_ROW_RE(key), str(round(secs / 3600))))
    suite = rec.get("suite", {})
    if "tests" in suite:
        out.append(("README.md", TESTS_RE, str(int(suite["tests"]))))
    if "ci_s" in suite:
        out.append(("README.md", CI_RE, str(round(suite["ci_s"]))))
    out += _asset_places(root)
    bench = bench_record() if bench is None else bench
    for fig in BENCH_FIGURES:
        if fig.key in bench:
            out.append((_home(root, fig.pattern), fig.pattern, fig.value(bench[fig.key]["rows"])))
    return out


def _megabytes(path: Path, digits: int) -> str:
    # MB = bytes / 10^6, as the pages state a file's size
    return f"{path.stat().st_size / 1e6:.{digits}f}"


def _asset_places(root: Path) -> list[tuple[str, re.Pattern[str], str]]:
    """Figures of the shipped assets themselves: the shipped model's and the tuned model's file
    sizes, and the shipped model's syntax validity from its own ``meta.json``."""
    assets = Path(__file__).resolve().parents[1] / "assets"
    tiny, tuned = assets / "tiny" / "model.safetensors", assets / "cb2_tuned" / "model_f16.safetensors"
    out: list[tuple[str, re.Pattern[str], str]] = []
    if tiny.is_file():
        out += [("README.md", re.compile(r"(M parameters, )(\d+)( MB\))"), _megabytes(tiny, 0)),
                ("docs/RESULTS.md", re.compile(r"(`codex_lab/assets/tiny` \()(\d+)( MB)"), _megabytes(tiny, 0))]
        meta = json.loads((tiny.parent / "meta.json").read_text(encoding="utf-8"))
        # share of greedy bodies that parse, as a percentage with one decimal
        out.append(("docs/RESULTS.md", re.compile(r"(signatures parse )(\d+\.\d)(% of the time)"),
                    f"{100 * meta['syntax_validity']:.1f}"))
    if tuned.is_file():
        out.append(("docs/CODEBENCH2.md", re.compile(r"(load_codebench2_tuned\(\)`, )(\d+\.\d)( MB)"), _megabytes(tuned, 1)))
    return out


def mismatches(rec: dict[str, Any] | None = None, root: Path = ROOT, bench: dict[str, Any] | None = None) -> list[str]:
    """Every place where the text states another figure than the record (or none at all)."""
    rec = rec or record()
    bad = []
    for rel, pat, want in _places(rec, root, bench):
        read: Callable[[str], str] = lambda r: (root / r).read_text(encoding="utf-8")  # noqa: E731
        found = [m.group(2).replace(",", "") for m in pat.finditer(read(rel))]
        if not found:
            bad.append(f"{rel}: no figure matching {pat.pattern!r} (the record says {want})")
        elif any(f != want for f in found):
            bad.append(f"{rel}: states {found} where the record says {want} ({pat.pattern!r})")
    return bad


def apply(rec: dict[str, Any] | None = None, root: Path = ROOT, bench: dict[str, Any] | None = None) -> list[str]:
    """Rewrite every figure from the records; returns the files changed (notebook ``.py``
    sources: re-pair them with ``jupytext --sync``)."""
    rec = rec or record()
    texts: dict[str, str] = {}
    for rel, pat, want in _places(rec, root, bench):
        text = texts.get(rel) or (root / rel).read_text(encoding="utf-8")
        texts[rel] = pat.sub(lambda m, w=want: f"{m.group(1)}{w}{m.group(3)}", text)
    changed = []
    for rel, text in texts.items():
        if (root / rel).read_text(encoding="utf-8") != text:
            (root / rel).write_text(text, encoding="utf-8")
            changed.append(rel)
    return changed
