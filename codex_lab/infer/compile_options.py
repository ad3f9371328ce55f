"""How the decode steps are compiled: the graphs each compiled function built (a counting
backend), the Inductor options of a CPU decode step (frozen weights, the C++ GEMM template, a C++
wrapper) and the fallback without the template, and the context a first compile runs in.
:class:`~codex_lab.infer.fast_decode.FastDecoder` and the serving engine's compiled steps
(:mod:`codex_lab.infer.engine.runner.compiled`) share them.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

import torch


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process (its ``unique_graphs`` counter). Process-wide:
    another thread's compile moves it; a step's own count is :class:`CountingBackend`."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - no dynamo
        return 0
    return int(counters["stats"]["unique_graphs"])


class CountingBackend:
    """A ``torch.compile`` backend that counts the graphs it compiles, then hands each to the
    backend it wraps (Inductor with ``mode``/``options``, or any named backend).

    Dynamo calls the backend once per graph it compiles for the function compiled with it, in
    the compiling thread, so :attr:`graphs` is that function's own count: a compile elsewhere
    in the process (another test's engine, a background thread) never moves it, as it moves
    :func:`graphs_compiled`.
    """

    def __init__(self, backend: str = "inductor", mode: str | None = None, options: dict | None = None,
                 dynamic: bool | None = None) -> None:
        if backend == "inductor":
            self.inner = torch._TorchCompileInductorWrapper(mode, options, dynamic)
        else:
            self.inner = torch._TorchCompileWrapper(backend, mode, options, dynamic)
        self.graphs = 0
        self._lock = threading.Lock()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        with self._lock:
            self.graphs += 1
        return self.inner(gm, example_inputs)

    def __getattr__(self, name: str) -> object:  # get_compiler_config, reset, ...: the wrapped backend's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def counted_compile(fn: Callable, *, dynamic: bool | None, backend: str = "inductor", mode: str | None = None,
                    options: dict | None = None) -> tuple[Callable, CountingBackend]:
    """``torch.compile(fn, ...)`` through a :class:`CountingBackend`: (the compiled function, its counter)."""
    counter = CountingBackend(backend, mode, options, dynamic)
    return torch.compile(fn, dynamic=dynamic, backend=counter), counter


# dynamo's graph limit per function while a planned graph is first built (its default, 8, counts
# every graph of the function's code: all FastDecoders share one, all engine steps another)
GRAPH_LIMIT = 100_000


def first_compile(options: dict | None) -> contextlib.AbstractContextManager:
    """The context of a fixed-shape step's planned first (compiling) call.

    - ``freezing`` on while dynamo traces, if ``options`` ask for it: dynamo turns the weights
      into graph constants only if the global flag is set then (``options`` reach Inductor only
      after the trace), and the C++ GEMM template needs constant weights.
    - Dynamo's graph limit lifted: past 8 graphs of one function's code it runs the frame
      eagerly without a word. Measured 2026-12-02: the 9th and 10th ``FastDecoder`` of one
      process compiled no graph and still said ``compiled``; a second engine of another shape
      compiled 1 of its 7 buckets.
    """
    import torch._inductor.config as inductor_config

    stack = contextlib.ExitStack()
    stack.enter_context(inductor_config.patch(freezing=bool((options or {}).get("freezing"))))
    stack.enter_context(torch._dynamo.config.patch(recompile_limit=GRAPH_LIMIT, accumulated_recompile_limit=GRAPH_LIMIT))
    return stack


def cpu_compile_options(options: dict | None, backend: str, mode: str | None, device: torch.device) -> dict | None:
    """Inductor options of a fixed-shape decode step: ``options`` if given; on a CPU with the
    inductor backend and no mode, ``cpp_wrapper`` (the code calling the kernels is C++). The
    engine's step (``infer/engine/runner/compiled.py``) uses these: its weights stay graph inputs, read by
    ATen's matmuls. :func:`decode_compile_options` adds frozen weights and the C++ GEMM template."""
    if options is None and backend == "inductor" and mode is None and device.type == "cpu":
        return {"cpp_wrapper": True}
    return options


def decode_compile_options(options: dict | None, backend: str, mode: str | None, device: torch.device) -> dict | None:
    """Inductor options of :class:`FastDecoder`'s batch-1 step: ``options`` if given; on a CPU
    (inductor, no mode) :func:`cpu_compile_options` plus ``freezing`` (the weights become graph
    constants; the compiling call must also turn the *global* flag on while dynamo traces, see
    :meth:`FastDecoder._traced`) and Inductor's own C++ GEMM template (``max_autotune`` with the
    ``CPP`` GEMM backend). The template packs each frozen weight once into blocks for the CPU's
    vector width and splits every matrix-vector product across the cores; ATen's ``mm`` of one
    row runs on one core over the unpacked weight. That took a 4.2M-parameter model's decode
    step from ~1 ms to ~0.4 ms on a 2-core AMD EPYC (2026-12-02; the runs: ``git log -p -- docs/PROFILE.md``): the step
    is bound by reading 17 MB of weights, which the packed, two-core kernels read faster."""
    base = cpu_compile_options(options, backend, mode, device)
    if options is None and base is not None:
        return {**base, "freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP",
                "autotune_fallback_to_aten": True}
    return base


def without_gemm_template(options: dict) -> dict:
    """``options`` less Inductor's autotuning (the C++ GEMM template): ATen's matmuls. What a
    compiled step retries with where the template cannot serve (a CPU or dtype it lacks)."""
    return {k: v for k, v in options.items() if not k.startswith(("max_autotune", "autotune"))}


__all__ = ["CountingBackend", "counted_compile", "cpu_compile_options", "decode_compile_options", "first_compile",
           "graphs_compiled", "without_gemm_template"]
