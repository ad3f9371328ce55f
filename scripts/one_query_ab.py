"""FastDecoder's decode step with its one-query attention against ATen's flash attention (SDPA):
milliseconds per decode step in interleaved rounds, and whether both give the same greedy tokens
(docs/PROFILE.md, "The one-query attention, adopted").

    python scripts/one_query_ab.py [--prompt 128] [--rounds 11]

The shipped model, compiled with FastDecoder's default options, one math thread; each round times
127 decode steps after the prompt's (unsampled) prefill, the two decoders alternating. A quiet
machine only.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (held-out corpus code)")
    ap.add_argument("--new", type=int, default=128, help="tokens generated per round")
    ap.add_argument("--rounds", type=int, default=11, help="interleaved rounds")
    args = ap.parse_args()

    import torch

    from codex_lab.infer.fast_decode import FastDecoder, graphs_compiled
    from codex_lab.measure.models import load_model_and_tokenizer
    from codex_lab.measure.peer_llamacpp import corpus_prompts

    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    model, tok = load_model_and_tokenizer()
    L, N = args.prompt, args.new
    prompt = corpus_prompts(tok, [L])[L]
    decs = {a: FastDecoder(model, max_len=L + N, attention=a) for a in ("sdpa", "one_query")}
    outs = {a: d.generate(prompt, N)[0] for a, d in decs.items()}  # compiles (tens of seconds each)
    ids = torch.tensor([prompt])
    graphs = graphs_compiled()  # both decoders compiled; any graph after this is a recompile

    def steps(d: FastDecoder) -> float:
        nxt, pos = d.prefill(ids)  # eager, untimed
        t0 = time.perf_counter()
        for _ in range(N - 1):
            nxt = d.decode_step(nxt[:, None], pos)
            pos += 1
        return 1000.0 * (time.perf_counter() - t0) / (N - 1)

    ms: dict[str, list[float]] = {a: [] for a in decs}
    for _ in range(args.rounds):  # interleaved: a slower minute falls on both
        for a, d in decs.items():
            ms[a].append(steps(d))
    print(f"prompt {L}, {N} tokens, same tokens: {outs['sdpa'] == outs['one_query']}, "
          f"graphs compiled during the rounds: {graphs_compiled() - graphs}")
    for a, v in ms.items():
        print(f"{a:10s} ms/step median {statistics.median(v):.3f} (range {min(v):.3f}-{max(v):.3f})")
    per = [b / a for a, b in zip(ms["sdpa"], ms["one_query"])]
    print(f"one_query / sdpa per round: {', '.join(f'{r:.2f}' for r in per)} "
          f"({sum(r < 1 for r in per)} of {len(per)} below 1)")


if __name__ == "__main__":
    main()
