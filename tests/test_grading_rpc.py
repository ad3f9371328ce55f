"""The boundary between the checker and the submission's process (course/wire.py, remote.py,
submission_server.py): values cross as data, in-place changes and gradients come back,
forbidden functions refuse every copy (alias, default argument, clone, reload, exec of the
source, verbatim copy), and a process that hangs or exits costs only its call. Decoding an
answer never imports: a class the graded side names is looked up only among the allowed,
already loaded ones. And between the checker and the parent (checker.py, grade_runner.py):
each exercise's result is its own bounded frame, so an oversize, cut or malformed one costs
that exercise alone."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from codex_lab.course import wire
from codex_lab.course.forbid import ForbiddenCall
from codex_lab.course.remote import SubmissionGone, SubmissionProcess, SubmissionTimeout

SUBMISSION = '''
import importlib
import types

import numpy as np
import torch

import codex_lab
from codex_lab.nn.moe import route


def add(a, b):
    return a + b


def scale_in_place(q):
    q *= 2
    return q.sum()


def np_bool(x):
    return np.bool_(x > 0)


def fake_equal():
    class Yes(float):
        def __eq__(self, other):
            return True
    return Yes(1.0)


def square_sum(x):
    return (x ** 2).sum()


def detached(x):
    return (x ** 2).sum().detach()


def encode_len(tok, s):
    return len(tok.encode(s))


def alias(logits, k):
    return route(logits, k)


def default_arg(logits, k, r=codex_lab.route):
    return r(logits, k)


def clone(logits, k):
    f = types.FunctionType(codex_lab.route.__code__, codex_lab.route.__globals__)
    return f(logits, k)


def reload(logits, k):
    import codex_lab.nn.moe as m
    importlib.reload(m)
    return m.route(logits, k)


def exec_source(logits, k):
    import codex_lab.nn.moe as m
    ns = {}
    exec(open(m.__file__).read(), ns)
    return ns["route"](logits, k)


def restore_code(logits, k):
    codex_lab.route.__code__ = add.__code__
    return codex_lab.route(logits, k)


def spin():
    while True:
        pass


def leave():
    import os
    os._exit(3)


def not_done():
    raise NotImplementedError("exercise not_done: not yet done")
'''


@pytest.fixture(scope="module")
def proc(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sub")
    (folder / "sub.py").write_text(SUBMISSION)
    p = SubmissionProcess("sub.py", ["codex_lab.nn.moe.route"], cwd=str(folder), guard=False)
    assert p.load_error is None, p.load_error
    yield p
    p.close()


def test_values_round_trip_as_plain_data():
    value = (1, 2.5, float("nan"), -math.inf, True, None, "s", b"b", [1, (2, 3)], {"k": {1, 2}},
             torch.arange(6, dtype=torch.int16).reshape(2, 3), torch.tensor(1.5, dtype=torch.bfloat16),
             np.arange(3.0), torch.float16)
    tree, blobs = wire.pack(value)
    back = wire.decode(tree, blobs)
    assert repr(back[:8]) == repr(value[:8]) and back[8] == [1, (2, 3)] and back[9] == {"k": {1, 2}}
    assert torch.equal(back[10], value[10]) and back[10].dtype == torch.int16
    assert back[11].dtype == torch.bfloat16 and float(back[11]) == 1.5
    assert np.array_equal(back[12], value[12]) and back[13] is torch.float16
    assert type(wire.decode(*wire.pack(np.bool_(True)))) is bool  # numpy scalars become Python ones
    assert type(wire.decode(*wire.pack(np.float32(0.5)))) is float
    with pytest.raises(wire.WireError, match="cannot be graded"):
        wire.pack(object())
    with pytest.raises(wire.WireError, match="not the package's"):
        wire.decode({"$": "dc", "cls": "os:path", "v": {}}, [])
    with pytest.raises(wire.WireError, match="does not match"):
        wire.decode({"$": "t", "dtype": "float32", "shape": [4], "b": 0}, [b"\x00" * 3])


def test_calls_cross_as_data(proc):
    proc.budget(60)
    f = proc.function
    assert f("add")(1, 2.5) == 3.5
    assert type(f("np_bool")(3)) is bool  # a numpy.bool_ answer arrives as a bool
    with pytest.raises(TypeError, match="cannot be graded"):
        f("fake_equal")()  # no object with a custom __eq__ reaches the checker
    q = torch.ones(3)
    assert float(f("scale_in_place")(q)) == 6.0 and torch.equal(q, torch.full((3,), 2.0))  # the change comes back

    class Tok:
        def encode(self, s):
            return list(s)

    assert f("encode_len")(Tok(), "abcd") == 4  # objects that are not data travel as handles


def test_gradients_flow_through_the_submissions_process(proc):
    proc.budget(60)
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    loss = proc.function("square_sum")(x)
    loss.backward()
    assert torch.allclose(x.grad, torch.tensor([2.0, -4.0]))
    assert not proc.function("detached")(torch.ones(2, requires_grad=True)).requires_grad


@pytest.mark.parametrize("name", ["alias", "default_arg", "clone", "reload", "exec_source", "restore_code"])
def test_every_copy_of_a_forbidden_function_refuses(proc, name):
    proc.budget(60)
    with pytest.raises((ForbiddenCall, PermissionError)) as info:
        proc.function(name)(torch.randn(3, 4), 2)
    assert "write this one yourself" in str(info.value) or "__code__" in str(info.value)


def test_not_done_hang_and_exit_cost_one_call(tmp_path):
    (tmp_path / "sub.py").write_text(SUBMISSION)
    p = SubmissionProcess("sub.py", [], cwd=str(tmp_path), guard=False)
    try:
        p.budget(60)
        with pytest.raises(NotImplementedError):
            p.function("not_done")()
        p.budget(1.0)
        with pytest.raises(SubmissionTimeout):
            p.function("spin")()
        assert p.dead
    finally:
        p.close()
    p = SubmissionProcess("sub.py", [], cwd=str(tmp_path), guard=False)
    try:
        p.budget(60)
        with pytest.raises(SubmissionGone, match="exit code 3"):
            p.function("leave")()
    finally:
        p.close()


def test_a_verbatim_copy_of_a_forbidden_function_refuses(tmp_path):
    import inspect

    import codex_lab.nn.moe as moe

    src = "import torch\nfrom torch import Tensor\n" + textwrap.dedent(inspect.getsource(moe.route))
    (tmp_path / "sub.py").write_text(src)
    p = SubmissionProcess("sub.py", ["codex_lab.nn.moe.route"], cwd=str(tmp_path), guard=False)
    try:
        assert p.load_error is None, p.load_error
        p.budget(60)
        with pytest.raises(ForbiddenCall):
            p.function("route")(torch.randn(3, 4), 2)
    finally:
        p.close()


def test_copies_made_while_the_file_loads_refuse_too(tmp_path):
    src = textwrap.dedent('''
        import importlib

        import codex_lab.nn.moe as m


        class AtLoad:  # runs while the file loads, before any call
            try:
                importlib.reload(m)
                outcome = "reloaded"
            except PermissionError as exc:
                outcome = str(exc)
            try:
                source = open("/proc/self/cwd/../" + m.__file__).read()
            except (PermissionError, OSError) as exc:
                source = str(exc)


        def outcome():
            return AtLoad.outcome


        def route(logits, k):
            return m.route(logits, k)
        ''')
    (tmp_path / "sub.py").write_text(src)
    p = SubmissionProcess("sub.py", ["codex_lab.nn.moe.route"], cwd=str(tmp_path), guard=False)
    try:
        assert p.load_error is None, p.load_error
        p.budget(60)
        assert "write this one yourself" in p.function("outcome")()
        with pytest.raises(ForbiddenCall):
            p.function("route")(torch.randn(3, 4), 2)
    finally:
        p.close()


def test_a_gamed_capstone_design_is_judged_by_the_checker_alone(tmp_path):
    """The submission fills its own scorecard cache and patches the scorer, then returns a window longer
    than every scored sequence: the checker (another process) validates the design itself and refuses it."""
    from codex_lab.course.checks import load_all
    from codex_lab.course.outcome import FAILED, run_check

    src = textwrap.dedent('''
        from codex_lab.lessons.l08_capstone import scorecard as sc


        class Game:
            sc._CACHE.clear()
            sc.score = lambda m: []
            sc.validate_design = lambda design, cfg, *a, **k: []


        def my_design():
            return {"sparse_layers": [3], "pattern": "window:300", "n_kv_head": 2, "moe_layers": [3],
                    "n_experts": 2, "top_k": 1, "balance": "coba"}
        ''')
    (tmp_path / "08_capstone.py").write_text(src)
    p = SubmissionProcess("08_capstone.py", [], cwd=str(tmp_path), guard=False)
    try:
        assert p.load_error is None, p.load_error
        p.budget(60)
        r = run_check(load_all()[("08", "my_design")], p.function("my_design"))
        assert r.status == FAILED and r.points == 0 and "dense attention in disguise" in r.message, r
    finally:
        p.close()


# ---- decoding never imports (red team: a codex_lab.* name missing from the learner's view falls
# through to a later path entry, in folders the graded process may own, and got imported) ------

PLANTED = "codex_lab._planted_xyz"


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A ``codex_lab._planted_xyz`` module the checker has not loaded but *could* import (its folder
    on sys.path and on the package's __path__: codex_lab is a regular package, so that is where a
    fall-through finds it); running it creates the marker file this fixture yields."""
    import codex_lab

    pkg = tmp_path / "plant" / "codex_lab"
    pkg.mkdir(parents=True)
    marker = tmp_path / "PLANTED_CODE_RAN"
    (pkg / "_planted_xyz.py").write_text(textwrap.dedent(f'''
        import dataclasses
        import pathlib

        pathlib.Path({str(marker)!r}).write_text("the checker imported the submission's module")


        @dataclasses.dataclass
        class Forged:
            points: int = 99
        '''))
    monkeypatch.syspath_prepend(str(tmp_path / "plant"))
    monkeypatch.setattr(codex_lab, "__path__", [*codex_lab.__path__, str(pkg)])
    importlib.invalidate_caches()
    # the counterfactual: an import of that name would find the planted file (find_spec runs nothing)
    assert PLANTED not in sys.modules and importlib.util.find_spec(PLANTED) is not None
    yield marker
    sys.modules.pop(PLANTED, None)


