"""gpt-fast style greedy decoding: a fixed-shape decode step over a static cache, compiled once.

Why the plain cached loop does not compile well: its cache returns the filled prefix
(a length that grows every step) and turns positions into Python ints, so a compiled
forward sees a new shape or a new constant each step and recompiles. Here, as in gpt-fast:

- the cache is one preallocated (B, H_kv, L, D) buffer per layer, written in place at the
  step's position (``index_copy_``); every step attends over all ``L`` slots with a mask
  ``slot <= position and pattern(position, slot)``, so every tensor has the same shape;
- the position is a tensor (1,), never a Python int, so its value is not baked into the graph;
- the step is ``torch.compile``'d once (``dynamic=False``: one static graph) and reused; the
  bench reads :attr:`FastDecoder.recompiles` (dynamo's counters) to show it stays at 0.

The prompt goes through the same function eagerly (prefill: one call of T tokens). If
compiling is unavailable or fails (no C++ compiler, an old torch), :class:`FastDecoder`
runs the same step eagerly and says why in :attr:`FastDecoder.compile_error`.
Tokens equal :func:`codex_lab.infer.generate.generate_ids` (greedy).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from codex_lab.infer.compile_options import (CountingBackend, counted_compile, decode_compile_options, first_compile,
                                             without_gemm_template)
from codex_lab.nn.attention import one_query_attention
from codex_lab.nn.layers import apply_rope
from codex_lab.nn.model import CodexModel

# the most tokens a step attends with one_query_attention (a decode step's 1, a speculative
# verify's few guesses + 1); past it SDPA. Measured on the shipped model compiled ahead of time,
# 2 threads, 512 slots (2026-12-07): one_query's verify packages took 0.50 / 0.65 / 0.74 ms at
# T = 2 / 3 / 5 against SDPA's 0.57 / 0.74 / 0.79, but 1.77 / 3.28 ms at T = 9 / 17 against 1.62 /
# 2.88 (its (B, H, T, L, D) products outgrow the fused loops)
FEW_QUERIES = 8


class FastDecoder:
    """Greedy decoding of ``model`` with a static cache of ``max_len`` slots and batch ``batch``.

    Args:
        model: a :class:`CodexModel` (dense SwiGLU or MoE feed-forwards; any attention pattern).
        max_len: cache slots, the longest prompt + new tokens (default ``cfg.max_seq_len``).
        batch: rows decoded together (equal-length prompts).
        compile: ``torch.compile`` the decode step (False: eager, the same function; ``"aot"``:
            compiled ahead of time with AOTInductor, :mod:`codex_lab.infer.aot_step`, a package
            built once per model and shape and kept on disk, so a later decoder of the same model
            loads it in milliseconds and no step enters dynamo; a CPU only).
        backend: torch.compile backend ("inductor" generates fused code; "eager" only
            traces, which tests use to check guards and recompiles cheaply).
        mode: torch.compile mode; ``"reduce-overhead"`` replays the step as a CUDA graph on a
            GPU (one launch per token instead of one per kernel; the cache tensors are marked
            static so their addresses stay fixed inside the graph). ``None``: the default mode.
        options: Inductor options. Default on a CPU (inductor backend, no ``mode``), from
            :func:`decode_compile_options`: ``freezing`` (the weights become constants of the
            graph), Inductor's C++ GEMM template over them (packed once, split across cores)
            and ``cpp_wrapper`` (the code that calls the kernels is C++, not Python). Frozen
            weights are read at the first compiled step: build a new decoder after changing
            the model's weights. The first call compiles for ~10-25 s on 2 cores.
        attention: a decode step's attention. ``"one_query"``: :func:`one_query_attention`,
            plain tensor ops Inductor fuses; ``"sdpa"``: ``F.scaled_dot_product_attention``;
            ``"auto"`` (default): one_query when the step compiles on a CPU (Inductor fuses
            it), sdpa otherwise. The prompt's prefill always runs SDPA.
    """

    def __init__(self, model: CodexModel, *, max_len: int | None = None, batch: int = 1, compile: bool | str = True,
                 backend: str = "inductor", mode: str | None = None, options: dict | None = None,
                 attention: str = "auto") -> None:
        cfg = model.cfg
        self.model = model.eval()
        self.max_len = cfg.max_seq_len if max_len is None else max_len
        if self.max_len > cfg.max_seq_len:
            raise ValueError(f"max_len={self.max_len} is past the model's max_seq_len={cfg.max_seq_len}")
        p = next(model.parameters())
        assert cfg.n_kv_head is not None
        shape = (batch, cfg.n_kv_head, self.max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, device=p.device, dtype=p.dtype) for _ in range(cfg.n_layer)]  # (B, Hkv, L, D) each
        self.v = [torch.zeros(shape, device=p.device, dtype=p.dtype) for _ in range(cfg.n_layer)]
        self.slots = torch.arange(self.max_len, device=p.device)  # (L,)
        if attention not in ("auto", "sdpa", "one_query"):
            raise ValueError(f"attention={attention!r}: choose 'auto', 'sdpa' or 'one_query'")
        # a decode step's attention: the one-query formula when the step compiles on a CPU (faster than
        # ATen's flash attention there: `codex-lab bench inference --scenarios decode` times both, rows
        # codex_lab_fast_decode and codex_lab_fast_decode_sdpa); SDPA, the reference, eagerly and on
        # other devices (not measured there)
        if compile not in (True, False, "aot"):
            raise ValueError(f"compile={compile!r}: choose True (torch.compile), False (eager) or 'aot' (AOTInductor)")
        if compile == "aot" and p.device.type != "cpu":
            raise ValueError("compile='aot' builds a CPU package; on a GPU use compile=True with mode='reduce-overhead'")
        self.aot = compile == "aot"
        fused = bool(compile) and p.device.type == "cpu"
        self.attention = ("one_query" if fused else "sdpa") if attention == "auto" else attention
        self.batch = batch
        self.mode = mode
        self.options: dict = {}
        if mode == "reduce-overhead":
            from torch._dynamo import mark_static_address

            for t in self.k + self.v:
                mark_static_address(t)  # CUDA graphs: the cache never moves
        self.compile_error = ""
        self.compile_s = 0.0
        self._compiled = None
        self._counter: CountingBackend | None = None
        self._graphs_before = 0  # graphs of counters replaced by a recompile without the GEMM template
        self._aot: Any = None  # the loaded package (compile="aot"), got at the first decode step or prepare()
        self._packages: dict[tuple[str, int], Any] = {}  # (kind, tokens) -> package: logits, verify (aot_step)
        self.aot_from_disk = False
        if self.aot:
            self.options = decode_compile_options(options, "inductor", None, p.device) or {}
        elif compile:
            try:
                options = decode_compile_options(options, backend, mode, p.device)
                self.options = options or {}
                self._compiled, self._counter = counted_compile(self._next, dynamic=False, backend=backend, mode=mode,
                                                                options=options)
            except Exception as exc:  # pragma: no cover - torch without dynamo
                self.compile_error = f"{type(exc).__name__}: {exc}"[:200]
        self._graphs_after_first: int | None = None
        self.decode_calls = 0
        # after the first (compiling) call, skip dynamo's guard evaluation (~90 us of a ~1.3 ms
        # step on a 2-core CPU, 2026-12-02); False: evaluate every guard each step (the reference)
        self.skip_guards = True

    @property
    def recompiles(self) -> int:
        """Graphs compiled after the first compiled decode step (0 = compiled once, reused)."""
        return 0 if self._graphs_after_first is None else self.graphs - self._graphs_after_first

    @property
    def graphs(self) -> int:
        """Graphs this decoder's step has compiled (its own count, not the process's)."""
        return self._graphs_before + (self._counter.graphs if self._counter is not None else 0)

    @torch.no_grad()
    def _step(self, tokens: Tensor, pos: Tensor, last_only: bool = True) -> Tensor:
        """tokens (B, T) at positions ``pos`` (T,) -> logits of the last position (B, V), or of
        every position (B, T, V) when not ``last_only``; writes their keys/values into slots
        ``pos`` of the static cache."""
        m = self.model
        B, T = tokens.shape
        cos = m.rope_cos[pos][None, None]  # (1, 1, T, hd)
        sin = m.rope_sin[pos][None, None]  # (1, 1, T, hd)
        x = m.embed(tokens)  # (B, T, d)
        for i, layer in enumerate(m.layers):
            at = layer.attn
            h = layer.attn_norm(x)  # (B, T, d)
            q = at.q_proj(h).view(B, T, at.n_head, at.head_dim).transpose(1, 2)  # (B, H, T, hd)
            k = at.k_proj(h).view(B, T, at.n_kv_head, at.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
            v = at.v_proj(h).view(B, T, at.n_kv_head, at.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            self.k[i].index_copy_(2, pos, k)  # slot = position
            self.v[i].index_copy_(2, pos, v)
            # allowed[t, s] = slot s is filled (s <= pos_t) and pattern(pos_t, s)
            allowed = (self.slots[None, :] <= pos[:, None]) & at.pattern.allowed(pos[:, None], self.slots[None, :])  # (T, L)
            if T <= FEW_QUERIES and self.attention == "one_query":  # a decode step, or a verify's few tokens
                y = one_query_attention(q, self.k[i], self.v[i], allowed)  # (B, H, T, hd)
            else:
                y = F.scaled_dot_product_attention(q, self.k[i], self.v[i], attn_mask=allowed[None, None],
                                                   enable_gqa=at.n_head != at.n_kv_head)  # (B, H, T, hd)
            y = y.transpose(1, 2).reshape(B, T, at.n_head * at.head_dim)  # (B, T, H*hd)
            x = x + at.o_proj(y)
            x = x + layer.ffn(layer.ffn_norm(x))
        if not last_only:
            return m.lm_head(m.norm(x))  # (B, T, V)
        x = m.norm(x[:, -1:])  # (B, 1, d)
        return m.lm_head(x)[:, 0]  # (B, V)

    @torch.no_grad()
    def _next(self, tokens: Tensor, pos: Tensor) -> Tensor:
        """One decode step and its greedy pick, one graph: tokens (B, 1) at ``pos`` (1,) -> next ids (B,)."""
        return self._step(tokens, pos).argmax(-1)  # (B,)

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[int] | Tensor, max_new_tokens: int, *, eos_id: int | None = None) -> list[list[int]]:
        """Greedy continuation of ``prompt_ids`` ((T,) list or (B, T) tensor): new ids per row.

        Stops at ``max_new_tokens`` (or when every row produced ``eos_id``; a row's ids stop
        before its eos). Equal to ``generate_ids`` token for token.
        """
        dev = self.slots.device
        prompts = torch.as_tensor(prompt_ids, device=dev)
        if prompts.dim() == 1:
            prompts = prompts[None]  # (1, T)
        B, T = prompts.shape
        if B != self.batch:
            raise ValueError(f"decoder built for batch={self.batch}, got {B} prompts")
        if T == 0 or T + max_new_tokens > self.max_len:
            raise ValueError(f"prompt {T} + {max_new_tokens} new tokens must be 1..{self.max_len} (max_len)")
        out: list[list[int]] = [[] for _ in range(B)]
        if max_new_tokens == 0:
            return out
        done = [False] * B
        nxt, pos = self.prefill(prompts)  # (B,), (1,)
        for i in range(max_new_tokens):
            for b, t in enumerate(nxt.tolist()):
                if not done[b]:
                    if eos_id is not None and t == eos_id:
                        done[b] = True
                    else:
                        out[b].append(t)
            if all(done) or i + 1 == max_new_tokens:
                break
            nxt = self.decode_step(nxt[:, None], pos)  # (B,)
            pos += 1
        return out

    @torch.no_grad()
    def prefill(self, prompts: Tensor) -> tuple[Tensor, Tensor]:
        """The prompts (B, T) through the step eagerly (one call of T tokens), their keys/values
        written into slots 0..T-1 -> (the first greedy ids (B,), the next position (1,)): what
        :meth:`decode_step` takes next. A tensor position, so no recompile as it changes."""
        T = prompts.shape[1]
        nxt = self._step(prompts, torch.arange(T, device=self.slots.device)).argmax(-1)  # (B,)
        return nxt, torch.tensor([T], device=self.slots.device)

    def prepare(self) -> float:
        """Get the ahead-of-time package now (``compile="aot"``: loaded from disk, or built and
        kept), instead of at the first decode step; a server calls it at start. Returns the seconds
        it took (0 when there is nothing to prepare); a failure leaves the decoder eager and says
        why in :attr:`compile_error`."""
        if not self.aot or self._aot is not None or self.compile_error:
            return 0.0
        from codex_lab.infer.aot_step import aot_step

        try:
            self._aot = aot_step(self, options=self.options)
        except Exception as exc:  # no C++ compiler, an op export or AOTInductor does not take
            self.compile_error = f"{type(exc).__name__}: {str(exc)[:200]}"
            self.aot = False
            return 0.0
        self.compile_s, self.aot_from_disk = self._aot.seconds, self._aot.from_disk
        return self._aot.seconds

    @torch.no_grad()
    def prefill_logits(self, prompts: Tensor) -> Tensor:
        """The prompts (B, T) through the step eagerly, their keys/values written into slots
        0..T-1 -> the last position's logits (B, V) (what sampling picks from)."""
        return self._step(prompts, torch.arange(prompts.shape[1], device=self.slots.device))

    def _package(self, kind: str, tokens: int) -> Any:
        """The ahead-of-time package of ``kind`` taking ``tokens`` tokens (prepared at the first
        call), or None when the decoder is not ``compile="aot"`` or a build failed (the decoder then
        goes on eagerly and :attr:`compile_error` says why)."""
        if not self.aot or self.compile_error:
            return None
        key = (kind, tokens)
        if key not in self._packages:
            from codex_lab.infer.aot_step import aot_step

            try:
                self._packages[key] = got = aot_step(self, kind=kind, tokens=tokens, options=self.options)
            except Exception as exc:  # as prepare(): no C++ compiler, an op AOTInductor does not take
                self.compile_error = f"{type(exc).__name__}: {str(exc)[:200]}"
                return None
            self.compile_s, self.aot_from_disk = got.seconds, got.from_disk
        return self._packages[key]

    @torch.no_grad()
    def decode_logits(self, tokens: Tensor, pos: Tensor) -> Tensor:
        """One decode step returning the logits (B, V) instead of the greedy ids: the package of
        kind ``"logits"`` with ``compile="aot"``, else the step eagerly."""
        pkg = self._package("logits", 1)
        if pkg is not None:
            self.decode_calls += 1
            return pkg(tokens, pos, self.k, self.v)  # (B, V)
        return self._step(tokens, pos)

    @torch.no_grad()
    def verify(self, tokens: Tensor, pos: Tensor) -> Tensor:
        """The greedy token after each of ``tokens`` (B, T) at positions ``pos`` (T,) in one step
        -> (B, T) ids; their keys/values are written into slots ``pos``. Speculative verification:
        T = the guesses + 1, a fixed T per package (``compile="aot"``: one package per T), else the
        step eagerly. A slot written past the accepted tokens needs no rollback: a query at
        position p reads slots <= p only, and the next token at p + 1 writes its slot before
        any query reads it."""
        pkg = self._package("verify", tokens.shape[1])
        if pkg is not None:
            return pkg(tokens, pos, self.k, self.v)  # (B, T)
        return self._step(tokens, pos, last_only=False).argmax(-1)  # (B, T)

    @torch.no_grad()
    def decode_step(self, tokens: Tensor, pos: Tensor) -> Tensor:
        """One decode step: tokens (B, 1) at position ``pos`` (1,) -> greedy next ids (B,); writes
        their keys/values into slot ``pos`` of the cache. Compiled (the first call compiles; a
        compile that fails leaves the decoder eager and says why in :attr:`compile_error`),
        ahead of time (``compile="aot"``: the package's runner, no dynamo), or the same function
        eagerly."""
        if self.aot:
            if self._aot is None:
                self.prepare()
            if self._aot is not None:
                self.decode_calls += 1
                return self._aot(tokens, pos, self.k, self.v)  # (B,)
        first = self._compiled is not None and self.decode_calls == 0
        t0 = time.perf_counter()
        out = self._compiled_step(tokens, pos, first) if self._compiled is not None else None
        if out is None:  # eager: the same function
            out = self._next(tokens, pos)
        if first:
            self.compile_s = time.perf_counter() - t0
            self._graphs_after_first = self.graphs
        self.decode_calls += 1
        return out

    def _compiled_step(self, tokens: Tensor, pos: Tensor, first: bool) -> Tensor | None:
        """The step through the graph (None, and the decoder eager from now on, if compiling or
        running it fails: :attr:`compile_error` says why). A first call that fails with the C++
        GEMM template in the options compiles again with ATen's matmuls."""
        while True:
            try:
                if self.skip_guards and not first:
                    return self._unguarded(self._compiled, tokens, pos, guarded=self._traced)
                return self._traced(tokens, pos)  # the first call compiles
            except Exception as exc:  # no C++ compiler, an unsupported op, a failed recompile
                why = f"{type(exc).__name__}: {str(exc)[:200]}"
                if not (first and self.options.get("max_autotune")):
                    self.compile_error, self._compiled = why, None
                    return None
                self.options = without_gemm_template(self.options)
                self._graphs_before = self.graphs
                self._compiled, self._counter = counted_compile(self._next, dynamic=False, options=self.options)
                self.compile_error = f"without the C++ GEMM template ({why})"[:300]

    def _traced(self, tokens: Tensor, pos: Tensor) -> Tensor:
        """The compiled step with every guard, in :func:`first_compile`'s context (freezing while
        dynamo traces, dynamo's graph limit lifted)."""
        with first_compile(self.options):
            return self._compiled(tokens, pos)  # type: ignore[misc]

    @staticmethod
    def _unguarded(step: object, *args: Tensor, guarded: object = None) -> Tensor:
        """``step(*args)`` without dynamo's guard evaluation: the same shapes (or a dimension
        the graph holds symbolic), dtypes and devices every step, so they cannot fail; only
        the guards that tell this graph from other graphs of the same code run. If something
        else changed since the graph was built (the thread count, the grad mode), dynamo
        refuses to recompile in that stance: the step then runs as ``guarded(*args)`` (default
        ``step``), with every guard (recompiling if it must)."""
        try:
            with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                return step(*args)  # type: ignore[operator]
        except RuntimeError as exc:
            if "skip_guard_eval_unsafe" not in str(exc):
                raise
        return (guarded or step)(*args)  # type: ignore[operator]

    @property
    def compiled(self) -> bool:
        """True when decode steps run a compiled graph (``torch.compile``'s or the ahead-of-time package)."""
        return self._compiled is not None or self._aot is not None or bool(self._packages)
