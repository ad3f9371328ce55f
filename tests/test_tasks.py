"""Task builders (lesson 05): determinism, no leakage, bugs that change behaviour, masking."""

from __future__ import annotations

import ast
import signal
import textwrap

import pytest
import torch

from codex_lab.data.corpus import SourceFile, load_corpus
from codex_lab.data.bugs import MUTATIONS, apply_mutation, inject_bug, mutation_sites
from codex_lab.data.task_batches import collate, encode_example, encode_tasks
from codex_lab.data.doctests import run_doctests
from codex_lab.data.task_builders import to_camel_case
from codex_lab.data.tasks import TASKS, build_tasks, task_files
from codex_lab.data.tokenizer import ANSWER, TASK_TAGS

# Small pure functions with inputs: every mutation site of each must change some output.
PURE = {
    "clamp": (
        "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n",
        [(x, 0, 10) for x in range(-3, 14)],
    ),
    "safe_div": ("def safe_div(a, b):\n    return a / b if b != 0 else 0.0\n", [(6, 3), (3, 6), (5, 0), (4, 1), (1, 4)]),
    "first_three": ("def first_three(xs):\n    return xs[:3]\n", [([1, 2, 3, 4, 5],)]),
    "span": ("def span(a, b):\n    return list(range(a, b + 1))\n", [(0, 3), (2, 5)]),
    "count_while": (
        "def count_while(n):\n    k = 0\n    while k * k < n:\n        k = k + 1\n    return n - k\n",
        [(n,) for n in range(0, 12)],
    ),
    "power_or_neg": ("def power_or_neg(a, b, flag):\n    return a ** b if flag is None else -(a % b)\n", [(2, 3, None), (7, 3, 1), (3, 2, None), (5, 7, 0)]),
}

SYNTH = {
    "mod_a.py": '''
import math

def clamp(x, lo, hi):
    """Clamp x into [lo, hi].

    >>> clamp(5, 0, 3)
    3
    >>> clamp(-1, 0, 3)
    0
    """
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def hyp(a_side, b_side):
    """Length of the hypotenuse of a right triangle.

    >>> hyp(3, 4)
    5.0
    """
    total_sq = a_side * a_side + b_side * b_side
    return math.sqrt(total_sq)


def wrong_doc(n):
    """A doctest that does not hold.

    >>> wrong_doc(2)
    5
    """
    return n + 1
''',
    "pkg/mod_b.py": '''
def window_sum(values, width):
    """Sum of every window of ``width`` consecutive values."""
    out_list = []
    for start in range(len(values) - width + 1):
        out_list.append(sum(values[start:start + width]))
    return out_list


class Box:
    def area(self, scale_factor):
        """Area of the box, scaled."""
        full_area = self.w * self.h
        return full_area * scale_factor

    def fits(self, other_box):
        """True when this box fits inside ``other_box``."""
        fits_w = self.w <= other_box.w
        return fits_w and self.h <= other_box.h


def copy_of_clamp(x, lo, hi):
    """Clamp x into [lo, hi]."""
    if x < lo:
        return lo
    return min(x, hi)
''',
}


def synth_files() -> list[SourceFile]:
    """The synthetic corpus as corpus files (half of them forced into each split by hash)."""
    return [SourceFile(p, textwrap.dedent(t).lstrip(), "train") for p, t in SYNTH.items()]