def test_a_class_named_on_the_wire_is_never_imported(planted, monkeypatch):
    node = {"$": "dc", "cls": f"{PLANTED}:Forged", "v": {"points": 99}}
    with pytest.raises(wire.WireError, match=re.escape(f"{PLANTED}:Forged") + ".*nothing was imported"):
        wire.decode(node, [])
    assert not planted.exists() and PLANTED not in sys.modules
    # even a name on the allow-list is only looked up among loaded modules, never imported
    monkeypatch.setattr(wire, "WIRE_DATACLASSES", wire.WIRE_DATACLASSES | {f"{PLANTED}:Forged"})
    with pytest.raises(wire.WireError, match=re.escape(f"{PLANTED}:Forged") + ".*not loaded"):
        wire.decode(node, [])
    assert not planted.exists() and PLANTED not in sys.modules
    # a loaded module's other classes and its lazy attributes are not reachable either
    for path in ("codex_lab.nn.config:ModelConfig.__init__", "codex_lab.course.outcome:Result", "codex_lab.nn:config"):
        with pytest.raises(wire.WireError, match=re.escape(path)):
            wire.decode({"$": "dc", "cls": path, "v": {}}, [])


def test_an_allowed_class_still_decodes():
    from codex_lab.nn.config import ModelConfig

    assert "codex_lab.nn.config:ModelConfig" in wire.WIRE_DATACLASSES
    cfg = ModelConfig(n_layer=2, n_kv_head=2, moe_layers=[1], attn_patterns=["dense", "window:64"])
    back = wire.decode(*wire.pack(cfg))
    assert type(back) is ModelConfig and back == cfg and back is not cfg
    with pytest.raises(wire.WireError, match="cannot be graded"):  # a dataclass off the list is refused to send
        from codex_lab.course.outcome import Result

        wire.pack(Result("00", "x", "passed", "", 1, 1))


