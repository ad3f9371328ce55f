"""Gradescope autograder output: ``results.json`` from grading records.

Format (Gradescope's "Autograder Specifications"): top-level ``score`` (the sum of the
tests' scores), ``output``, ``stdout_visibility``, and ``tests``: one entry per exercise
check with ``name``, ``score``, ``max_score``, ``output`` (the feedback line), ``status``
(``passed``/``failed``) and ``visibility`` (``visible`` for public checks; ``hidden`` for
hidden checks by default, or ``after_published``).
"""

from __future__ import annotations

import json
from typing import Any


def results_json(rows: list[dict[str, Any]], hidden_visibility: str = "hidden") -> str:
    """results.json text for the records of :func:`codex_lab.course.grading.grade_folder`."""
    if hidden_visibility not in ("hidden", "after_due_date", "after_published", "visible"):
        raise ValueError(f"unknown Gradescope visibility {hidden_visibility!r}")
    tests = []
    for r in rows:
        sub = r.get("submission", "")
        tests.append({
            "name": f"{r['lesson']} {r['name']} ({r['visibility']})" + (f" [{sub}]" if sub else ""),
            "score": r["points"],
            "max_score": r["max_points"],
            "status": "passed" if r["points"] == r["max_points"] else "failed",
            "output": f"{r['status']}: {r['message']}",
            "visibility": hidden_visibility if r["visibility"] == "hidden" else "visible",
        })
    got, total = sum(t["score"] for t in tests), sum(t["max_score"] for t in tests)
    return json.dumps({"score": got, "output": f"{got}/{total} points from codex-lab checks",
                       "stdout_visibility": "hidden", "tests": tests}, indent=2)
