"""Per-token overhead removed from decoding and serving, with the same output as before:
incremental detokenisation equals a full decode (multi-byte characters split across
tokens, stray bytes, special tokens, a real U+FFFD), the engine's incremental text path
gives the same tokens, deltas, stop cuts, logprobs and finish reasons as the full-decode
reference, and the server worker's batched token events arrive in the same order as the
per-token ones."""

import asyncio
import random

import pytest
import torch

from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.sampling import SamplingParams
from codex_lab.infer.engine.output import IncrementalText
from codex_lab.nn.model import CodexModel

from conftest import tiny_config


def _byte_ids(tok) -> list[int]:
    """Id of the single-byte token of every byte 0..255 (GPT-2's byte-to-character table)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, (chr(c) for c in cs)))
    return [tok.token_id(table[b]) for b in range(256)]


def _random_ids(tok, rng: random.Random, n: int) -> list[int]:
    """Random ids mixing whole tokens, multi-byte characters split into single-byte tokens,
    stray continuation / lead bytes (invalid UTF-8), special tokens and encoded text."""
    byte = _byte_ids(tok)
    ids: list[int] = []
    while len(ids) < n:
        kind = rng.randrange(6)
        if kind == 0:
            ids.append(rng.randrange(tok.vocab_size))
        elif kind == 1:  # a 2-, 3- or 4-byte character, one token per byte
            ch = rng.choice(["é", "€", "你", "😀", "\u0394", "\U0001f600"])
            ids.extend(byte[b] for b in ch.encode("utf-8"))
        elif kind == 2:  # a bad byte: continuation without a lead, or a lead cut short
            ids.append(byte[rng.choice([0x80, 0xA9, 0xBF, 0xC3, 0xE2, 0xF0, 0xFF])])
        elif kind == 3:
            ids.append(rng.choice([tok.eot_id, tok.pad_id]))
        elif kind == 4:  # text that holds a real U+FFFD and non-ASCII characters
            ids.extend(tok.encode(rng.choice(["a\ufffdb", "x = 'é€'\n", "\ufffd", "def f():\n    return 1"])))
        else:
            ids.extend(tok.encode(" " + "".join(rng.choice("ab_(): \n") for _ in range(rng.randrange(1, 6)))))
    return ids


@pytest.mark.parametrize("seed", range(6))
def test_incremental_text_equals_full_decode_on_every_prefix(small_tokenizer, seed):
    tok = small_tokenizer
    ids = _random_ids(tok, random.Random(seed), 120)
    inc = IncrementalText(tok.decode)
    for n in range(len(ids) + 1):
        assert inc.text(ids[:n]) == tok.decode(ids[:n]), (seed, n, ids[:n][-6:])
    assert inc.k > 0  # the kept head was used, not a full decode every time


def test_incremental_text_split_character_and_restart(small_tokenizer):
    tok = small_tokenizer
    byte = _byte_ids(tok)
    ids = tok.encode("x = ") + [byte[b] for b in "😀".encode("utf-8")] + tok.encode("!")
    inc = IncrementalText(tok.decode)
    texts = [inc.text(ids[:n]) for n in range(1, len(ids) + 1)]
    assert texts == [tok.decode(ids[:n]) for n in range(1, len(ids) + 1)]
    assert texts[-1] == "x = 😀!" and texts[-3].endswith("\ufffd")  # incomplete while its bytes arrive
    other = tok.encode("print(1)")  # not an extension of the previous list: starts over
    assert inc.text(other) == "print(1)"


def _model(tok) -> CodexModel:
    torch.manual_seed(0)
    return CodexModel(tiny_config(vocab_size=tok.vocab_size)).eval()


def _run(model, tok, incremental: bool, prompts, params):
    eng = Engine(model, tok, max_batch_size=4, block_size=8)
    eng.incremental_text = incremental
    deltas: dict[int, list[tuple[int, str]]] = {}
    lps: dict[int, list] = {}
    for i, (p, sp) in enumerate(zip(prompts, params)):
        lps[i] = []
        eng.submit(p, sp, on_token=lambda t, d, i=i: deltas.setdefault(i, []).append((t, d)), logprobs=lps[i])
    done = sorted(eng.run_until_done(), key=lambda f: f.rid)
    return [(f.output_ids, f.text, f.finish_reason) for f in done], deltas, {
        i: [tuple(x) for x in v] for i, v in lps.items()}


def test_engine_incremental_text_same_as_full_decode(small_tokenizer):
    tok = small_tokenizer
    model = _model(tok)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, tok.vocab_size, (n,), generator=g).tolist() for n in (5, 9, 3, 12, 7, 4)]
    free = [SamplingParams(max_tokens=24, temperature=1.0, seed=i, ignore_eos=True) for i in range(6)]
    ref, _, _ = _run(model, tok, False, prompts, free)
    # stop strings that span token boundaries: 3 characters around the middle of each output
    stops = []
    for ids, text, _ in ref:
        cut = len(tok.decode(ids[: len(ids) // 2]))
        stops.append([text[max(cut - 1, 0): cut + 2]] if len(text) > cut + 2 else [])
    assert any(stops), "no output long enough to hold a stop string"
    params = [SamplingParams(max_tokens=24, temperature=[1.0, 0.0][i % 2], seed=i, stop=stops[i],
                             logprobs=2, ignore_eos=i < 3) for i in range(6)]
    want = _run(model, tok, False, prompts, params)
    got = _run(model, tok, True, prompts, params)
    assert got == want  # tokens, text, finish reasons; every (token, delta); every logprob
    assert any(r == "stop" for _, _, r in want[0])  # the stop strings did cut


def test_worker_batched_events_same_as_per_token(small_tokenizer):
    from codex_lab.serve.protocol import CompletionRequest
    from codex_lab.serve.worker import EngineWorker, Live

    tok = small_tokenizer
    model = _model(tok)

    async def serve(batch: bool) -> tuple[list[list[tuple]], int]:
        loop = asyncio.get_running_loop()
        calls = 0
        real = loop.call_soon_threadsafe

        def counting(*a, **kw):  # how often the engine thread wakes the event loop
            nonlocal calls
            calls += 1
            return real(*a, **kw)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        worker = EngineWorker("v", model, tok, max_batch_size=4)
        worker.batch_events = batch
        lives = []
        try:
            for i in range(4):
                req = CompletionRequest(prompt_ids=tok.encode(f"def f{i}(x):"), max_tokens=12)
                live = Live(loop, req, SamplingParams(max_tokens=12, temperature=0.8, seed=i, ignore_eos=True), 30.0)
                lives.append(live)
                worker.submit(live)
            out = []
            for live in lives:
                events = []
                while True:
                    kind, val = await asyncio.wait_for(live.events.get(), 30)
                    events.append((kind, val.output_ids if kind == "done" else val if kind == "token" else None))
                    if kind in ("done", "error"):
                        break
                assert len(live.token_times) == 12
                out.append(events)
        finally:
            worker.close()
        return out, calls

    per_token, n_single = asyncio.run(serve(False))
    batched, n_batched = asyncio.run(serve(True))
    assert batched == per_token
    assert all(ev[-1][0] == "done" and len(ev) == 1 + 12 + 1 for ev in batched)  # accepted, 12 tokens, done
    # 4 requests x 12 tokens: per token 48 wake-ups (+ accepted, done); batched at most one per step
    assert n_batched < n_single, (n_batched, n_single)