FORGER = '''
import dataclasses

from codex_lab.course import wire


def add(a, b):
    return a + b


def forged():
    real = wire.pack

    def pack(value, handle=None):  # this process's next answer names a class of the planted module
        wire.pack = real
        return {"$": "tuple", "v": [{"$": "dc", "cls": "codex_lab._planted_xyz:Forged", "v": {"points": 99}},
                                    {"$": "list", "v": []}]}, []

    wire.pack = pack
    return 1


def layers(cfg):  # (this file never imports ModelConfig: the server loaded it before the channel opened)
    return type(cfg).__name__, cfg.n_layer


def grown(cfg):
    return dataclasses.replace(cfg, n_layer=cfg.n_layer + 1)
'''


def test_a_submission_naming_an_unloaded_module_fails_that_exercise_alone(planted, tmp_path):
    from codex_lab.course.checks import Exercise
    from codex_lab.course.outcome import ERROR, PASSED, run_check
    from codex_lab.nn.config import ModelConfig

    (tmp_path / "sub.py").write_text(FORGER)
    p = SubmissionProcess("sub.py", [], cwd=str(tmp_path), guard=False)
    try:
        assert p.load_error is None, p.load_error
        p.budget(60)

        def check_forged(fn):
            assert fn() == 1

        def check_add(fn):
            assert fn(2, 3) == 5

        r = run_check(Exercise("99", "forged", check_forged), p.function("forged"))
        assert r.status == ERROR and r.points == 0 and f"{PLANTED}:Forged" in r.message, r
        assert "cannot read" in r.message and "nothing was imported" in r.message, r
        assert not planted.exists() and PLANTED not in sys.modules
        assert run_check(Exercise("99", "add", check_add), p.function("add")).status == PASSED  # the rest is graded
        # the counterfactual: the allowed class crosses both ways
        cfg = ModelConfig(n_layer=3, n_kv_head=2)
        assert p.function("layers")(cfg) == ("ModelConfig", 3)
        back = p.function("grown")(cfg)
        assert type(back) is ModelConfig and back.n_layer == 4 and back.n_kv_head == 2
    finally:
        p.close()


