"""The testgen task (lesson 05): the function without its examples -> doctest examples that
hold for it, checked by running them in the sandbox (a separate process with limits)."""

from __future__ import annotations

import ast
import doctest
import json
import re
import textwrap
from typing import Sequence

from codex_lab.sandbox import run_python
from codex_lab.data.functions import FunctionRecord, TaskExample, _docstring_node




def doctest_answer(docstring: str) -> str:
    """The doctest examples of a docstring, normalised: ``>>> src`` / ``... more`` / output lines."""
    parts = []
    for ex in doctest.DocTestParser().get_examples(docstring):
        src = ex.source.rstrip("\n").split("\n")
        parts.append("\n".join([">>> " + src[0], *("... " + s for s in src[1:])]) + "\n" + ex.want)
    return "".join(parts)


def _testgen_candidate(fn: FunctionRecord) -> TaskExample | None:
    if not fn.top_level:
        return None
    tree = ast.parse(fn.source)
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    doc = _docstring_node(node)
    text = ast.get_docstring(node, clean=True) if doc is not None else None
    if doc is None or not text or ">>>" not in text:
        return None
    answer = doctest_answer(text)
    if not answer.strip():
        return None
    head = text[: text.index(">>>")].rstrip()
    if head:
        doc.value = ast.Constant(head)
    elif len(node.body) > 1:
        node.body = node.body[1:]
    else:
        return None
    prompt = ast.unparse(tree) + "\n"
    return TaskExample(f"testgen:{fn.uid}", "testgen", prompt, answer, fn.uid, fn.split, run_context(fn))


def module_name(path: str) -> str:
    """Import name of a corpus file: ``json/decoder.py`` -> ``json.decoder``."""
    mod = path[: -len(".py")] if path.endswith(".py") else path
    mod = mod.replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def run_context(fn: FunctionRecord) -> str:
    """Code that defines ``fn`` with its module's names in scope (for running its doctests).

    The module is imported by name when it can be (standard-library corpus), then the file's
    absolute imports run, then the function's own source: tests run against that source.
    """
    imports = textwrap.indent(fn.imports or "pass", "    ")
    return (
        f"try:\n    import importlib as _il\n    globals().update(vars(_il.import_module({module_name(fn.path)!r})))\n"
        "except Exception:\n    pass\n"
        f"try:\n{imports}\nexcept Exception:\n    pass\n\n{fn.source}"
    )


_RUNNER = '''
import doctest, json, signal, sys
def _alarm(*a):
    raise TimeoutError("doctest took too long")
signal.signal(signal.SIGALRM, _alarm)
results = []
for context, tests in json.loads(CASES):
    ok = False
    try:
        signal.alarm(2)
        g = {"__name__": "__codex_lab_testgen__"}
        exec(compile(context, "<function>", "exec"), g)
        test = doctest.DocTestParser().get_doctest(tests, g, "generated", None, 0)
        runner = doctest.DocTestRunner(verbose=False, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        res = runner.run(test, out=lambda s: None)
        ok = res.attempted > 0 and res.failed == 0
    except BaseException:
        ok = False
    finally:
        signal.alarm(0)
    results.append(ok)
print("RESULTS" + json.dumps(results))
'''


def run_doctests(cases: Sequence[tuple[str, str]], *, timeout_s: float = 60.0) -> list[bool]:
    """Run each (context code, doctest text) pair in one sandboxed child process.

    A case passes when at least one example ran and none failed (2 s limit per case).
    Returns one bool per case; all False if the child itself failed or timed out.
    """
    if not cases:
        return []
    code = "CASES = " + repr(json.dumps(list(cases))) + "\n" + _RUNNER
    res = run_python(code, timeout_s=timeout_s, memory_mb=1024)
    m = re.search(r"RESULTS(\[.*\])", res.stdout)
    if m is None:
        return [False] * len(cases)
    return [bool(x) for x in json.loads(m.group(1))]
