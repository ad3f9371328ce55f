"""Near-duplicate audit: does a test item reappear in the training set once names and constants are masked?

:func:`normalise` maps a problem's text to a skeleton: every number becomes ``0``, every
non-empty string literal ``"S"``, a run of masked items one item, doctest examples
(data) are dropped, every name the code *binds* (function names, parameters,
assigned variables, loop and lambda variables, in Python and JavaScript) ``ID``; the
special tokens are removed. Builtins, methods, operators and the docstring's prose stay:
they carry the structure. Two programs that differ only in names and constants (the
first codebench's ``add_3(x)`` and ``add_7(n)``) get the same skeleton; programs of
different structures do not.

:func:`audit` counts the test items whose skeleton equals some training item's skeleton.
A benchmark held out by structure (codebench 2's ``iid``, ``length``, ``compose``) must show
0; the first codebench (``legacy``, held out by constant) shows most of its items.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from codex_lab.data.tokenizer import SPECIAL_TOKENS

_TRIPLE = "\x00"
_STRING = re.compile(r"\"(?:[^\"\\\n]|\\.)+\"|'(?:[^'\\\n]|\\.)+'")
_NUMBER = re.compile(r"\d+")
_WORD = re.compile(r"[A-Za-z_]\w*")
_EXAMPLE = re.compile(r"^[ \t]*>>>.*\n[^\n]*\n?", re.M)  # a doctest line and its expected output
_SEQUENCE = re.compile(r'(-?0|"S")(?:\s*,\s*(?:-?0|"S"))+')  # 0, 0, 0 -> 0 (lengths of data are data)
# (guard, pattern): a pattern runs only on text that contains its guard (speed: most texts are short)
_BINDERS = (
    ("def", re.compile(r"\bdef\s+(\w+)\s*\(([^)]*)\)")),            # Python def name(params)
    ("function", re.compile(r"\bfunction\s+(\w+)\s*\(([^)]*)\)")),  # JS function name(params)
    ("", re.compile(r"\b(?:let|const|var)\s+(\w+)")),                # JS declarations
    ("=", re.compile(r"^[ \t]*(\w+)[ \t]*=(?!=)", re.M)),              # assignments at the start of a line
    ("for", re.compile(r"\bfor\s+(\w+)(?:\s*,\s*(\w+))?\s+in\b")),   # comprehension / loop variables
    ("lambda", re.compile(r"\blambda\s+([\w\s,]*):")),               # Python lambdas
    ("=>", re.compile(r"\(\s*(\w+)(?:\s*,\s*(\w+))?\s*\)\s*=>")),   # JS (a, b) => ...
    ("=>", re.compile(r"(\w+)[ \t]*=>")),                              # JS a => ...
)


def bound_names(text: str) -> set[str]:
    """Names the code in ``text`` binds (function, parameters, variables), Python or JavaScript."""
    out: set[str] = set()
    for guard, rx in _BINDERS:
        if guard and guard not in text:
            continue
        for m in rx.finditer(text):
            for g in m.groups():
                if g:
                    out.update(_WORD.findall(g))
    return out


def normalise(text: str) -> str:
    """The skeleton of ``text``.

    Special tokens and doctest examples (``>>>`` lines and their outputs: data, not
    structure) are removed; numbers -> ``0``; non-empty string literals -> ``"S"``; runs of
    masked items (``0, 0, 0``) -> one; names the code binds -> ``ID``; whitespace collapsed.
    """
    for tok in SPECIAL_TOKENS:
        text = text.replace(tok, " ")
    text = _EXAMPLE.sub("", text)
    names = bound_names(text)
    text = text.replace('"""', _TRIPLE)
    text = _STRING.sub('"S"', text)
    text = text.replace(_TRIPLE, '"""')
    text = _NUMBER.sub("0", text)
    text = _SEQUENCE.sub(r"\1", text)
    if names:
        text = _WORD.sub(lambda m: "ID" if m.group(0) in names else m.group(0), text)
    return " ".join(text.split())


def item_text(item: Any) -> str:
    """The text audited for a problem (its input and canonical answer) or a ``TaskExample`` (prompt and answer)."""
    if hasattr(item, "canonical_solution"):  # as its fine-tuning example would read (``task_example``)
        prompt = item.prompt if item.family == "fim" else item.code
        return f"{prompt}\n{item.canonical_solution}"
    return f"{item.prompt}\n{item.answer}"


@dataclass(frozen=True)
class Audit:
    """Test items checked, how many equal a training item exactly, and how many after :func:`normalise`."""

    test_items: int
    train_items: int
    exact: int
    near: int
    examples: tuple[str, ...] = ()

    def line(self) -> str:
        """The one-line summary every score printout shows."""
        share = self.near / self.test_items if self.test_items else 0.0
        return (f"audit: {self.near}/{self.test_items} test items ({share:.1%}) equal a training item after masking "
                f"digits, strings and names ({self.exact} exactly), against {self.train_items} training items")


def audit(test_items: Sequence[Any], train_items: Iterable[Any]) -> Audit:
    """Count ``test_items`` whose text (exact) or skeleton (:func:`normalise`) equals a training item's."""
    train = [item_text(t) for t in train_items]
    exact_set, near_set = set(train), {normalise(t) for t in train}
    exact = near = 0
    examples: list[str] = []
    for p in test_items:
        t = item_text(p)
        exact += t in exact_set
        if normalise(t) in near_set:
            near += 1
            if len(examples) < 3:
                examples.append(getattr(p, "task_id", "") or t[:60])
    return Audit(len(test_items), len(train), exact, near, tuple(examples))
