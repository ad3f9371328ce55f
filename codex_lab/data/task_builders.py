"""The completion, docstring and translate tasks (lesson 05): one example per function.

``translate`` is an honest *proxy* for cross-language translation, since the corpus is one
language: snake_case code -> the same code with camelCase local names (a style transfer).
"""

from __future__ import annotations

import ast

from codex_lab.data.functions import FunctionRecord, TaskExample, _docstring_node


def completion_example(fn: FunctionRecord) -> TaskExample | None:
    """Signature + docstring -> the rest of the body (original text). None without a docstring."""
    node = ast.parse(fn.source).body[0]
    assert isinstance(node, ast.FunctionDef)
    doc = _docstring_node(node)
    if doc is None or len(node.body) < 2:
        return None
    lines = fn.source.splitlines(keepends=True)
    cut = doc.end_lineno or doc.lineno
    prompt, answer = "".join(lines[:cut]), "".join(lines[cut:])
    if not answer.strip():
        return None
    return TaskExample(f"completion:{fn.uid}", "completion", prompt, answer, fn.uid, fn.split)


def docstring_example(fn: FunctionRecord) -> TaskExample | None:
    """The function without its docstring (normalised code) -> the docstring text."""
    tree = ast.parse(fn.source)
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    doc = _docstring_node(node)
    if doc is None or len(node.body) < 2:
        return None
    text = ast.get_docstring(node) or ""
    if len(text.split()) < 3:
        return None
    node.body = node.body[1:]
    return TaskExample(f"docstring:{fn.uid}", "docstring", ast.unparse(tree) + "\n", text, fn.uid, fn.split)


# --------------------------------------------------------------------------------------
# Translation proxy: snake_case -> camelCase local names
# --------------------------------------------------------------------------------------


def camel(name: str) -> str:
    """snake_case -> camelCase (leading/trailing underscores kept): ``max_len`` -> ``maxLen``."""
    core = name.strip("_")
    if "_" not in core:
        return name
    lead = name[: len(name) - len(name.lstrip("_"))]
    trail = name[len(name.rstrip("_")) :]
    words = [w for w in core.split("_") if w]
    return lead + words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:]) + trail


def to_camel_case(code: str) -> str:
    """Rename the function's arguments and assigned local names to camelCase (AST rewrite).

    Attribute names, globals, keyword-argument names of calls and the function's own name
    are untouched, so the renamed function behaves exactly like the original.
    """
    tree = ast.parse(code)
    fn = tree.body[0]
    if not isinstance(fn, ast.FunctionDef):
        raise ValueError("to_camel_case expects code that starts with a function definition")
    a = fn.args
    local = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []), *([a.kwarg] if a.kwarg else [])]}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            local.add(node.id)
    for node in ast.walk(fn):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            local -= set(node.names)  # module-level names must keep their spelling
    rename = {n: camel(n) for n in local if camel(n) != n}
    taken = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} | {x.arg for x in ast.walk(fn) if isinstance(x, ast.arg)}
    rename = {k: v for k, v in rename.items() if v not in taken}  # never collide with an existing name
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id in rename:
            node.id = rename[node.id]
        elif isinstance(node, ast.arg) and node.arg in rename:
            node.arg = rename[node.arg]
    return ast.unparse(tree)


def translate_example(fn: FunctionRecord) -> TaskExample | None:
    """Normalised code (docstring removed) -> the same code with camelCase locals (a proxy task)."""
    tree = ast.parse(fn.code)
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    if _docstring_node(node) is not None and len(node.body) > 1:
        node.body = node.body[1:]
    code = ast.unparse(tree)
    out = to_camel_case(code)
    if out == code:
        return None
    return TaskExample(f"translate:{fn.uid}", "translate", code + "\n", out + "\n", fn.uid, fn.split)
