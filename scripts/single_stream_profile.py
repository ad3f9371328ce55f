"""One stream: FastDecoder against the serving engine (``codex_lab.serve.compiled.compiled_engine``,
what ``codex-lab serve`` runs), in process, no HTTP: tokens/s over interleaved rounds and a
cProfile of one engine request (where the per-token time goes). Issue 41's single-stream goal.

    python scripts/single_stream_profile.py [--slots 8] [--rounds 5] [--tokens 128] [--no-profile]

One math thread (the CLI's policy on 2 cores). Both engines give the same greedy tokens (checked).
Numbers go to docs/PROFILE.md by hand, with the date and the machine's state.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=8, help="the engine's max_batch_size (codex-lab serve: 8)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128, help="greedy tokens per request (end-of-text ignored)")
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()

    import torch

    from codex_lab.infer.fast_decode import FastDecoder
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
    eng = compiled_engine(model, tok, max_batch_size=args.slots)
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)

    def fast() -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        out = dec.generate(prompt, n)[0]
        return n / (time.perf_counter() - t0), list(out)

    def engine() -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        eng.submit(prompt, params)
        done = eng.run_until_done()[0]
        return n / (time.perf_counter() - t0), list(done.output_ids)

    with torch.no_grad():
        fast(); engine()  # compile FastDecoder; start the engine's background compile
        if eng.fast_step is not None and not eng.fast_step.ready.wait(900):
            raise RuntimeError("the engine's step took over 900 s to compile")
        engine()
        a, b, same = [], [], True
        for _ in range(args.rounds):
            r, o1 = fast(); a.append(r)
            r, o2 = engine(); b.append(r)
            same &= o1 == o2
        print(f"FastDecoder {statistics.median(a):.0f} tokens/s (rounds {min(a):.0f}-{max(a):.0f}); engine with "
              f"{args.slots} slots, one stream {statistics.median(b):.0f} ({min(b):.0f}-{max(b):.0f}): "
              f"{statistics.median(b) / statistics.median(a):.2f}x; same tokens: {same}")
        if not args.no_profile:
            pr = cProfile.Profile()
            pr.enable(); engine(); pr.disable()
            pstats.Stats(pr).sort_stats("cumulative").print_stats(14)


if __name__ == "__main__":
    main()
