"""Forged answers earn nothing: the submission's process runs against the learner's view of the
package (course/learner_view.py), in which the functions the exercises ask for are absent,
with the real package neither importable nor readable; library built-ins that do an
exercise's job are absent too; and in a folder run each submission sees only its own file.

The routes are the red team's (issue 42 item 1, issue 40 item 6): disarming the audit hook
by walking the stack, then loading a fresh copy of the module from its file; reading the
source with ``os.open(name, dir_fd=...)``; exec'ing an edited copy of the real source
(``"".join`` -> ``str("").join``: another bytecode fingerprint); reload and ``sys.modules``
games; ``F.scaled_dot_product_attention``, ``F.cross_entropy`` and ``TopPLogitsWarper``
shortcuts; and a submission that looks for a sibling submission's file, 20 times over.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from codex_lab.sandbox import isolation_mode

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "codex_lab"
NAMESPACES = isolation_mode() in ("root", "userns")

# every lesson-00 attack defines both exercises through one route to the package's answer:
# _answer(module, function, file relative to codex_lab/) -> the function, or raises
LESSON00 = '''
import importlib, importlib.util, os, sys

def _real():  # (the grader loads only imports, functions and classes: no module-level constants)
    return {real!r}


def chars_per_token(tokenizer, texts):
    return _answer("codex_lab.data.tokenizer", "tokenizer_summary", "data/tokenizer.py")(tokenizer, texts)["chars_per_token"]


def cut_at_function_end(completion):
    return _answer("codex_lab.infer.syntax", "cut_function", "infer/syntax.py")(completion)


def _paths(module, rel):
    out = [os.path.join(_real(), rel)]
    try:
        out.append(importlib.import_module(module).__file__)
    except Exception:
        pass
    return out


def _run_source(src, fname, tag):
    ns = {{"__name__": "forged_" + tag}}
    exec(compile(src, "forged_" + tag + ".py", "exec"), ns)
    return ns[fname]
'''

ROUTES = {
    # (a) the switch: every dict on the stack with an "armed" key set to False, then a fresh copy from the file
    "disarm": '''
def _answer(module, fname, rel):
    f = sys._getframe()
    while f is not None:
        for v in list(f.f_locals.values()) + list(f.f_globals.values()):
            if isinstance(v, dict) and "armed" in v:
                v["armed"] = False
                v["busy"] = True
        f = f.f_back
    for i, p in enumerate(_paths(module, rel)):
        try:
            spec = importlib.util.spec_from_file_location("fresh_%d" % i, p)
            m = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(m)
            return getattr(m, fname)
        except Exception:
            continue
    raise NotImplementedError("no route")
''',
    # (b) a read the hook's path check does not see: a directory descriptor and a bare name
    "dirfd": '''
def _answer(module, fname, rel):
    for p in _paths(module, rel):
        try:
            d = os.open(os.path.dirname(p), os.O_RDONLY)
            fd = os.open(os.path.basename(p), os.O_RDONLY, dir_fd=d)
            src = os.read(fd, 1 << 20).decode()
            return _run_source(src, fname, "dirfd")
        except Exception:
            continue
    raise NotImplementedError("no route")
''',
    # (b) an edited copy of the real source: one token changed, so another bytecode fingerprint
    "edited": '''
def _read(p):
    try:
        return open(p).read()
    except Exception:
        d = os.open(os.path.dirname(p), os.O_RDONLY)
        return os.read(os.open(os.path.basename(p), os.O_RDONLY, dir_fd=d), 1 << 20).decode()


def _answer(module, fname, rel):
    for p in _paths(module, rel):
        try:
            src = _read(p).replace('"".join', 'str("").join').replace("max(n_tokens, 1)", "max(int(n_tokens), 1)")
            return _run_source(src, fname, "edited")
        except Exception:
            continue
    raise NotImplementedError("no route")
''',
    # reload tricks: importlib.reload, then the module dropped from sys.modules and imported again
    "reload": '''
def _answer(module, fname, rel):
    try:
        m = importlib.reload(importlib.import_module(module))
        fn = getattr(m, fname)
        fn.__code__  # a stub raises on call, not here: call paths below judge
        return fn
    except Exception:
        pass
    for k in [k for k in sys.modules if k.startswith("codex_lab")]:
        del sys.modules[k]
    return getattr(importlib.import_module(module), fname)
''',
    # sys.modules and sys.path games: the real checkout put first on the import path, every codex_lab module forgotten
    "syspath": '''
def _answer(module, fname, rel):
    for k in [k for k in sys.modules if k.startswith("codex_lab")]:
        del sys.modules[k]
    sys.path.insert(0, os.path.dirname(_real()))
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    loader = importlib.machinery.SourceFileLoader("forged_real", os.path.join(_real(), rel))
    try:
        m = loader.load_module()
        return getattr(m, fname)
    except Exception:
        return getattr(importlib.import_module(module), fname)
''',
}

BUILTINS = {
    "01_attention_patterns.py": '''
import torch
import torch.nn.functional as F


def causal_attention_probs(q, k):
    T = q.shape[-2]
    eye = torch.eye(T, dtype=q.dtype).expand(q.shape[0], T, T)  # v = identity: the output is the weights
    return F.scaled_dot_product_attention(q, k, eye, is_causal=True)
''',
    "03_gqa.py": '''
import torch
import torch.nn.functional as F


def grouped_decode_attention(q, k, v, lengths):
    S = k.shape[2]
    valid = torch.arange(S)[None, :] < lengths[:, None]  # (B, S)
    out = F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=valid[:, None, None, :], enable_gqa=True)
    return out[:, :, 0]
''',
    "05_multitask.py": '''
import torch.nn.functional as F


def masked_token_loss(logits, targets):
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)
''',
    "06_fast_inference.py": '''
import torch
import torch.nn.functional as F


def cached_attention(k_buf, v_buf, length, q, k_new, v_new):
    k_buf[:, :, length : length + 1] = k_new
    v_buf[:, :, length : length + 1] = v_new
    return F.scaled_dot_product_attention(q, k_buf[:, :, : length + 1], v_buf[:, :, : length + 1])


def nucleus_filter(logits, p):
    from transformers.generation.logits_process import TopPLogitsWarper
    return TopPLogitsWarper(top_p=p, min_tokens_to_keep=1)(None, logits)
''',
}

SIBLING = '''
import glob, os

def _solved():
    return {solved!r}


def _candidates():
    found = [_solved(), os.path.join(os.path.dirname(os.path.dirname(_solved())), "solved", "00_tour.py")]
    for pat in ("../*/0*_tour.py", "/tmp/*/0*_tour.py", "/tmp/*/*/0*_tour.py", "/tmp/*/*/*/0*_tour.py",
                "/proc/*/cwd/0*_tour.py", "/proc/*/cwd/*/0*_tour.py", "/proc/*/root/tmp/*/*/0*_tour.py", {subs_glob!r}):
        try:
            found += glob.glob(pat)
        except Exception:
            pass
    return found


def chars_per_token(tokenizer, texts):
    for p in _candidates():
        try:
            src = open(p).read()
        except Exception:
            continue
        if "_candidates" in src:
            continue
        ns = {{}}
        try:
            exec(compile(src, p, "exec"), ns)
            return ns["chars_per_token"](tokenizer, texts)
        except Exception:
            continue
    raise NotImplementedError("no sibling found")
'''

N_SIBLINGS = 20


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One folder run: the lesson-00 routes, the built-in shortcuts, a solved submission and
    20 submissions that look for it (2 at a time, so they run beside each other)."""
    from codex_lab.course.grading import grade_folder

    subs = tmp_path_factory.mktemp("forgery") / "subs"
    subs.mkdir()
    for name, route in ROUTES.items():
        (subs / name).mkdir()
        (subs / name / "00_tour.py").write_text(LESSON00.format(real=str(PKG)) + route)
    for fname, src in BUILTINS.items():
        d = subs / ("builtin_" + fname[:2])
        d.mkdir()
        (d / fname).write_text(textwrap.dedent(src))
    (subs / "solved").mkdir()
    shutil.copy(ROOT / "solutions" / "00_tour.py", subs / "solved" / "00_tour.py")
    for i in range(N_SIBLINGS):
        d = subs / f"sibling{i:02d}"
        d.mkdir()
        (d / "00_tour.py").write_text(SIBLING.format(solved=str(subs / "solved" / "00_tour.py"),
                                                    subs_glob=str(subs) + "/*/0*_tour.py"))
    rows = grade_folder(subs, timeout_s=60, jobs=2)
    return {(r["submission"].split("/")[0], r["name"]): r for r in rows}


needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="hiding the real package needs the namespace sandbox")


@needs_namespaces
@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("exercise", ["chars_per_token", "cut_at_function_end"])
def test_forging_routes_earn_nothing(graded, route, exercise):
    r = graded[(route, exercise)]
    assert r["points"] == 0, r
    assert r["status"] in ("failed", "not yet done", "error"), r


@needs_namespaces
@pytest.mark.parametrize("sub,exercise", [("builtin_01", "causal_attention_probs"), ("builtin_03", "grouped_decode_attention"),
                                          ("builtin_05", "masked_token_loss"), ("builtin_06", "cached_attention"),
                                          ("builtin_06", "nucleus_filter")])
def test_builtin_shortcuts_earn_nothing(graded, sub, exercise):
    r = graded[(sub, exercise)]
    assert r["points"] == 0, r
    assert "write this one yourself" in r["message"], r


@needs_namespaces
def test_a_sibling_is_never_visible(graded):
    assert graded[("solved", "chars_per_token")]["status"] == "passed"  # the sibling is there to be found, and right
    earned = {i: graded[(f"sibling{i:02d}", "chars_per_token")] for i in range(N_SIBLINGS)}
    assert all(r["points"] == 0 for r in earned.values()), {i: r for i, r in earned.items() if r["points"]}
    # each ran its whole search and found nothing (its last line raises NotImplementedError): not a timeout
    assert all(r["status"] == "not yet done" for r in earned.values()), earned


