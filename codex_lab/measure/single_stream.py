"""One stream: FastDecoder against the serving engine (``codex_lab.serve.compiled.compiled_engine``,
what ``codex-lab serve`` runs), in process, no HTTP, in interleaved rounds
(``codex-lab bench inference --scenarios single_stream``).

The engine runs twice: with its one-row shape for a request decoding alone (``solo``, what
``codex-lab serve`` runs) and with every step padded to its slots (before). Per token, the
engine's time is split into the model step (the compiled graph and its padding:
``Engine._forward``) and the rest (scheduling, sampling, emitting: Python). Every engine must
give FastDecoder's greedy tokens (``same_tokens``).

``http``: two more rows, ``serve_http``: the same request through ``codex-lab serve``'s app (the
compiled engine behind uvicorn on a loopback port), and ``serve_http_process``: the same with the
engine in a process of its own (``codex-lab serve --engine-process``), from a streaming client in a process of
its own (:func:`~codex_lab.serve.loadtest.run_load_in_process`, as real clients are), in the same
rounds. Its ``http_ms_per_token`` is what HTTP, the event loop and streaming add per token over
the in-process engine (``1000/serve_http - 1000/engine_solo``, tokens/s medians); its text must
be FastDecoder's (``same_tokens``, from an unstreamed request beside the rounds).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.nn.model import CodexModel


def bench_single_stream(model: CodexModel, tok: CodeTokenizer, *, slots: int = 8, new_tokens: int = 128,
                        prompt_len: int = 128, rounds: int = 5, compile: bool = True,
                        http: bool = True) -> list[dict[str, Any]]:
    """Rows ``fast_decode``, ``engine_solo``, ``engine_padded`` and (``http``) ``serve_http``:
    tokens/s (median, min, max over ``rounds``), the ratio to FastDecoder, and per token the
    engine's model-step and other milliseconds (FastDecoder: its whole milliseconds per token;
    the server: what HTTP adds). ``compile=False`` runs every path eagerly (tests)."""
    from codex_lab.infer.engine.loop import Engine
    from codex_lab.infer.fast_decode import FastDecoder
    from codex_lab.infer.engine.runner.options import served_step_options
    from codex_lab.infer.sampling import SamplingParams
    from codex_lab.measure.peer_llamacpp import corpus_prompts
    from codex_lab.serve.compiled import compiled_engine

    model = model.eval()
    prompt = corpus_prompts(tok, [prompt_len])[prompt_len]
    n = new_tokens
    # FastDecoder at its fastest on a CPU: the step compiled ahead of time (no dynamo per token), as
    # the served engine's one-row graph is
    cpu = next(model.parameters()).device.type == "cpu"
    dec = FastDecoder(model, max_len=prompt_len + n, compile="aot" if compile and cpu else compile)
    opts = served_step_options(slots)
    if compile:
        engines = {"engine_solo": compiled_engine(model, tok, max_batch_size=slots),  # codex-lab serve's
                   "engine_padded": compiled_engine(model, tok, max_batch_size=slots, step_options={**opts, "solo": False})}
    else:  # the same padded step, eager (compile_backend "eager" only traces)
        engines = {k: Engine(model, tok, max_batch_size=slots, compile=True, compile_backend="eager",
                             step_options={**opts, "solo": k == "engine_solo"}) for k in ("engine_solo", "engine_padded")}
    forward_s = {k: 0.0 for k in engines}
    for k, eng in engines.items():  # time inside the model step (the graph and its padding)
        def timed(reqs: Any, _f: Any = eng._forward, _k: str = k) -> Any:
            t0 = time.perf_counter()
            out = _f(reqs)
            forward_s[_k] += time.perf_counter() - t0
            return out
        eng._forward = timed  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)

    def fast() -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        out = dec.generate(prompt, n)[0]
        return time.perf_counter() - t0, list(out)

    def engine(k: str) -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        engines[k].submit(prompt, params)
        done = engines[k].run_until_done()[0]
        return time.perf_counter() - t0, list(done.output_ids)

    secs: dict[str, list[float]] = {"fast_decode": [], **{k: [] for k in engines}}
    fwd: dict[str, list[float]] = {k: [] for k in engines}
    same = True
    # the server twice: its engine on a thread of the server's process, and in a process of its own
    servers = {"serve_http": _Served(model, tok, slots, compile, prompt, n),
               "serve_http_process": _Served(model, tok, slots, compile, prompt, n, process=True)} if http else {}
    secs.update({k: [] for k in servers})
    try:
        same = _rounds(fast, engine, engines, servers, rounds, compile, secs, fwd, forward_s)
    finally:
        for server in servers.values():
            server.stop()
    base = statistics.median(n / s for s in secs["fast_decode"])
    rows = []
    for k, ss in secs.items():
        rates = [n / s for s in ss]
        row: dict[str, Any] = {"scenario": "single_stream", "impl": k, "slots": 1 if k == "fast_decode" else slots,
                               "prompt_len": prompt_len, "new_tokens": n, "rounds": rounds,
                               "tokens_per_s": statistics.median(rates), "tokens_per_s_min": min(rates),
                               "tokens_per_s_max": max(rates), "same_tokens": same,
                               "vs_fast_decode": statistics.median(rates) / base}
        if k in fwd:  # per token, ms: the model step vs the rest of the engine's loop
            row["step_ms_per_token"] = 1000 * statistics.median(fwd[k]) / n
            row["other_ms_per_token"] = 1000 * statistics.median(s - f for s, f in zip(ss, fwd[k])) / n
        elif k.startswith("serve_http"):
            solo = statistics.median(n / s for s in secs["engine_solo"])
            # what HTTP adds per token = ms per token through the server - ms per token in process
            row["http_ms_per_token"] = 1000 / row["tokens_per_s"] - 1000 / solo
        else:
            row["ms_per_token"] = 1000 * statistics.median(ss) / n
        rows.append(row)
    return rows


def _rounds(fast: Any, engine: Any, engines: dict[str, Any], servers: "dict[str, _Served]", rounds: int, compile: bool,
            secs: dict[str, list[float]], fwd: dict[str, list[float]], forward_s: dict[str, float]) -> bool:
    """Warm every path, then ``rounds`` interleaved rounds; whether every path gave FastDecoder's tokens."""
    same = True
    with torch.no_grad():
        _, ref = fast()
        for k, eng in engines.items():  # warm-up: every bucket compiled before the rounds
            engine(k)
            if compile and eng.fast_step is not None and not eng.fast_step.ready.wait(900):  # the background compile
                raise RuntimeError("the engine's step took over 900 s to compile")
            engine(k)
        for server in servers.values():  # warm-up (once its graphs are built): the server's answer is FastDecoder's text
            same &= server.text() == server.expected(ref)
            server.timed()
        for _ in range(rounds):
            s, out = fast()
            secs["fast_decode"].append(s)
            same &= out == ref
            for k in engines:
                forward_s[k] = 0.0
                s, out = engine(k)
                secs[k].append(s)
                fwd[k].append(forward_s[k])
                same &= out == ref
            for k, server in servers.items():
                secs[k].append(server.timed())
    return same


