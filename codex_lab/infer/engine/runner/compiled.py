"""The engine's fast decode step: gpt-fast's fixed-shape compiled step, over paged KV memory.

The continuous-batching engine decodes a batch whose size and block tables change every
step (requests join and leave, sequences grow a block at a time). Compiled as it is, that
step would see a new shape almost every step and recompile (``dynamic=True`` instead builds
graphs with symbolic shapes: minutes to compile on a CPU, and slower per step). So, as
CUDA-graph servers do, the step is given FIXED shapes:

- the batch is padded to ``max_batch_size`` rows; a padding row decodes token 0 at position
  0 and writes its key/value into a scratch block that no request owns, so it never touches
  a request's memory (its logits are dropped);
- block tables are padded to a *bucket* of blocks: the smallest of the smallest bucket
  (``min_bucket_tokens`` worth) times 1, 1.5, 2, 3, 4, 6, ... that holds the longest table
  (a row's own first block fills the padding; those slots lie past the row's position, so
  the attention mask hides them). Every slot costs a gather and a dot product, so buckets
  are 1.5x apart, not 2x: fewer wasted slots for a few more graphs.

One graph per bucket is compiled (``dynamic=False``; 7 buckets for 1024 tokens in blocks
of 16 from 128 tokens) and replayed for every later step that falls in it;
:attr:`CompiledPagedStep.recompiles` counts graphs beyond one per bucket (0 expected).
The step is :func:`~codex_lab.infer.generate.decode_step` itself, so its tokens equal the
eager engine's. If compiling fails (no C++ compiler, an op Inductor lacks), the same
function runs eagerly and :attr:`CompiledPagedStep.compile_error` says why.

With frozen weights (``freezing``: the options of FastDecoder's C++ GEMM template, what
``codex-lab serve`` compiles) Inductor caches no graph, so buckets would recompile at every
start: there each shape is instead ONE graph symbolic in the table's length
(``dynamic_blocks``; the table's block dimension marked dynamic at its first call, tables of
2 blocks at least as dynamo specialises a length of 1), called with dynamo's guards skipped.
A request decoding alone (``solo``) always runs such a one-row graph with those options.
With ``aot``, each of those graphs is instead an AOTInductor package
(:mod:`codex_lab.infer.engine.runner.aot_paged`: the same step exported, the table's length a
``Dim``), built once in a child interpreter and kept in the compile cache, so a restart loads
the three graphs in milliseconds instead of compiling them again (what ``codex-lab serve`` does).

A step can also carry the new prompts' tokens (``mixed_rows``): each prompt token is one more
row, at its own position over its request's table. Every layer writes all rows' keys and
values before any row attends, and a row sees only slots at or before its position, so a
prompt token attends exactly to its prefix, as in a prefill forward. Those steps run a
second compiled shape of ``mixed_rows`` rows (for buckets up to ``mixed_max_tokens``), so a
step that admits requests is one graph call instead of an eager prefill of ~340 ops, each
of which waits for the interpreter lock while the server streams.

A server need not wait for the compiler: :meth:`CompiledPagedStep.warmup_background`
compiles every bucket in a thread of its own while every step runs the same padded step
eagerly (identical tokens), and switches all steps to the graphs at once when the last
bucket is compiled (so the serving thread never runs a graph while dynamo is still adding
to its cache). ``codex-lab serve`` answers within seconds of loading the model this way.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from codex_lab.infer.compile_options import (counted_compile, cpu_compile_options, decode_compile_options, first_compile,
                                             without_gemm_template)
from codex_lab.infer.fast_decode import FastDecoder
from codex_lab.infer.generate import decode_step
from codex_lab.infer.engine.runner.aot_paged import MIN_BLOCKS, package_for_step
from codex_lab.infer.engine.runner.background import compile_in_background
from codex_lab.infer.engine.runner.options import bucket_sizes
from codex_lab.nn.kv_cache import PagedKVPool
from codex_lab.nn.model import CodexModel



class CompiledPagedStep:
    """A decode step of fixed shape (``max_batch_size`` rows, a bucket of blocks), compiled once per bucket.

    Args:
        model: the engine's model (eval mode).
        pool: the engine's KV pool; one of its blocks is taken here as the padding rows' scratch
            block (the engine sizes the pool one block larger for it).
        max_batch_size: rows of every compiled step.
        min_bucket_tokens: the smallest bucket, in tokens (rounded up to whole blocks).
        max_bucket_tokens: the largest compiled bucket, in tokens; a step whose longest table
            is longer runs the same padded step eagerly (a model of 32k positions would
            otherwise compile ~16 buckets before serving). Default 2048; None: up to ``max_seq_len``.
        backend, mode, options: ``torch.compile``'s; ``options`` defaults on a CPU (inductor,
            no mode) to ``{"cpp_wrapper": True}``: the weights stay graph inputs, read by
            ATen's matmuls (:meth:`use_options` freezes them and adds the C++ GEMM template).
        compile: False runs the padded step eagerly (the reference the tests hold it to).
        mixed_rows: rows of the second compiled shape, for steps that also carry prompt tokens
            as rows (0: none; the engine then prefills eagerly). Must exceed ``max_batch_size``.
        mixed_max_tokens: the largest bucket, in tokens, compiled in that shape (longer tables
            prefill eagerly).
        solo: also compile a one-row step, run when a single request decodes alone (a lone
            stream then computes one row, not ``max_batch_size``: 2.7x its tokens/s with 8
            slots on the shipped model, 2026-12-03: ``git log -p -- docs/PROFILE.md``). It is ONE graph, symbolic in the
            table's length (a lone row's attention over a few more slots costs little; its
            weights' reads are what cost), built after the others, with ``solo_options``.
        solo_options: Inductor options of the one-row graph. Default on a CPU (inductor, no
            mode): :func:`~codex_lab.infer.compile_options.decode_compile_options`, FastDecoder's
            frozen weights and C++ GEMM template: a one-row step is a matrix-vector product per
            weight, which ATen runs on one core over the unpacked weight (2.0 ms against 0.6 ms
            per step on the shipped model, 1 thread, 2026-12-03). Frozen weights are read when
            the graph compiles: build a new engine after changing the model's weights.
        aot: every frozen-weight graph (``dynamic_blocks`` shapes and the one-row graph) is an
            ahead-of-time package loaded from the compile cache, or built there in a child
            interpreter (:func:`~codex_lab.infer.engine.runner.aot_paged.paged_aot_step`); a
            package that cannot be built falls back to ``torch.compile`` (``compile_error`` says
            why). CPU only; ignored elsewhere.
    """

    def __init__(self, model: CodexModel, pool: PagedKVPool, max_batch_size: int, *, min_bucket_tokens: int = 128,
                 max_bucket_tokens: int | None = 2048, backend: str = "inductor", mode: str | None = None,
                 options: dict | None = None, compile: bool = True, mixed_rows: int = 0,
                 mixed_max_tokens: int = 256, solo: bool = False, solo_options: dict | None = None,
                 aot: bool = False) -> None:
        if mixed_rows and mixed_rows <= max_batch_size:
            raise ValueError(f"mixed_rows={mixed_rows} must exceed max_batch_size={max_batch_size} (or be 0: none)")
        self.model, self.pool, self.max_batch_size, self.mixed_rows = model, pool, max_batch_size, mixed_rows
        self.device = pool.k[0].device
        self._solo_table: tuple[list[int], Tensor] | None = None  # a lone request's table: (ids, (1, NB) tensor)
        # every row of a step is one token: on a CPU its attention is the one-query formula in plain
        # ops Inductor fuses (FastDecoder's choice there), SDPA elsewhere; equal outputs either way
        self.one_query = self.device.type == "cpu"
        self.scratch = pool.allocate(1)[0]  # padding rows write only here
        self.max_blocks = pool.blocks_for(model.cfg.max_seq_len)
        # with one slot the decode shape is already one row; a one-block model has no length to vary
        self.solo = solo and max_batch_size > 1 and self.max_blocks > 1
        self.min_blocks = min(self.max_blocks, pool.blocks_for(min_bucket_tokens))
        self.dynamic_blocks = False  # set below from the options
        self.buckets = bucket_sizes(self.min_blocks, self.max_blocks)
        # tables longer than this many blocks run eagerly
        self.max_compiled_blocks = self.max_blocks if max_bucket_tokens is None else \
            max(self.min_blocks, min(self.max_blocks, pool.blocks_for(max_bucket_tokens)))
        # tables longer than this many blocks never run in the mixed shape
        self.max_mixed_blocks = min(self.max_compiled_blocks, self.bucket(pool.blocks_for(mixed_max_tokens)))
        options = cpu_compile_options(options, backend, mode, self.device)
        self.options = options or {}
        # frozen weights (the C++ GEMM template): Inductor caches no frozen graph, so each shape is
        # ONE graph symbolic in the table's length (compiled once per start) instead of one per bucket
        self.dynamic_blocks = bool(self.options.get("freezing"))
        self.compile_error = ""
        self.compile_s: dict[int, float] = {}  # bucket (blocks) -> seconds its first call took
        self.mixed_compile_s: dict[int, float] = {}  # the same for the mixed_rows shape
        # {solo_blocks: seconds} once the one-row graph compiled (one graph for every length)
        self.solo_compile_s: dict[int, float] = {}
        self.solo_blocks = max(self.min_blocks, MIN_BLOCKS)  # the length warmup() traces it with
        self._counters: list = []  # one CountingBackend per compiled function of this step (its own graphs)
        self._graphs_at_start: int | None = None  # this step's graph count before the first bucket compiled
        self._bucket_graphs = 0  # graphs compiled by the buckets' first calls
        self._fn = None
        self._solo_fn = None  # the one-row graph's compiled function (``solo``)
        self.solo_options: dict = {}
        # graphs symbolic in the table's length (the one-row graph, and every shape with
        # ``dynamic_blocks``) skip dynamo's guards once compiled, as FastDecoder does; False: evaluate them
        self.skip_guards = True
        # ahead-of-time packages of the frozen-weight shapes: rows -> loaded package (``aot``)
        self.aot = aot and self.device.type == "cpu"
        self.packages: dict[int, Any] = {}  # public: what a server reports
        self._background = False  # True while warmup_background compiles: every step runs eagerly
        self.ready = threading.Event()  # set when the compiled graphs serve (or compiling gave up)
        sparse_flex = model.cfg.attn_impl == "flex" and any(not layer.attn.pattern.is_dense for layer in model.layers)
        if compile and sparse_flex:
            # FlexAttention compiles its own kernel for every new block mask (every decode
            # position): inside this step that recompiles each token, so it runs eagerly
            self.compile_error = "attn_impl='flex' builds a block mask per position and recompiles; the step runs eagerly"
        elif compile:
            try:
                self._fn = self._counted(self._step, dynamic=None if self.dynamic_blocks else False, backend=backend,
                                         mode=mode, options=options)
                if self.solo:
                    self.solo_options = decode_compile_options(solo_options, backend, mode, self.device) or {}
                    # dynamic=None: the table's length is marked dynamic at the first call (one graph)
                    self._solo_fn = self._counted(self._solo_step, dynamic=None, backend=backend, mode=mode,
                                                  options=self.solo_options or None)
            except Exception as exc:  # pragma: no cover - torch without dynamo
                self.compile_error = f"{type(exc).__name__}: {exc}"[:200]

    def use_options(self, options: dict) -> None:
        """Compile with these Inductor ``options`` instead (before any bucket has compiled),
        e.g. :func:`~codex_lab.infer.compile_options.decode_compile_options`'s frozen weights and
        C++ GEMM template (``serve.compiled.compiled_engine(gemm_template=True)``). With
        ``freezing``, each shape's first call turns it on while dynamo traces (else the
        weights stay graph inputs), and each shape is one graph symbolic in the table's length
        (``dynamic_blocks``)."""
        if self.compile_s or self._fn is None:
            raise RuntimeError("use_options() needs a compiled step none of whose buckets has compiled yet")
        self.options = dict(options)
        self.dynamic_blocks = bool(self.options.get("freezing"))
        self._fn = self._counted(self._step, dynamic=None if self.dynamic_blocks else False, options=self.options)

    @property
    def aot_from_disk(self) -> dict[int, bool]:
        """Rows -> True when that shape's ahead-of-time package was loaded from the cache, not built."""
        return {rows: p.from_disk for rows, p in self.packages.items()}

    @property
    def compiled(self) -> bool:
        """True while steps run the compiled graphs."""
        return self._fn is not None

    @property
    def serving_graphs(self) -> bool:
        """True when a step runs a compiled graph (not while the background compile goes on)."""
        return self._fn is not None and (not self._background or self.ready.is_set())

    def can_mix(self, n_rows: int, n_blocks: int) -> bool:
        """Whether a step of ``n_rows`` rows (decode rows plus prompt tokens) whose longest
        table has ``n_blocks`` blocks runs as one compiled graph (of either shape)."""
        if 0 < n_rows <= self.max_batch_size:  # the decode shape holds them
            limit = self.max_compiled_blocks
        elif n_rows <= self.mixed_rows:
            limit = self.max_mixed_blocks
        else:
            return False
        return self.serving_graphs and self.bucket(n_blocks) <= limit

    def _counted(self, fn: Callable, *, dynamic: bool | None, **kw: object) -> Callable:
        """``torch.compile`` of one of this step's functions (``kw``: backend, mode, options), its graphs counted here."""
        compiled, counter = counted_compile(fn, dynamic=dynamic, **kw)  # type: ignore[arg-type]
        self._counters.append(counter)
        return compiled

    @property
    def graphs(self) -> int:
        """Graphs this step's functions compiled (its own count: no other compile in the process moves it)."""
        return sum(c.graphs for c in self._counters)

    @property
    def recompiles(self) -> int:
        """Graphs compiled beyond those of each bucket's first call (0: each bucket compiled once,
        then reused)."""
        if self._graphs_at_start is None:
            return 0
        # recompiles = graphs compiled since the first bucket began - those the first calls made
        return self.graphs - self._graphs_at_start - self._bucket_graphs

    def bucket(self, n_blocks: int) -> int:
        """Blocks of the compiled shape that holds a table of ``n_blocks``: the smallest of
        ``min_blocks * {1, 1.5, 2, 3, 4, 6, ...}`` (powers of two and 1.5x them) that holds it,
        clamped to ``max_seq_len``; a row reads at most 1.5x the slots it needs, past the smallest.
        With ``dynamic_blocks`` (one graph for every length): the table's own length, 2 at least."""
        if self.dynamic_blocks:
            return max(MIN_BLOCKS, min(n_blocks, self.max_blocks))
        return next(nb for nb in self.buckets if nb >= min(n_blocks, self.max_blocks))

    @torch.no_grad()
    def _step(self, tokens: Tensor, positions: Tensor, tables: Tensor) -> Tensor:
        """tokens (Bmax, 1) at positions (Bmax, 1) over block tables (Bmax, NB) -> logits (Bmax, V)."""
        return decode_step(self.model, tokens, positions, self.pool.views(tables, one_query=self.one_query))  # (Bmax, V)

    @torch.no_grad()
    def _solo_step(self, tokens: Tensor, positions: Tensor, tables: Tensor) -> Tensor:
        """The same step for one row: tokens (1, 1) at positions (1, 1) over a table (1, NB) -> (1, V).
        A code object of its own, so its one graph has a dynamo cache of its own."""
        return decode_step(self.model, tokens, positions, self.pool.views(tables, one_query=self.one_query))  # (1, V)

    @torch.no_grad()
    def __call__(self, tokens: Sequence[int], positions: Sequence[int], tables: Sequence[Sequence[int]]) -> Tensor:
        """One decode step for ``len(tokens)`` rows: each row's last token, its position and its
        block table (which must cover the position). Returns logits (B, V) of the real rows."""
        B = len(tokens)
        if not 1 <= B <= max(self.max_batch_size, self.mixed_rows):
            raise ValueError(f"{B} rows for a step of max_batch_size={self.max_batch_size}, mixed_rows={self.mixed_rows}")
        if B == 1 and self.solo and self.serving_graphs and self._solo_fn is not None:
            # one graph symbolic in the table's length: the table as it is (2 blocks at least, as
            # dynamo specialises a length of 1), no bucket
            t = list(tables[0])
            t += t[:1] * (MIN_BLOCKS - len(t))
            # the table tensor changes only when the request gains a block (every block_size tokens): kept
            # with the list it was made from, and made again when they differ
            if self._solo_table is None or self._solo_table[0] != t:
                self._solo_table = (t, torch.tensor([t], device=self.device))  # (1, NB)
            idx = torch.tensor([[tokens[0]]], device=self.device)  # (1, 1)
            pos = torch.tensor([[positions[0]]], device=self.device)  # (1, 1)
            return self._solo(idx, pos, self._solo_table[1])
        nb = self.bucket(max(len(t) for t in tables))
        rows_shape = (1 if B == 1 and self.solo else self.max_batch_size) if B <= self.max_batch_size else self.mixed_rows
        pad = rows_shape - B
        # real rows: own table padded with its first block; padding rows: the scratch block only
        rows = [list(t) + [t[0]] * (nb - len(t)) for t in tables] + [[self.scratch] * nb] * pad
        idx = torch.tensor([[t] for t in tokens] + [[0]] * pad, device=self.device)  # (Bmax, 1)
        pos = torch.tensor([[p] for p in positions] + [[0]] * pad, device=self.device)  # (Bmax, 1)
        tab = torch.tensor(rows, device=self.device)  # (Bmax, NB)
        too_long = nb > (self.max_mixed_blocks if rows_shape == self.mixed_rows else self.max_compiled_blocks)
        if too_long or not self.serving_graphs:
            # (B, V) eager: no compiler, past the compiled buckets, or the graphs still compiling in the background
            return self._step(idx, pos, tab)[:B]
        return self._compiled(idx, pos, tab, nb)[:B]

    def _compiled(self, idx: Tensor, pos: Tensor, tab: Tensor, nb: int) -> Tensor:
        """The padded step through its bucket's graph, compiling it on its first call; (R, V)."""
        done = self._done(idx.shape[0])
        if self._has(idx.shape[0], nb):
            package = self.packages.get(idx.shape[0])
            if package is not None:  # (R, V) ahead of time: no dynamo, no interpreter inside the step
                return package.runner(idx, pos, tab, *self.pool.k, *self.pool.v)
            if self.dynamic_blocks and self.skip_guards:  # the shapes' graphs differ only in their rows
                return FastDecoder._unguarded(self._fn, idx, pos, tab)
            return self._fn(idx, pos, tab)  # (R, V) a graph compiled before
        t0 = time.perf_counter()
        before = self.graphs
        if self._graphs_at_start is None:
            self._graphs_at_start = before
        if self.dynamic_blocks and self._aot_package(idx.shape[0], self.options):
            done[nb] = time.perf_counter() - t0
            return self.packages[idx.shape[0]].runner(idx, pos, tab, *self.pool.k, *self.pool.v)  # (R, V)
        if self.dynamic_blocks:
            torch._dynamo.mark_dynamic(tab, 1)  # one graph for every table length of this shape
        try:
            # freezing while dynamo traces, and dynamo's limit of 8 graphs per function lifted (all
            # steps share _step's code: one engine has up to 14 graphs, a canary's engine adds its own)
            with first_compile(self.options):
                logits = self._fn(idx, pos, tab)  # (R, V) the first call of this bucket compiles
        except Exception as exc:  # no C++ compiler, unsupported op: the same step, eager
            self.compile_error = f"{type(exc).__name__}: {str(exc)[:200]}"
            if self.options.get("max_autotune") and not self.compile_s:  # no C++ GEMM template here
                self.use_options(without_gemm_template(self.options))
                self.compile_error = f"without the C++ GEMM template ({self.compile_error})"[:300]
                self._graphs_at_start = None  # count from the retry
                return self._compiled(idx, pos, tab, nb)
            self._fn = None
            return self._step(idx, pos, tab)
        done[nb] = time.perf_counter() - t0
        self._bucket_graphs += self.graphs - before
        return logits

    def _solo(self, idx: Tensor, pos: Tensor, tab: Tensor) -> Tensor:
        """The one-row step through its graph, compiling it on the first call (the table's
        length marked dynamic); (1, V). After that, dynamo's guards are skipped (``skip_guards``):
        the graph takes any length of 2 blocks or more, and the dtypes and device never change.
        If compiling fails with the C++ GEMM template, it compiles again with ATen's matmuls; if
        that fails too, a lone request runs the padded decode step (``solo`` off)."""
        if self.solo_compile_s:
            if 1 in self.packages:  # (1, V) ahead of time
                return self.packages[1].runner(idx, pos, tab, *self.pool.k, *self.pool.v)
            if self.skip_guards:
                return FastDecoder._unguarded(self._solo_fn, idx, pos, tab)
            return self._solo_fn(idx, pos, tab)  # type: ignore[misc]
        t0 = time.perf_counter()
        before = self.graphs
        if self._graphs_at_start is None:
            self._graphs_at_start = before
        if self._aot_package(1, self.solo_options):
            self.solo_compile_s[self.solo_blocks] = time.perf_counter() - t0
            return self.packages[1].runner(idx, pos, tab, *self.pool.k, *self.pool.v)  # (1, V)
        torch._dynamo.mark_dynamic(tab, 1)
        try:
            with first_compile(self.solo_options):
                logits = self._solo_fn(idx, pos, tab)  # type: ignore[misc]  # (1, V)
        except Exception as exc:  # noqa: BLE001 - no C++ compiler, no GEMM template for this CPU
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
            if self.solo_options.get("max_autotune"):
                self.solo_options = without_gemm_template(self.solo_options)
                self._solo_fn = self._counted(self._solo_step, dynamic=None, options=self.solo_options)
                self.compile_error = f"one-row step without the C++ GEMM template ({why})"[:300]
                return self._solo(idx, pos, tab)
            self.compile_error = f"one-row step: {why}"[:300]
            self.solo, self._solo_fn = False, None
            return self._step(idx, pos, tab)
        self.solo_compile_s[self.solo_blocks] = time.perf_counter() - t0
        self._bucket_graphs += self.graphs - before
        return logits

    def _aot_package(self, rows: int, options: dict) -> bool:
        """With ``aot``: load (or build) the package of the frozen-weight graph of ``rows`` rows
        (:func:`~codex_lab.infer.engine.runner.aot_paged.package_for_step`). False when ``aot`` is
        off or the package could not be had (``compile_error`` says why; ``aot`` turns off and the
        shape compiles with ``torch.compile``)."""
        if not self.aot or not options.get("freezing"):
            return False
        try:
            got = package_for_step(self, rows, options)
        except Exception as exc:  # noqa: BLE001 - an op export or AOTInductor lacks: torch.compile instead
            self.compile_error = f"ahead of time: {type(exc).__name__}: {str(exc)[:200]}; compiled with torch.compile"
            self.aot = False
            return False
        self.packages[rows] = got
        return True

    def _has(self, rows: int, nb: int) -> bool:
        """Whether the graph that runs ``rows`` rows over ``nb`` blocks is compiled."""
        done = self._done(rows)
        return bool(done) if self.dynamic_blocks or (rows == 1 and self.solo) else nb in done

    def _done(self, rows: int) -> dict[int, float]:
        """The compile seconds per bucket of the shape with ``rows`` rows (decode, mixed or solo)."""
        if rows == self.max_batch_size:
            return self.compile_s
        return self.mixed_compile_s if rows == self.mixed_rows else self.solo_compile_s

    def warmup(self, buckets: Sequence[int] | None = None) -> dict[int, float]:
        """Compile the buckets holding tables of the given block counts (default: every bucket
        up to ``max_bucket_tokens``, and in the mixed shape those up to ``mixed_max_tokens``) with
        every row in the scratch block, so no request waits for a compile. Returns seconds per
        bucket, both shapes together (0.0 when nothing compiles: eager steps)."""
        nbs = sorted({nb for _, nb in self.compile_plan(buckets)})
        for rows, nb in self.compile_plan(buckets):
            if rows == 1 and self.solo and not self._has(rows, nb) and self._solo_fn is not None:
                t = torch.full((1, nb), self.scratch, dtype=torch.long, device=self.device)  # (1, NB)
                with torch.no_grad():
                    zero = torch.zeros(1, 1, dtype=torch.long, device=self.device)  # (1, 1)
                    self._solo(zero, zero.clone(), t)
            elif not self._has(rows, nb) and self._fn is not None and not (rows == 1 and self.solo):
                idx = torch.zeros(rows, 1, dtype=torch.long, device=self.device)  # (R, 1)
                tab = torch.full((rows, nb), self.scratch, dtype=torch.long, device=self.device)  # (R, NB)
                with torch.no_grad():  # as __call__: dynamo guards on the grad mode at entry
                    self._compiled(idx, torch.zeros_like(idx), tab, nb)
        return {nb: self.compile_s.get(nb, 0.0) + self.mixed_compile_s.get(nb, 0.0) + self.solo_compile_s.get(nb, 0.0)
                for nb in nbs}

    def compile_plan(self, buckets: Sequence[int] | None = None) -> list[tuple[int, int]]:
        """(rows, blocks) of every graph :meth:`warmup` compiles, in its order: the decode shape's
        buckets up to ``max_bucket_tokens``, then the mixed shape's up to ``mixed_max_tokens``,
        then (``solo``) the one-row graph, once (symbolic in the table's length)."""
        nbs = sorted({nb for nb in map(self.bucket, buckets or self.buckets) if nb <= self.max_compiled_blocks})
        if self.dynamic_blocks:  # one graph per shape, whatever the length
            nbs = [self.bucket(self.min_blocks)]
        plan = [(self.max_batch_size, nb) for nb in nbs]
        if self.mixed_rows:
            plan += [(self.mixed_rows, nb) for nb in nbs if nb <= self.max_mixed_blocks]
        if self.solo:
            plan += [(1, self.solo_blocks)]
        return plan

    def compile_progress(self) -> tuple[int, int]:
        """(graphs compiled, graphs :meth:`warmup` compiles in all): what a server reports while
        its background compile runs (``/health``, ``/metrics``)."""
        plan = self.compile_plan()
        done = sum(self._has(rows, nb) for rows, nb in plan)
        return done, len(plan)

    @property
    def warming(self) -> bool:
        """True while :meth:`warmup_background` compiles (every step runs eagerly meanwhile)."""
        return self._background and not self.ready.is_set()

    def warmup_background(self, on_done: Callable[[dict[int, float]], None] | None = None, *,
                          freeze_gc: bool = True) -> threading.Thread:
        """Compile every bucket in a daemon thread; until it is done every step runs eagerly
        (the same padded step: the same tokens), then all steps switch to the graphs at once.
        ``on_done`` gets :meth:`warmup`'s result (seconds per bucket) when it finishes; if
        compiling fails, steps stay eager and :attr:`compile_error` says why. ``freeze_gc``:
        then :func:`freeze_long_lived` (what the compiler left behind is never scanned again)."""
        self._background = True
        self.ready.clear()

        def give_up(exc: Exception) -> None:
            self.compile_error = f"{type(exc).__name__}: {str(exc)[:200]}"
            self._fn = None

        return compile_in_background(self.warmup, self.ready, on_error=give_up, on_done=on_done, freeze_gc=freeze_gc)
