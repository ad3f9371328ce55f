"""The boundary between the checker and the submission's process (course/wire.py, remote.py,
submission_server.py): values cross as data, in-place changes and gradients come back,
forbidden functions refuse every copy (alias, default argument, clone, reload, exec of the
source, verbatim copy), and a process that hangs or exits costs only its call."""

from __future__ import annotations

import math
import textwrap

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
