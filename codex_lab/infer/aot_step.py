"""The decode step compiled ahead of time (AOTInductor): one package per model and shape, built
once, kept on disk, loaded in milliseconds, and called with no interpreter work inside a step.

Why: a ``torch.compile``'d step still enters Python and dynamo on every token (frame
evaluation, the guard stance, the compiled wrapper's argument handling). gpt-fast's answer on a
GPU is a CUDA graph; on a CPU the answer is AOTInductor: ``torch.export`` captures the step as
one graph, Inductor generates C++ for it (the weights frozen in, the same GEMM template
:class:`~codex_lab.infer.fast_decode.FastDecoder` compiles with), and the package's runner is a
C++ object a Python loop calls once per token.

The step is :class:`~codex_lab.infer.fast_decode.FastDecoder`'s own function, the same lines the
eager and ``torch.compile`` paths run. Its static cache is passed in as inputs, which the graph
updates in place (``index_copy_`` at the step's position), so the decoder's eager prefill and the
package share one cache. Tokens equal the eager step's (tests/test_aot_step.py).

Packages are kept in :func:`~codex_lab.infer.compile_cache.compile_cache_dir` ``/aoti``, keyed by
everything the generated code depends on (:func:`package_key`): the weights' bytes, the model's
configuration, the step's source (:func:`code_digest`), the batch, the cache's slots, the
attention, what the step returns, the Inductor options, the torch build and the math-thread count. A package is only loaded from a folder that
passes :func:`~codex_lab.infer.compile_cache.private_folder` (a planted package would be code this
process runs); otherwise it is built into a private temporary folder and not reused.

A package is built in a new interpreter (a child process; the parent only loads the result), so
what it contains does not depend on what this process compiled before: after one AOT build, a
second in the same process stopped matching Inductor's weight-only int8 pattern (the int8 copy of
the shipped model then failed to build, "no choices" for the C++ GEMM template; in a fresh process
it builds). The child is a new interpreter (``python -c``), not a multiprocessing child, so a
daemonic process (a served engine's) builds this way too. It builds in-process instead where a
child could not rebuild the step: when the decoder's or a module's class is defined in
``__main__`` (a notebook's own class, which a new interpreter cannot import).

:func:`aot_package` is the machinery for any step (the serving engine's paged step uses it too:
:mod:`codex_lab.infer.engine.runner.aot_paged`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

# the step returns greedy next ids (B,), the last position's logits (B, V), or the greedy id after
# every one of its T tokens (B, T): speculative verification
STEP_KINDS = ("next", "logits", "verify")


class _ExportedStep(torch.nn.Module):
    """The decoder's step as a module for ``torch.export``: (tokens (B, T), pos (T,), k_0..k_{n-1},
    v_0..v_{n-1}) -> next ids (B,), logits (B, V) or every position's greedy id (B, T) (``kind``);
    the caches are inputs the graph writes in place."""

    def __init__(self, decoder: Any, kind: str) -> None:
        super().__init__()
        self.decoder, self.kind = decoder, kind
        self.model = decoder.model  # registered: its weights become the graph's (frozen) constants

    def forward(self, tokens: Tensor, pos: Tensor, *caches: Tensor) -> Tensor:
        n = len(caches) // 2
        saved = self.decoder.k, self.decoder.v
        self.decoder.k, self.decoder.v = list(caches[:n]), list(caches[n:])
        try:
            if self.kind == "verify":
                return self.decoder._step(tokens, pos, last_only=False).argmax(-1)  # (B, T)
            logits = self.decoder._step(tokens, pos)  # (B, V)
        finally:
            self.decoder.k, self.decoder.v = saved
        return logits.argmax(-1) if self.kind == "next" else logits


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's and buffer's name, dtype, shape and bytes (the model's identity)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 of the source the exported steps are traced from: every module of ``codex_lab.nn``
    (the layers, attention, int8) and of ``codex_lab.infer`` (the decoder's step, the serving
    engine's paged step). A package built by other code (an older checkout of the course) is
    not loaded: its step may compute something else."""
    root = Path(__file__).resolve().parent.parent  # codex_lab/
    h = hashlib.sha256()
    for f in sorted([*(root / "nn").rglob("*.py"), *(root / "infer").rglob("*.py")]):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def package_key(decoder: Any, kind: str, options: dict[str, Any], tokens: int = 1) -> str:
    """What the generated code depends on, hashed (see the module docstring)."""
    blob = json.dumps({"weights": weights_digest(decoder.model), "config": repr(decoder.model.cfg), "code": code_digest(),
                       "batch": decoder.batch, "slots": decoder.max_len, "attention": decoder.attention, "kind": kind,
                       "tokens": tokens,
                       "options": {k: repr(v) for k, v in sorted(options.items())}, "torch": torch.__version__,
                       "threads": torch.get_num_threads()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def aot_options(options: dict[str, Any]) -> dict[str, Any]:
    """The decoder's Inductor options as AOTInductor takes them: ``cpp_wrapper`` is what AOTI is
    (its wrapper is always C++), so it is left out; freezing and the GEMM template stay."""
    return {k: v for k, v in options.items() if k != "cpp_wrapper"}


class DirectRunner:
    """A loaded package called without the per-call work of its Python wrapper.

    ``torch._inductor.aoti_load_package`` returns a model whose every call reads its input and
    output specs back as JSON, flattens the arguments and unflattens the result (tens of
    microseconds a call, a tenth of a decode step of the shipped model on a CPU). A decode step's
    package takes positional tensors only and returns one tensor, so that work is done once here:
    the specs are read at load, checked against that shape of call (``n`` positional tensors in,
    one tensor out), and each call hands the tensors straight to the loader's ``boxed_run``.
    ``compiled`` is the wrapper itself (the plain path; ``tests/test_aot_step.py`` holds the two equal).
    """

    def __init__(self, compiled: Any) -> None:
        from torch.utils import _pytree as pytree

        self.compiled = compiled
        self._loader = compiled.loader
        in_spec, out_spec = (pytree.treespec_loads(s) for s in self._loader.get_call_spec())
        self.n_inputs = in_spec.num_leaves
        # the spec of a call f(t0, ..., t{n-1}) with no keywords, and of a result that is one tensor
        positional = pytree.tree_flatten((tuple(range(self.n_inputs)), {}))[1]
        if in_spec != positional or out_spec.num_leaves != 1 or out_spec != pytree.tree_flatten(0)[1]:
            raise ValueError(f"the package's call is not n tensors in, one tensor out (inputs {in_spec}, "
                             f"output {out_spec}); call the loaded package itself")

    def __call__(self, *args: Tensor) -> Tensor:
        if len(args) != self.n_inputs:
            raise ValueError(f"the package takes {self.n_inputs} tensors; got {len(args)}")
        return self._loader.boxed_run(list(args))[0]  # boxed: the list is the loader's to consume


def direct_runner(compiled: Any) -> Callable[..., Tensor]:
    """:class:`DirectRunner` of a loaded package, or the package itself where its call has another
    shape (or no loader: another torch)."""
    if getattr(compiled, "loader", None) is None:
        return compiled  # type: ignore[no-any-return]
    try:
        return DirectRunner(compiled)
    except (ValueError, AttributeError, RuntimeError):
        return compiled  # type: ignore[no-any-return]


@dataclass
class AotStep:
    """A loaded package: ``runner(tokens, pos, *k, *v)``. ``seconds``: what getting it cost (the
    build, or the load of a kept package); ``from_disk``: loaded, not built; ``path``: the package;
    ``note``: why it is not kept for the next run ("" when it is)."""

    runner: Callable[..., Tensor]
    seconds: float
    from_disk: bool
    path: Path
    note: str = ""

    def __call__(self, tokens: Tensor, pos: Tensor, k: list[Tensor], v: list[Tensor]) -> Tensor:
        return self.runner(tokens, pos, *k, *v)


def aot_step(decoder: Any, *, kind: str = "next", tokens: int = 1, options: dict[str, Any] | None = None,
             folder: Path | None = None) -> AotStep:
    """The ahead-of-time package of ``decoder``'s decode step (a
    :class:`~codex_lab.infer.fast_decode.FastDecoder` on a CPU): loaded from ``folder`` (default
    :func:`~codex_lab.infer.compile_cache.compile_cache_dir` ``/aoti``) when an earlier run built
    it, else exported, built (tens of seconds on 2 cores) and kept there. ``tokens``: the step's
    token count T (1 for ``next`` and ``logits``; the guesses + 1 for ``verify``)."""
    if kind not in STEP_KINDS:
        raise ValueError(f"kind={kind!r}: choose one of {STEP_KINDS}")
    if tokens < 1 or (kind != "verify" and tokens != 1):
        raise ValueError(f"tokens={tokens}: the {kind!r} step takes 1 token; 'verify' takes 1 or more")
    if next(decoder.model.parameters()).device.type != "cpu":
        raise ValueError("the ahead-of-time step is built for a CPU; on a GPU use compile=True (CUDA graphs)")
    opts = aot_options(options or {})
    spec = _BuildSpec(type(decoder), decoder.model, decoder.max_len, decoder.batch, decoder.attention, kind, tokens,
                      opts, torch.get_num_threads())
    in_process = _defined_in_main(type(decoder), decoder.model)
    return aot_package(package_key(decoder, kind, opts, tokens), spec, folder=folder, in_process=in_process,
                       program=(lambda: spec.program(decoder)) if in_process else None)


def aot_package(key: str, spec: Any, *, folder: Path | None = None, in_process: bool = False,
                program: Callable[[], Any] | None = None) -> AotStep:
    """Load the package ``step-<key>.pt2`` from ``folder`` (default
    :func:`~codex_lab.infer.compile_cache.compile_cache_dir` ``/aoti``), or build it there and load
    it. ``spec``: a picklable object with ``options`` (AOTInductor's), ``threads`` and a method
    ``program()`` returning the ``torch.export``'ed step; it is built in a new interpreter unless
    ``in_process``, where ``program`` (default ``spec.program``) exports it here. The package appears under its name only once complete (an atomic rename)."""
    from codex_lab.infer.compile_cache import compile_cache_dir, private_folder

    t0 = time.perf_counter()
    folder = Path(folder) if folder is not None else compile_cache_dir() / "aoti"
    note = private_folder(folder)
    if note:
        folder = Path(tempfile.mkdtemp(prefix="codex_lab_aoti_"))  # 0700, this process's only
        note += "; building into a private temporary folder instead (not kept for the next run)"
    path = folder / f"step-{key}.pt2"
    if path.is_file():
        return AotStep(direct_runner(torch._inductor.aoti_load_package(str(path))), time.perf_counter() - t0, True, path,
                       note)
    tmp = folder / f".tmp{os.getpid()}-{path.name}"  # AOTInductor wants a name ending in .pt2
    try:
        if in_process:
            _compile((program or spec.program)(), spec.options, str(tmp))
        else:
            _build_in_child(spec, str(tmp))
        os.replace(tmp, path)  # atomic: another process never loads half a package
    finally:
        tmp.unlink(missing_ok=True)
    return AotStep(direct_runner(torch._inductor.aoti_load_package(str(path))), time.perf_counter() - t0, False, path,
                   note)


@dataclass
class _BuildSpec:
    """What a child needs to build a decoder's package: the decoder's class (pickled by name, so
    this module imports no decoder), the model (pickled across), the decoder's shape, the step, the
    Inductor options and the math threads (part of the key)."""

    decoder_cls: type
    model: torch.nn.Module
    max_len: int
    batch: int
    attention: str
    kind: str
    tokens: int
    options: dict[str, Any]
    threads: int

    def program(self, decoder: Any = None) -> Any:
        """The step of ``decoder`` (default: a new eager decoder of this spec) exported."""
        if decoder is None:
            decoder = self.decoder_cls(self.model, max_len=self.max_len, batch=self.batch, compile=False,
                                       attention=self.attention)
        B, T = decoder.batch, self.tokens
        example = (torch.zeros((B, T), dtype=torch.long), torch.arange(T), *decoder.k, *decoder.v)
        with torch.no_grad():
            return torch.export.export(_ExportedStep(decoder, self.kind), example, strict=False)


def _defined_in_main(*objs: Any) -> bool:
    """True when one of these classes, or the class of a module inside one of these modules, lives in
    ``__main__`` (a notebook's own class, which a new interpreter cannot import)."""
    classes = set()
    for o in objs:
        classes |= {type(m) for m in o.modules()} if isinstance(o, torch.nn.Module) else {o}
    return any(c.__module__ == "__main__" for c in classes)


def _build_in_child(spec: Any, out: str) -> None:
    """Build ``spec``'s package into ``out`` in a new interpreter (``python -c``, not
    multiprocessing's spawn, which re-imports the caller's main script: a learner's script without a
    ``__main__`` guard would run again). The spec travels in a file of a private temporary folder; a
    failed build raises here with the child's last lines."""
    with tempfile.TemporaryDirectory(prefix="codex_lab_aoti_spec_") as d:  # 0700
        spec_path = Path(d) / "spec.pt"
        torch.save(spec, spec_path)
        code = ("import sys; from codex_lab.infer.aot_step import _build_from_file; "
                "_build_from_file(sys.argv[1], sys.argv[2])")
        # the child imports codex_lab from where this process did (an uninstalled checkout included)
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run([sys.executable, "-c", code, str(spec_path), out], capture_output=True, text=True,
                              env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
        raise RuntimeError(f"the package build (a child process) failed, exit {proc.returncode}:\n" + "\n".join(tail))


def _build_from_file(spec_path: str, out: str) -> None:
    """The child's side of :func:`_build_in_child`."""
    spec = torch.load(spec_path, weights_only=False)  # written by the parent, in its private folder
    torch.set_num_threads(spec.threads)
    _compile(spec.program(), spec.options, out)


def _compile(program: Any, options: dict[str, Any], out: str) -> None:
    """AOTInductor: the exported ``program`` compiled into the package ``out``."""
    torch._inductor.aoti_compile_and_package(program, package_path=out, inductor_configs=options)


__all__ = ["AotStep", "DirectRunner", "direct_runner", "STEP_KINDS", "aot_options", "aot_package", "aot_step", "package_key", "weights_digest"]