class _Hang(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _Hang()


def _run(code: str, name: str, args: tuple) -> object:
    """Output of ``name(*args)``; a crash or a hang (a mutated loop may never end) is an outcome too."""
    ns: dict = {}
    exec(code, ns)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    try:
        return ns[name](*args)
    except _Hang:
        return "hangs"
    except Exception as exc:
        return f"raised {type(exc).__name__}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_every_mutation_site_changes_behaviour():
    kinds = set()
    for name, (code, inputs) in PURE.items():
        tree = ast.parse(code)
        sites = mutation_sites(tree)
        assert sites, f"{name} has no mutation site"
        for kind, idx in sites:
            kinds.add(kind)
            mutated = ast.unparse(apply_mutation(tree, kind, idx))
            assert mutated != ast.unparse(tree), (name, kind)
            before = [_run(code, name, a) for a in inputs]
            after = [_run(mutated, name, a) for a in inputs]
            assert before != after, f"{kind} at node {idx} of {name} did not change any output:\n{mutated}"
    assert kinds == set(MUTATIONS)  # every mutation kind was exercised


def test_inject_bug_is_deterministic_and_changes_text():
    code = ast.unparse(ast.parse(PURE["clamp"][0]))
    a, b = inject_bug(code, "key-1"), inject_bug(code, "key-1")
    assert a == b and a is not None and a[0] != code
    assert inject_bug("def f():\n    return g()\n", "k") is None  # no site: no example
    with pytest.raises(ValueError, match="unknown mutation"):
        apply_mutation(ast.parse(code), "delete_everything", 0)


def test_camel_case_proxy_preserves_behaviour():
    code = ast.unparse(ast.parse(SYNTH["pkg/mod_b.py"].split("class Box")[0].strip()))
    out = to_camel_case(code)
    assert "outList" in out and "out_list" not in out and "width" in out
    for args in [([1, 2, 3, 4], 2), ([5], 1), ([], 3)]:
        assert _run(code, "window_sum", args) == _run(out, "window_sum", args)
    g = "def f(a_b):\n    global total_count\n    total_count = a_b\n    return total_count\n"
    assert "total_count = aB" in to_camel_case(g)  # globals keep their names


def test_build_tasks_on_synthetic_corpus():
    ts = build_tasks(synth_files(), TASKS, val_fraction=0.5)
    ts2 = build_tasks(synth_files(), TASKS, val_fraction=0.5)
    assert ts.examples == ts2.examples  # deterministic
    ids = [e.id for t in ts.examples.values() for s in t.values() for e in s]
    assert len(ids) == len(set(ids))
    tg = [e for s in ts.examples["testgen"].values() for e in s]
    names = {e.func.split("::")[1] for e in tg}
    assert names == {"clamp", "hyp"}, names  # wrong_doc's doctest fails in the sandbox: dropped
    clamp = next(e for e in tg if e.func.endswith("::clamp"))
    assert ">>>" not in clamp.prompt and clamp.answer.startswith(">>> clamp(5, 0, 3)\n3\n")
    for task in ("completion", "bugfix", "docstring", "translate"):
        exs = [e for s in ts.examples[task].values() for e in s]
        assert exs, f"no {task} example"
        assert all(e.prompt != e.answer for e in exs)
    comp = next(e for s in ts.examples["completion"].values() for e in s if e.func.endswith("Box.area"))
    assert comp.prompt.startswith("def area(self, scale_factor):") and comp.answer.strip().startswith("full_area =")
    assert TASK_TAGS["completion"] in comp.text() and ANSWER in comp.text()


def test_no_function_leaks_across_splits_on_the_stdlib():
    corpus = load_corpus(max_files=120)
    ts = build_tasks(task_files(corpus, 0.5), ("completion", "bugfix", "docstring"), val_fraction=0.2, verify_tests=False)
    by_split = {s: set() for s in ("train", "val")}
    code_split: dict[str, set[str]] = {}
    for task, splits in ts.examples.items():
        for s, exs in splits.items():
            for e in exs:
                by_split[s].add(e.func)
                code_split.setdefault(e.answer if task == "bugfix" else e.prompt + e.answer, set()).add(s)
    assert by_split["train"] and by_split["val"]
    assert not by_split["train"] & by_split["val"]
    assert all(len(v) == 1 for v in code_split.values())  # identical text never in both splits
    sizes = {t: sum(v.values()) for t, v in ts.sizes().items()}
    assert sizes["completion"] > sizes["bugfix"] > 0, sizes  # completion is the large task
    assert all(e.prompt != e.answer for e in ts.examples["bugfix"]["train"])


def test_run_doctests_passes_only_true_examples():
    ctx = "def sq(x):\n    return x * x\n"
    ok = run_doctests([(ctx, ">>> sq(3)\n9\n"), (ctx, ">>> sq(3)\n10\n"), (ctx, "no examples here"), (ctx, ">>> sq(\n")])
    assert ok == [True, False, False, False]


def test_collate_masks_all_but_answer_tokens(small_tokenizer):
    ts = build_tasks(synth_files(), ("completion", "bugfix"), val_fraction=0.5)
    exs = ts.examples["completion"]["train"] + ts.examples["completion"]["val"] + ts.examples["bugfix"]["train"]
    enc = [encode_example(small_tokenizer, e, k) for k, e in enumerate(exs[:3])]
    b = collate(enc, small_tokenizer.pad_id)
    assert b.x.shape == b.y.shape
    for i, e in enumerate(enc):
        valid = b.y[i][b.y[i] != -100].tolist()
        assert valid == e.answer_ids  # exactly the answer and end-of-text carry loss
        assert valid[-1] == small_tokenizer.eot_id
        assert int(b.valid[i]) == len(e.answer_ids)
        p = len(e.prompt_ids)
        assert b.y[i, p - 2] == -100 and b.y[i, p - 1] == e.answer_ids[0]
        assert b.x[i, p - 1] == e.prompt_ids[-1]  # the <|answer|> token predicts the first answer token
        assert e.prompt_ids[-1] == small_tokenizer.token_id(ANSWER)
    assert b.task.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="at least one"):
        collate([], 0)
    short = encode_tasks(small_tokenizer, {"completion": exs}, ["completion"], max_len=10)
    assert short["completion"] == []  # longer examples are dropped, never truncated
    assert torch.equal(b.valid, (b.y != -100).sum(1))


def test_unknown_task_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown tasks"):
        build_tasks(synth_files(), ("completion", "poetry"))