# ---- each exercise's result is its own bounded frame (red team: one 3 MB answer cut the result line
# at the run's 2 MiB output cap, json.loads raised, and every exercise became "not graded") ---------

NONCE = "0123456789abcdef"


def _three_exercises():
    from codex_lab.course.checks import Exercise

    exs = [Exercise("99", name, lambda fn: None, points=2) for name in ("first", "big", "last")]
    return {(e.lesson, e.name, e.visibility): e for e in exs}


def _passed(key):
    from codex_lab.course.outcome import PASSED, Result

    return Result(key[0], key[1], PASSED, "public checks passed", 2, 2, key[2])


def _stdout(by_key, big_frame: bytes) -> str:
    """The checker's output: BEGIN and RESULT for each exercise, ``big_frame`` as the middle one's
    RESULT, and a line the learner's code might print (no nonce) in between."""
    from codex_lab.course.checker import frame, result_frame

    out = b""
    for key in by_key:
        out += frame(NONCE, "BEGIN", list(key)) + b"stray print from somewhere\n"
        out += big_frame if key[1] == "big" else result_frame(NONCE, key, _passed(key))
    return out.decode()


def test_a_3mb_answer_fails_only_its_own_exercise():
    from codex_lab.course.checker import MAX_RESULT_BYTES, frame, result_frame
    from codex_lab.course.grade_runner import MAX_OUTPUT_BYTES, parse_results
    from codex_lab.course.outcome import ERROR, FAILED, PASSED, Result

    by_key = _three_exercises()
    big = ("99", "big", "public")
    huge = "expected 'abc', got " + repr("x" * 3_000_000)  # a check's message quoting the 3 MB answer
    failed = Result("99", "big", FAILED, huge, 1, 2, "public")
    over = f"answer over {MAX_RESULT_BYTES} bytes"

    # the checker bounds its own frame: an error row that says why, and the run goes on
    small = result_frame(NONCE, big, failed)
    assert len(small) < MAX_RESULT_BYTES
    got, current = parse_results(_stdout(by_key, small), NONCE, by_key)
    assert {k[1]: r.status for k, r in got.items()} == {"first": PASSED, "big": ERROR, "last": PASSED}
    assert got[big].message.startswith(over) and got[big].points == 0 and "expected 'abc'" in got[big].message
    assert current is None

    # the parent refuses an oversize frame unread, whoever wrote it: the others are still graded
    raw = frame(NONCE, "RESULT", {"key": list(big), "status": PASSED, "message": huge, "points": 2})
    got, current = parse_results(_stdout(by_key, raw), NONCE, by_key)
    assert {k[1]: r.status for k, r in got.items()} == {"first": PASSED, "big": ERROR, "last": PASSED}
    assert got[big].message.startswith(over) and got[big].points == 0 and current is None

    # the run's output cap cut that frame (and stopped the run): it costs its own exercise, the
    # first is graded, and the last is left for a fresh run (current is None: nothing to charge)
    cut = _stdout(by_key, raw)[:MAX_OUTPUT_BYTES]
    got, current = parse_results(cut, NONCE, by_key)
    assert {k[1]: r.status for k, r in got.items()} == {"first": PASSED, "big": ERROR}
    assert got[big].message.startswith(over) and current is None