def test_folder_runs_without_namespaces_are_refused_unless_accepted(tmp_path, monkeypatch):
    import codex_lab.sandbox as sb
    from codex_lab.course.grading import grade_folder

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "00_tour.py").write_text("def chars_per_token(tokenizer, texts):\n    return 1.0\n")
    monkeypatch.setattr(sb, "isolation_mode", lambda: "plain")
    monkeypatch.delenv("CODEX_LAB_SANDBOX", raising=False)
    with pytest.raises(RuntimeError, match="CODEX_LAB_SANDBOX=plain"):
        grade_folder(tmp_path)


def test_the_learners_view_lacks_the_answers_and_the_checks():
    from codex_lab.course.checks import load_all
    from codex_lab.course.learner_view import stub_message, view_for

    names = sorted({f for e in load_all().values() for f in e.forbid})
    view = view_for(names) / "codex_lab"
    real = (PKG / "infer" / "syntax.py").read_text()
    mine = (view / "infer" / "syntax.py").read_text()
    assert '"".join(kept)' in real and '"".join(kept)' not in mine
    assert stub_message("codex_lab.infer.syntax.cut_function") in mine
    assert len(mine.splitlines()) == len(real.splitlines())  # line numbers kept
    assert not list(view.glob("lessons/*/checks.py")) and (view / "course" / "checks.py").is_file()
    for p in view.rglob("*.py"):  # nothing else lost: every other module is the real one
        q = PKG / p.relative_to(view)
        assert q.is_file(), p


def test_stub_source_keeps_everything_but_the_bodies():
    from codex_lab.course.learner_view import stub_source

    src = textwrap.dedent('''
        import functools


        def keep(x):
            return x


        @functools.lru_cache
        def answer(x):
            """Doc."""
            y = x + 1  # comment
            return y


        class Pool:
            def blocks_for(self, n): return -(-n // 4)

            @property
            def size(self):
                return 3
        ''')
    out = stub_source(src, {"answer": "m.answer", "Pool.blocks_for": "m.Pool.blocks_for"})
    ns: dict = {}
    exec(out, ns)
    assert ns["keep"](2) == 2 and ns["Pool"]().size == 3 and ns["answer"].__doc__ == "Doc."
    for call in (lambda: ns["answer"](1), lambda: ns["Pool"]().blocks_for(9)):
        with pytest.raises(NotImplementedError, match="write this one yourself"):
            call()
    assert len(out.splitlines()) == len(src.splitlines())
    with pytest.raises(ValueError, match="not found"):
        stub_source(src, {"missing": "m.missing"})
