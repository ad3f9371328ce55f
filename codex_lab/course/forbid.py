"""Block the package functions that would answer an exercise while its check runs.

``blocked(names, check)`` swaps the code of each named function for a gate: a call made
(directly, or through other package code) from code outside the package and outside the
check's own file -- the learner's -- raises :class:`ForbiddenCall` ("write this one
yourself"); a call from the check itself (its oracle) goes through. Swapping ``__code__``
(not the module attribute) catches every alias: ``from codex_lab.nn.moe import route``,
``codex_lab.route``, a default argument. Functions with closures, classes and builtins fall
back to replacing the module attributes that point at them.

This in-process gate serves the notebook's ``check`` and trusted in-process grading; the
learner's code could tamper with it, like with any in-process Python grader. The grader
(``codex-lab grade``) does not rely on it: there the submission runs in a process of its own
that imports the learner's view of the package (:mod:`codex_lab.course.learner_view`: the
forbidden package functions are stubs there, the real files are not mounted), with the
library built-ins that do an exercise's job (:data:`ATTENTION_BUILTINS`, ...) replaced before
the file loads, and an audit hook as a second line (:mod:`codex_lab.course.submission_server`).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any, Callable, Iterator

_PKG = str(Path(__file__).resolve().parents[1])  # .../codex_lab
_LIBS = tuple(p for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")} if p)


# Library built-ins that do an exercise's whole job: off limits (absent from the submission's
# process, refused in the notebook's self-check) where the exercise is to write those lines.
# Each exercise's text names them. Aliases are listed too: a built-in reachable by another
# name (torch.ops.aten, torch._C._nn, the math kernel that also returns the weights) is the
# same answer. (Modules such as nn.MultiheadAttention or nn.CrossEntropyLoss reach these.)
ATTENTION_BUILTINS = (
    "torch.nn.functional.scaled_dot_product_attention", "torch._C._nn.scaled_dot_product_attention",
    "torch.nn.functional.multi_head_attention_forward",
    "torch._native_multi_head_attention", "torch._scaled_dot_product_attention_math",
    "torch._scaled_dot_product_flash_attention_for_cpu", "torch._scaled_dot_product_flash_attention",
    "torch._scaled_dot_product_efficient_attention", "torch._scaled_dot_product_cudnn_attention",
    "torch.ops.aten.scaled_dot_product_attention", "torch.ops.aten._scaled_dot_product_attention_math",
    "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu", "torch.ops.aten._native_multi_head_attention",
)
LOSS_BUILTINS = (
    "torch.nn.functional.cross_entropy", "torch.nn.functional.nll_loss", "torch._C._nn.cross_entropy_loss", "torch._C._nn.nll_loss", "torch._C._nn.nll_loss_nd",
    "torch._C._nn.nll_loss2d", "torch.ops.aten.cross_entropy_loss", "torch.ops.aten.nll_loss",
    "torch.ops.aten.nll_loss_nd",
)
TOP_P_BUILTINS = ("transformers.generation.logits_process.TopPLogitsWarper",)


class ForbiddenCall(AssertionError):
    """The learner's code called a package function that answers the exercise."""


def message(dotted: str) -> str:
    """The one feedback line for a forbidden call or an imported answer."""
    return f"write this one yourself: {dotted} is the package's answer to this exercise, not your code"


def resolve(dotted: str) -> tuple[Any, str, Any]:
    """(owner module or class, attribute name, object) for a dotted name like ``codex_lab.nn.moe.route``."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:-1]:
            owner = getattr(owner, attr)
        return owner, parts[-1], getattr(owner, parts[-1])
    raise ValueError(f"forbid: cannot import {dotted!r}; name a function as module.path.function")


def _trusted(filename: str, check_file: str) -> bool:
    return filename == check_file or filename.startswith(_PKG) or filename.startswith(_LIBS)


def _gate(dotted: str, target: Callable[..., Any], check_code: types.CodeType) -> Callable[..., Any]:
    def gate(*args: Any, **kwargs: Any) -> Any:
        frame = sys._getframe(2)  # gate <- stub <- caller
        while frame is not None and frame.f_code is not check_code:
            if not _trusted(frame.f_code.co_filename, check_code.co_filename):
                raise ForbiddenCall(message(dotted))
            frame = frame.f_back
        return target(*args, **kwargs)

    return gate


_STUB = "def {name}(*args, **kwargs):\n    return __codex_lab_forbid__[{key!r}](*args, **kwargs)\n"


@contextlib.contextmanager
def blocked(names: tuple[str, ...] | list[str], check: Callable[..., Any]) -> Iterator[None]:
    """While inside, calls of ``names`` from outside the package and ``check``'s file raise ForbiddenCall."""
    check_code = getattr(check, "__code__", None)
    if not names or check_code is None:
        yield
        return
    undo: list[Callable[[], None]] = []
    try:
        for dotted in names:
            try:
                owner, attr, obj = resolve(dotted)
            except (ValueError, ImportError, AttributeError):
                if dotted.startswith("codex_lab."):
                    raise
                continue  # a library built-in of a library (or version) that is not installed: nothing to block
            if isinstance(obj, types.FunctionType) and not obj.__code__.co_freevars:
                clone = types.FunctionType(obj.__code__, obj.__globals__, obj.__name__, obj.__defaults__, obj.__closure__)
                clone.__kwdefaults__ = obj.__kwdefaults__
                table = obj.__globals__.setdefault("__codex_lab_forbid__", {})
                table[dotted] = _gate(dotted, clone, check_code)
                ns: dict[str, Any] = {}
                exec(compile(_STUB.format(name=obj.__name__, key=dotted), obj.__code__.co_filename, "exec"), ns)
                old_code = obj.__code__
                obj.__code__ = ns[obj.__name__].__code__
                undo.append(lambda o=obj, c=old_code, t=table, k=dotted: (setattr(o, "__code__", c), t.pop(k, None)))
            else:  # closures, classes, builtins: every module attribute that is this object
                gate = _gate(dotted, obj, check_code)
                for mod in list(sys.modules.values()):
                    d = getattr(mod, "__dict__", None)
                    if not isinstance(d, dict):
                        continue
                    for k, v in list(d.items()):
                        if v is obj:
                            d[k] = gate
                            undo.append(lambda d=d, k=k, v=v: d.__setitem__(k, v))
                if getattr(owner, attr, None) is obj:
                    setattr(owner, attr, gate)
                    undo.append(lambda o=owner, a=attr, v=obj: setattr(o, a, v))
        yield
    finally:
        for fn in reversed(undo):
            fn()


def package_origin(fn: Any) -> str | None:
    """The dotted name of ``fn`` when it is the package's own code (imported, not written), else None.

    Looks through ``functools.partial``, bound methods and ``__wrapped__`` (decorators)."""
    import functools

    for _ in range(16):
        inner = (fn.func if isinstance(fn, functools.partial) else getattr(fn, "__func__", None)
                 or getattr(fn, "__wrapped__", None))
        if inner is None or inner is fn:
            break
        origin = package_origin_one(fn)
        if origin is not None:
            return origin
        fn = inner
    return package_origin_one(fn)


def package_origin_one(fn: Any) -> str | None:
    """:func:`package_origin` for ``fn`` itself, without unwrapping."""
    mod = getattr(fn, "__module__", None) or ""
    code = getattr(fn, "__code__", None)
    in_pkg = code is not None and code.co_filename.startswith(_PKG)
    if mod == "codex_lab" or mod.startswith("codex_lab.") or in_pkg:
        return f"{mod}.{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}"
    return None