@pytest.mark.parametrize("body", [
    b'{"key":["99","big","public"],"status":"passed",',  # bad JSON (its length as declared)
    b'{"key":["99","big","public"],"status":"full marks","message":"","points":2}',  # no such status
    b'{"key":["99","big","public"],"status":"passed","message":"","points":"2"}',  # points not an int
    b'{"key":["99","big","public"],"status":"passed","message":null,"points":2}',  # no message
    b'{"key":["99","nope","public"],"status":"passed","message":"","points":2}',  # no such exercise
    b'["99","big","public"]',  # not an object
    b'NaN',
])
def test_a_malformed_result_frame_fails_only_its_exercise(body):
    from codex_lab.course.grade_runner import parse_results
    from codex_lab.course.outcome import ERROR, PASSED

    by_key = _three_exercises()
    frame = f"{NONCE} RESULT {len(body)} ".encode() + body + b"\n"
    got, current = parse_results(_stdout(by_key, frame), NONCE, by_key)
    assert {k[1]: r.status for k, r in got.items()} == {"first": PASSED, "big": ERROR, "last": PASSED}
    assert "malformed result" in got[("99", "big", "public")].message and current is None


def test_frames_that_lie_about_their_length_or_were_cut():
    from codex_lab.course.grade_runner import parse_results
    from codex_lab.course.outcome import ERROR, PASSED

    by_key = _three_exercises()
    good = b'{"key":["99","big","public"],"status":"passed","message":"","points":2}'
    for header in (f"{NONCE} RESULT {len(good) - 1} ", f"{NONCE} RESULT x{len(good)} ", f"{NONCE} RESULT ²{len(good)} "):
        got, _ = parse_results(_stdout(by_key, header.encode() + good + b"\n"), NONCE, by_key)
        assert got[("99", "big", "public")].status == ERROR, header  # longer than declared, or no length
        assert got[("99", "first", "public")].status == got[("99", "last", "public")].status == PASSED
    # shorter than declared where the output ends: cut where the run stopped; left to the caller,
    # which charges the exercise that began last (current) with the run's reason
    from codex_lab.course.checker import frame, result_frame

    first, big = ("99", "first", "public"), ("99", "big", "public")
    text = (frame(NONCE, "BEGIN", list(first)) + result_frame(NONCE, first, _passed(first)) + frame(NONCE, "BEGIN", list(big))
            + f"{NONCE} RESULT {len(good)} ".encode() + good[:30]).decode()
    got, current = parse_results(text, NONCE, by_key)
    assert set(got) == {("99", "first", "public")} and current == ("99", "big", "public")
    # a line with another nonce (or none) is never read as a result
    forged = f"ffff RESULT {len(good)} {good.decode()}\n"
    got, _ = parse_results(forged + _stdout(by_key, b""), NONCE, by_key)
    assert ("99", "big", "public") not in got


@pytest.mark.slow
def test_a_graded_submission_with_a_3mb_answer_loses_only_that_exercise(tmp_path):
    """The whole sandboxed run: lesson 00's chars_per_token answered right, cut_at_function_end
    returning a 3 MB string (the check quotes it in its message)."""
    from codex_lab.course.checker import MAX_RESULT_BYTES
    from codex_lab.course.grading import grade_file

    root = Path(__file__).resolve().parents[1]
    sub = tmp_path / "00_tour.py"
    sub.write_text((root / "solutions" / "00_tour.py").read_text()
                   + "\n\ndef cut_at_function_end(completion):\n    return 'x' * 3_000_000\n")
    rows = {r.name: r for r in grade_file(sub, timeout_s=60)}
    assert rows["chars_per_token"].status == "passed", rows["chars_per_token"]
    big = rows["cut_at_function_end"]
    assert big.status == "error" and big.points == 0 and f"answer over {MAX_RESULT_BYTES} bytes" in big.message, big
    assert all(r.status == "passed" for name, r in rows.items() if name != "cut_at_function_end"), rows
