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
- the README report total: ``fast mode (default on a CPU) | <N> s``;
- the README test suite: ``<N> tests in``, and ``took <N> s`` for the CI run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
RECORD = Path(__file__).resolve().parents[1] / "assets" / "timings.json"

HEADER_RE = re.compile(r"(\*\*Run time:\*\* fast mode on CPU: )(\d+)( s)")
REPORT_RE = re.compile(r"(\| fast mode \(default on a CPU\) \| )(\d+)( s)")
TESTS_RE = re.compile(r"(: )(\d[\d,]*)( tests in)")
CI_RE = re.compile(r"(the rendered course site\) took )(\d+)( s)")


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


def _places(rec: dict[str, Any], root: Path = ROOT) -> list[tuple[str, re.Pattern[str], int]]:
    """(file, pattern, recorded value) for every figure the text carries."""
    out: list[tuple[str, re.Pattern[str], int]] = []
    for key, secs in lesson_seconds(rec).items():
        for nb in sorted((root / "notebooks").glob(f"{key}_*.py")):
            out.append((str(nb.relative_to(root)), HEADER_RE, secs))
        out.append(("README.md", _row_re(key), secs))
    out.append(("README.md", REPORT_RE, report_seconds(rec)))
    suite = rec.get("suite", {})
    if "tests" in suite:
        out.append(("README.md", TESTS_RE, int(suite["tests"])))
    if "ci_s" in suite:
        out.append(("README.md", CI_RE, round(suite["ci_s"])))
    return out


def mismatches(rec: dict[str, Any] | None = None, root: Path = ROOT) -> list[str]:
    """Every place where the text states another figure than the record (or none at all)."""
    rec = rec or record()
    bad = []
    for rel, pat, want in _places(rec, root):
        read: Callable[[str], str] = lambda r: (root / r).read_text(encoding="utf-8")  # noqa: E731
        found = [int(m.group(2).replace(",", "")) for m in pat.finditer(read(rel))]
        if not found:
            bad.append(f"{rel}: no figure matching {pat.pattern!r} (the record says {want})")
        elif any(f != want for f in found):
            bad.append(f"{rel}: states {found} where the record says {want} ({pat.pattern!r})")
    return bad


def apply(rec: dict[str, Any] | None = None, root: Path = ROOT) -> list[str]:
    """Rewrite every figure from the record; returns the files changed (notebook ``.py``
    sources: re-pair them with ``jupytext --sync``)."""
    rec = rec or record()
    texts: dict[str, str] = {}
    for rel, pat, want in _places(rec, root):
        text = texts.get(rel) or (root / rel).read_text(encoding="utf-8")
        texts[rel] = pat.sub(lambda m, w=want: f"{m.group(1)}{w}{m.group(3)}", text)
    changed = []
    for rel, text in texts.items():
        if (root / rel).read_text(encoding="utf-8") != text:
            (root / rel).write_text(text, encoding="utf-8")
            changed.append(rel)
    return changed