class _Served:
    """``codex-lab serve``'s app (the compiled engine, as the command builds it) on a loopback
    port, for one streamed request at a time from a client process of its own."""

    def __init__(self, model: CodexModel, tok: CodeTokenizer, slots: int, compile: bool, prompt: list[int],
                 n: int, process: bool = False) -> None:
        from codex_lab.infer.engine.loop import Engine
        from codex_lab.serve.app import serve_in_background
        from codex_lab.serve.router import ModelServer, ServerConfig
        from codex_lab.serve.compiled import compiled_engine

        def factory(m: Any, t: Any, **kw: Any) -> Any:
            if compile:
                return compiled_engine(m, t, **kw)
            return Engine(m, t, compile=True, compile_backend="eager", **kw)  # eager: tests

        self.tok, self.prompt, self.n = tok, prompt, n
        self.engines: list[Any] = []
        self.process = process
        if process:  # the engine in a child process: a factory it can unpickle by name
            self.srv = ModelServer(tok, ServerConfig(model_name="bench", max_batch_size=slots, engine_process=True),
                                   engine_factory=compiled_engine if compile else eager_engine)
        else:
            self.srv = ModelServer(tok, ServerConfig(model_name="bench", max_batch_size=slots),
                                   engine_factory=lambda m, t, **kw: self.engines.append(factory(m, t, **kw)) or self.engines[-1])
        self.srv.add_version("v0001", model)
        self.bg = serve_in_background(self.srv)

    def timed(self) -> float:
        """Seconds for one streamed request of ``n`` tokens (every answer runs to ``n``), measured by
        the client; RuntimeError unless it got all ``n`` tokens."""
        from codex_lab.serve.loadtest import run_load_in_process

        s = run_load_in_process(self.bg.url, concurrency=1, requests=1, max_tokens=self.n, prompts=[self.prompt],
                                progress=False, extra_body={"ignore_eos": True})
        if s["tokens"] != self.n or s["errors"]:
            raise RuntimeError(f"the served request gave {s['tokens']} of {self.n} tokens ({s['error_kinds']})")
        return float(s["duration_s"])

    def text(self) -> str:
        """The answer to the same request, unstreamed (after the engine's graphs are built)."""
        import httpx

        for eng in self.engines:
            if eng.fast_step is not None and eng.fast_step.warming and not eng.fast_step.ready.wait(900):
                raise RuntimeError("the served engine's step took over 900 s to compile")
        t0 = time.perf_counter()
        while self.process and self.srv.workers["v0001"].phase()["phase"] == "warming":  # the child's compile
            if time.perf_counter() - t0 > 900:
                raise RuntimeError("the engine process's step took over 900 s to compile")
            time.sleep(0.2)
        r = httpx.post(self.bg.url + "/v1/completions", timeout=120, trust_env=False,
                       json={"model": "bench", "prompt": self.prompt, "max_tokens": self.n, "temperature": 0,
                             "ignore_eos": True})
        r.raise_for_status()
        return str(r.json()["choices"][0]["text"])

    def expected(self, ids: list[int]) -> str:
        """The text the server shows for generated ``ids``."""
        from codex_lab.infer.generate import output_text

        return output_text(self.tok, ids)

    def stop(self) -> None:
        self.bg.stop()
        self.srv.close()


def eager_engine(model: Any, tokenizer: Any, **kw: Any) -> Any:
    """The served engine's padded step run eagerly (tests; module level: an engine process unpickles it)."""
    from codex_lab.infer.engine.loop import Engine

    return Engine(model, tokenizer, compile=True, compile_backend="eager", **kw)


__all__ = ["bench_single_stream", "eager_engine"]
