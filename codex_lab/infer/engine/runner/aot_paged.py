"""The engine's paged decode step compiled ahead of time: one AOTInductor package per row count,
symbolic in the block table's length, kept on disk so a restarted server loads it in milliseconds.

Why: the served step compiles with its weights frozen into the graph (Inductor's C++ GEMM
template, FastDecoder's options), and Inductor's cache keeps no frozen graph, so a server compiled
its three graphs (the batch, the batch with arriving prompts, a request alone) again at every
start: about 70 s "warming" on 2 cores before the compiled step served. ``torch.export`` captures
the same step (:func:`~codex_lab.infer.generate.decode_step` over the pool's views: the lines the
eager engine runs) once per row count with the table's block dimension a ``Dim``, AOTInductor
compiles it, and :func:`~codex_lab.infer.aot_step.aot_package` keeps it keyed by everything the
code depends on (:func:`paged_package_key`). The pool's key and value tensors are inputs the
package writes in place (each row's new key and value at its slot), so the package and the eager
step share one pool.

A package is built in a new interpreter (the parent only loads it; see
:mod:`codex_lab.infer.aot_step`), which also keeps a cold start's compile off the serving process's
interpreter lock.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from codex_lab.infer.aot_step import AotStep, _defined_in_main, aot_options, aot_package, code_digest, weights_digest
from codex_lab.infer.generate import decode_step
from codex_lab.nn.kv_cache import PagedKVPool

# the shortest table of a graph symbolic in its length (a package, or a torch.compile graph with
# dynamic_blocks), in blocks: export and dynamo specialise a dimension of length 1
MIN_BLOCKS = 2


class _ExportedPagedStep(torch.nn.Module):
    """The paged step as a module for ``torch.export``: (tokens (R, 1), positions (R, 1), tables
    (R, NB), k_0..k_{L-1}, v_0..v_{L-1}) -> logits (R, V); each layer's pool tensors
    (N, block_size, H_kv, D) are inputs the graph writes in place."""

    def __init__(self, model: torch.nn.Module, pool: PagedKVPool, one_query: bool) -> None:
        super().__init__()
        self.model = model  # registered: its weights become the graph's (frozen) constants
        self.pool, self.one_query = pool, one_query

    def forward(self, tokens: Tensor, positions: Tensor, tables: Tensor, *kv: Tensor) -> Tensor:
        n = len(kv) // 2
        saved = self.pool.k, self.pool.v
        self.pool.k, self.pool.v = list(kv[:n]), list(kv[n:])
        try:
            return decode_step(self.model, tokens, positions, self.pool.views(tables, one_query=self.one_query))
        finally:
            self.pool.k, self.pool.v = saved


@dataclass
class PagedSpec:
    """What a child needs to build the package of one row count: the model (pickled across), the
    pool's geometry, the rows, the table lengths the package takes (``min_blocks`` to
    ``max_blocks``), the attention form, AOTInductor's options and the math threads."""

    model: torch.nn.Module
    n_layer: int
    n_kv_head: int
    head_dim: int
    n_blocks: int
    block_size: int
    dtype: torch.dtype
    rows: int
    min_blocks: int
    max_blocks: int
    one_query: bool
    options: dict[str, Any]
    threads: int

    def program(self) -> Any:
        """The step exported, its table's block dimension symbolic (``min_blocks`` to ``max_blocks``)."""
        pool = PagedKVPool(self.n_layer, self.n_kv_head, self.head_dim, self.n_blocks, self.block_size,
                           dtype=self.dtype)
        R = self.rows
        zeros = torch.zeros((R, 1), dtype=torch.long)  # (R, 1)
        example = (zeros, zeros.clone(), torch.zeros((R, self.min_blocks), dtype=torch.long), *pool.k, *pool.v)
        blocks = torch.export.Dim("blocks", min=self.min_blocks, max=self.max_blocks)
        shapes = (None, None, {1: blocks}, (None,) * (2 * self.n_layer))
        with torch.no_grad():
            return torch.export.export(_ExportedPagedStep(self.model, pool, self.one_query), example,
                                       dynamic_shapes=shapes, strict=False)


def paged_package_key(spec: PagedSpec) -> str:
    """sha256 of what the generated code depends on: the weights' bytes, the model's configuration,
    the step's source (:func:`~codex_lab.infer.aot_step.code_digest`), the pool's geometry and dtype, the rows, the table lengths, the attention form, the options, the
    torch build and the math threads."""
    cfg = getattr(spec.model, "cfg", None)
    blob = json.dumps({"weights": weights_digest(spec.model), "config": repr(cfg), "step": "paged", "code": code_digest(),
                       "pool": [spec.n_layer, spec.n_kv_head, spec.head_dim, spec.n_blocks, spec.block_size,
                                str(spec.dtype)],
                       "rows": spec.rows, "blocks": [spec.min_blocks, spec.max_blocks], "one_query": spec.one_query,
                       "options": {k: repr(v) for k, v in sorted(spec.options.items())}, "torch": torch.__version__,
                       "threads": spec.threads}, sort_keys=True)
    return "paged-" + hashlib.sha256(blob.encode()).hexdigest()[:24]


def paged_aot_step(model: torch.nn.Module, pool: PagedKVPool, rows: int, *, min_blocks: int, max_blocks: int,
                   one_query: bool, options: dict[str, Any], folder: Path | None = None) -> AotStep:
    """The package of the paged step for ``rows`` rows over tables of ``min_blocks`` to
    ``max_blocks`` blocks: loaded from the compile cache (``folder``, default
    :func:`~codex_lab.infer.compile_cache.compile_cache_dir` ``/aoti``) when an earlier run built
    it, else built (in a child interpreter; tens of seconds on 2 cores) and kept there. Call the
    result's ``runner(tokens (R, 1), positions (R, 1), tables (R, NB), *pool.k, *pool.v)`` -> (R, V)."""
    if pool.k[0].device.type != "cpu":
        raise ValueError("the ahead-of-time paged step is built for a CPU")
    if not 1 <= min_blocks < max_blocks:
        raise ValueError(f"tables of {min_blocks} to {max_blocks} blocks: need 1 <= min_blocks < max_blocks")
    _, bs, h_kv, d = pool.k[0].shape
    spec = PagedSpec(model, pool.n_layer, h_kv, d, pool.n_blocks, bs, pool.k[0].dtype, rows, min_blocks, max_blocks,
                     one_query, aot_options(options), torch.get_num_threads())
    return aot_package(paged_package_key(spec), spec, folder=folder, in_process=_defined_in_main(model))


def package_for_step(step: Any, rows: int, options: dict[str, Any]) -> AotStep:
    """The package of a :class:`~codex_lab.infer.engine.runner.compiled.CompiledPagedStep`'s
    frozen-weight graph of ``rows`` rows: tables of 2 blocks (dynamo and export specialise a length
    of 1) up to that shape's longest compiled table (the one-row graph: the model's longest)."""
    limit = step.max_blocks if rows == 1 and step.solo else \
        step.max_mixed_blocks if rows == step.mixed_rows else step.max_compiled_blocks
    return paged_aot_step(step.model, step.pool, rows, min_blocks=MIN_BLOCKS, max_blocks=max(limit, MIN_BLOCKS + 1),
                          one_query=step.one_query, options=options)


__all__ = ["PagedSpec", "package_for_step", "paged_aot_step", "paged_package_key"]
