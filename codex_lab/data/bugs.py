"""The bugfix task (lesson 05): one injected bug per function by an AST mutation (flipped
comparison, off-by-one constant, swapped operands, negated condition); the answer is the original."""

from __future__ import annotations

import ast
import copy

from codex_lab.data.functions import FunctionRecord, TaskExample, _bucket, _docstring_node

MUTATIONS: tuple[str, ...] = ("flip_compare", "off_by_one", "swap_operands", "negate_condition")


_FLIP: dict[type, type] = {
    ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_NONCOMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)


def mutation_sites(tree: ast.AST) -> list[tuple[str, int]]:
    """Every place one of :data:`MUTATIONS` applies, as (kind, index in ``ast.walk`` order).

    - flip_compare: a one-operator comparison, operator replaced by its negation (< -> >=);
    - off_by_one: an int constant inside a comparison, a subscript or a ``range`` call, +1;
    - swap_operands: a non-commutative binary operation with different operands (a - b -> b - a);
    - negate_condition: the test of ``if``/``while``/``x if c else y`` wrapped in ``not``.
    """
    sites: list[tuple[str, int]] = []
    int_ctx: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Compare, ast.Subscript)) or (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
        ):
            int_ctx.update(id(n) for n in ast.walk(node))
    for i, node in enumerate(ast.walk(tree)):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP:
            sites.append(("flip_compare", i))
        elif isinstance(node, ast.Constant) and type(node.value) is int and id(node) in int_ctx:
            sites.append(("off_by_one", i))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, _NONCOMMUTATIVE) and ast.dump(node.left) != ast.dump(node.right):
            sites.append(("swap_operands", i))
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            sites.append(("negate_condition", i))
    return sites


def apply_mutation(tree: ast.AST, kind: str, index: int) -> ast.AST:
    """A mutated deep copy of ``tree``: mutation ``kind`` at node ``index`` (``ast.walk`` order)."""
    if kind not in MUTATIONS:
        raise ValueError(f"unknown mutation {kind!r}; choose one of {MUTATIONS}")
    new = copy.deepcopy(tree)
    node = list(ast.walk(new))[index]
    if kind == "flip_compare":
        assert isinstance(node, ast.Compare)
        node.ops = [_FLIP[type(node.ops[0])]()]
    elif kind == "off_by_one":
        assert isinstance(node, ast.Constant)
        node.value = node.value + 1
    elif kind == "swap_operands":
        assert isinstance(node, ast.BinOp)
        node.left, node.right = node.right, node.left
    else:
        assert isinstance(node, (ast.If, ast.While, ast.IfExp))
        t = node.test
        # not (not c) would only be a cosmetic change: unwrap instead
        node.test = t.operand if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) else ast.UnaryOp(op=ast.Not(), operand=t)
    return ast.fix_missing_locations(new)


def inject_bug(code: str, key: str) -> tuple[str, str] | None:
    """(buggy code, mutation kind) for ``code``; the site is chosen by a stable hash of ``key``.

    Returns None when no site exists or the mutation would not change the code text.
    """
    tree = ast.parse(code)
    sites = mutation_sites(tree)
    if not sites:
        return None
    kind, index = sites[_bucket(key) % len(sites)]
    buggy = ast.unparse(apply_mutation(tree, kind, index))
    if buggy == ast.unparse(tree):
        return None
    return buggy, kind


def bugfix_example(fn: FunctionRecord) -> TaskExample | None:
    """Buggy function (normalised code, docstring removed) -> the original function."""
    tree = ast.parse(fn.code)
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    if _docstring_node(node) is not None and len(node.body) > 1:
        node.body = node.body[1:]  # shorter examples; the docstring is not what is being fixed
    code = ast.unparse(tree)
    res = inject_bug(code, fn.uid)
    if res is None:
        return None
    buggy, _kind = res
    return TaskExample(f"bugfix:{fn.uid}", "bugfix", buggy + "\n", code + "\n", fn.uid, fn.split)
