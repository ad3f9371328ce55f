"""One stream: FastDecoder against the serving engine (``codex_lab.serve.compiled.compiled_engine``,
what ``codex-lab serve`` runs), in process, no HTTP, in interleaved rounds
(``codex-lab bench inference --scenarios single_stream``).

The engine runs twice: with its one-row shape for a request decoding alone (``solo``, what
``codex-lab serve`` runs) and with every step padded to its slots (before). Per token, the
engine's time is split into the model step (the compiled graph and its padding:
``Engine._forward``) and the rest (scheduling, sampling, emitting: Python). Every engine must
give FastDecoder's greedy tokens (``same_tokens``).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.nn.model import CodexModel


def bench_single_stream(model: CodexModel, tok: CodeTokenizer, *, slots: int = 8, new_tokens: int = 128,
                        prompt_len: int = 128, rounds: int = 5, compile: bool = True) -> list[dict[str, Any]]:
    """Rows ``fast_decode``, ``engine_solo`` and ``engine_padded``: tokens/s (median, min, max over
    ``rounds``), the ratio to FastDecoder, and per token the engine's model-step and other
    milliseconds (FastDecoder: its whole milliseconds per token). ``compile=False`` runs every
    path eagerly (tests)."""
    from codex_lab.infer.engine import Engine
    from codex_lab.infer.fast_decode import FastDecoder
    from codex_lab.infer.paged_step import served_step_options
    from codex_lab.infer.sampling import SamplingParams
    from codex_lab.lessons.l06_inference.peer_llamacpp import corpus_prompts
    from codex_lab.serve.compiled import compiled_engine

    model = model.eval()
    prompt = corpus_prompts(tok, [prompt_len])[prompt_len]
    n = new_tokens
    dec = FastDecoder(model, max_len=prompt_len + n, compile=compile)
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
    with torch.no_grad():
        _, ref = fast()
        for k, eng in engines.items():  # warm-up: every bucket compiled before the rounds
            engine(k)
            if compile and eng.fast_step is not None and not eng.fast_step.ready.wait(900):  # the background compile
                raise RuntimeError("the engine's step took over 900 s to compile")
            engine(k)
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
        else:
            row["ms_per_token"] = 1000 * statistics.median(ss) / n
        rows.append(row)
    return rows


__all__ = ["bench_single_stream"]
