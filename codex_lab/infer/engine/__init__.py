"""The continuous-batching engine, laid out the way vLLM separates it (import from the modules):

- :mod:`.loop`: :class:`~codex_lab.infer.engine.loop.Engine`, the engine loop: ``submit``,
  ``step`` (admit, prefill, decode, emit), ``cancel``, ``run_until_done``;
- :mod:`.scheduler`: a request's state, first-come admission into the paged KV pool,
  deadlines, the pool's accounting;
- :mod:`.output`: the text a request streams (incremental decoding, stop strings);
- :mod:`.runner`: the model runner, one module per kind of step: :mod:`.runner.eager` (prefill
  and decode forwards, the plain reference path), :mod:`.runner.compiled` (the fixed-shape
  compiled decode step over paged memory), :mod:`.runner.mixed` (prompt tokens riding in the
  compiled step) and :mod:`.runner.options` (what ``codex-lab serve`` gives the compiled step).
"""
