"""One stream: FastDecoder against the serving engine (``codex_lab.serve.compiled.compiled_engine``,
what ``codex-lab serve`` runs), in process, no HTTP, in interleaved rounds; the engine with its
one-row shape for a request alone (``solo``, what ``codex-lab serve`` runs) and without it (every
step padded to the slots). Per token, the engine's time is split into the model step (the
compiled graph and its padding: ``Engine._forward``) and the rest (scheduling, sampling,
emitting: Python). Issue 41's single-stream goal; the rows are what `bench_records.json` keeps
under ``single_stream`` (``python scripts/update_figures.py --bench single_stream FILE``).

    python scripts/single_stream_profile.py [--slots 8] [--rounds 5] [--tokens 128] [--json]

One math thread (the CLI's policy on 2 cores). Every engine gives FastDecoder's greedy tokens (checked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=8, help="the engine's max_batch_size (codex-lab serve: 8)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128, help="greedy tokens per request (end-of-text ignored)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON (for update_figures.py --bench)")
    args = ap.parse_args()

    import torch

    from codex_lab.infer.fast_decode import FastDecoder
    from codex_lab.infer.paged_step import served_step_options
    from codex_lab.infer.sampling import SamplingParams
    from codex_lab.lessons.l06_inference.peer_llamacpp import corpus_prompts
    from codex_lab.serve.compiled import compiled_engine
    from codex_lab.training.checkpoint import load_pretrained

    torch.set_num_threads(1)
    ck = load_pretrained()
    model, tok = ck.model.eval(), ck.tokenizer
    prompt = corpus_prompts(tok, [128])[128]
    n = args.tokens
    dec = FastDecoder(model, max_len=128 + n, compile=True)
    engines = {"engine_solo": compiled_engine(model, tok, max_batch_size=args.slots),  # codex-lab serve's
               "engine_padded": compiled_engine(model, tok, max_batch_size=args.slots,
                                                step_options={**served_step_options(args.slots), "solo": False})}
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
        eng = engines[k]
        t0 = time.perf_counter()
        eng.submit(prompt, params)
        done = eng.run_until_done()[0]
        return time.perf_counter() - t0, list(done.output_ids)

    secs: dict[str, list[float]] = {"fast_decode": [], **{k: [] for k in engines}}
    fwd: dict[str, list[float]] = {k: [] for k in engines}
    same = True
    with torch.no_grad():
        _, ref = fast()
        for k, eng in engines.items():  # warm-up: every bucket compiled before the rounds
            engine(k)
            if eng.fast_step is not None and not eng.fast_step.ready.wait(900):
                raise RuntimeError("the engine's step took over 900 s to compile")
            engine(k)
        for _ in range(args.rounds):
            s, out = fast()
            secs["fast_decode"].append(s)
            same &= out == ref
            for k in engines:
                forward_s[k] = 0.0
                s, out = engine(k)
                secs[k].append(s)
                fwd[k].append(forward_s[k])
                same &= out == ref
    rows = []
    base = statistics.median(n / s for s in secs["fast_decode"])
    for k, ss in secs.items():
        rates = [n / s for s in ss]
        row: dict[str, Any] = {"scenario": "single_stream", "impl": k, "slots": 1 if k == "fast_decode" else args.slots,
                               "prompt_len": 128, "new_tokens": n, "rounds": args.rounds, "threads": 1,
                               "tokens_per_s": statistics.median(rates), "tokens_per_s_min": min(rates),
                               "tokens_per_s_max": max(rates), "same_tokens": same,
                               "vs_fast_decode": statistics.median(rates) / base}
        if k in fwd:  # per token, ms: the model step vs the rest of the engine's loop
            row["step_ms_per_token"] = 1000 * statistics.median(fwd[k]) / n
            row["other_ms_per_token"] = 1000 * statistics.median(s - f for s, f in zip(ss, fwd[k])) / n
        else:
            row["ms_per_token"] = 1000 * statistics.median(ss) / n
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        split = (f"; per token {r['step_ms_per_token']:.2f} ms in the model step, {r['other_ms_per_token']:.2f} ms around it"
                 if "step_ms_per_token" in r else f"; {r['ms_per_token']:.2f} ms per token")
        print(f"{r['impl']}: {r['tokens_per_s']:.0f} tokens/s ({r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f}), "
              f"{r['vs_fast_decode']:.2f}x FastDecoder{split}; same tokens: {r['same_tokens']}")


if __name__ == "__main__":
    main()
