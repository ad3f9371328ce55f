"""codebench 2: an executable benchmark of generalisation to held-out program STRUCTURE.

The first codebench (:mod:`codex_lab.evals.codebench`) holds out (template, constant) pairs
of nine one-line templates: a model that copies a template and swaps the number passes.
codebench 2 composes programs of 1-4 typed primitives (a DeepCoder-style DSL over ints,
lists and strings, :mod:`.dsl`), splits them ExeDec-style by structure (``iid``,
``length``, ``compose``; plus ``legacy``, the first codebench; :mod:`.splits`), decides
hidden tests and wrong answers by execution (:mod:`.oracle`), poses five families on the
same programs (completion, bugfix, testgen, translate to JavaScript, fim; :mod:`.problems`),
audits near-duplicates (:mod:`.audit`) and scores pass@k with bootstrap intervals
(:mod:`.scoring`). See docs/CODEBENCH2.md.
"""

from codex_lab.evals.codebench2.audit import Audit, audit, normalise
from codex_lab.evals.codebench2.dsl import PRIMITIVES, PRIMS, TYPES, Primitive, Program, Step, check_types
from codex_lab.evals.codebench2.js import network_isolated, node_path, run_js
from codex_lab.evals.codebench2.oracle import Mutant, hidden_tests, mutants, well_formed
from codex_lab.evals.codebench2.problems import (
    FAMILIES, LEGACY_FAMILIES, Problem, canonical_completions, load_problems, make_problem, sizes, task_example,
    training_tasks, wrong_completions,
)
from codex_lab.evals.codebench2.scoring import (
    bootstrap_interval, execute, format_rows, problem_pass_at_k, score_canonical, score_rows, seed_problem_interval,
    split_audit,
)
from codex_lab.evals.codebench2.splits import PARTS, PROGRAM_SPLITS, SIZES, SPLITS, programs, split_summary

__all__ = [
    "Audit", "audit", "normalise",
    "PRIMITIVES", "PRIMS", "TYPES", "Primitive", "Program", "Step", "check_types",
    "network_isolated", "node_path", "run_js",
    "Mutant", "hidden_tests", "mutants", "well_formed",
    "FAMILIES", "LEGACY_FAMILIES", "Problem", "canonical_completions", "load_problems", "make_problem", "sizes",
    "task_example", "training_tasks", "wrong_completions",
    "bootstrap_interval", "execute", "format_rows", "problem_pass_at_k", "score_canonical", "score_rows",
    "seed_problem_interval", "split_audit",
    "PARTS", "PROGRAM_SPLITS", "SIZES", "SPLITS", "programs", "split_summary",
]
