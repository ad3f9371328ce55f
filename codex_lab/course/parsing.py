"""Python's AST built under one process-wide lock.

``grade_folder`` grades submissions in threads, and each builds ASTs (the learner's view stubs
the package's solution bodies; a lesson's notebook source is parsed for its definitions).
CPython 3.11 keeps the AST constructor's recursion depth in state every thread shares, so two
threads converting ASTs at once can raise ``SystemError: AST constructor recursion depth
mismatch`` (python/cpython#106905): a whole submission came back "not graded" that way, twice in
one suite run on a loaded machine. Parsing is a small share of grading; holding one lock around
it costs nothing measurable and removes the race.
"""

from __future__ import annotations

import ast
import threading
from types import CodeType

AST_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)``, one thread at a time."""
    with AST_LOCK:
        return ast.parse(source, filename=filename)


def compile_tree(tree: ast.Module, filename: str) -> CodeType:
    """``compile(tree, filename, "exec")`` of an AST (it is converted back, under the same lock)."""
    with AST_LOCK:
        return compile(tree, filename, "exec")
