"""The llama.cpp peer (codex_lab.measure.peer_llamacpp).

Without llama.cpp: the scenario says how to install it and skips. The plumbing (the Node.js
program's line protocol, timing, token comparison, ratios) is held against a stand-in
``node-llama-cpp`` module whose "model" continues every sequence with a known rule, so the
test can say which tokens must come back. With the real package installed
(``scripts/get_llama_cpp.sh``), llama.cpp on the exported GGUF must give FastDecoder's greedy
tokens. No timing is asserted (benchmarks only)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from codex_lab.measure import peer_llamacpp as peer
from conftest import seeded_model

needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed (apt-get install nodejs)")

# the stand-in: next token = (last * 7 + 3) % 50, after whatever the sequence holds
FAKE = r"""
export const LlamaLogLevel = {error: "error"};
export async function getLlama() {
  return {llamaCppRelease: {release: "stand-in"}, buildType: "prebuilt", gpu: false,
    async loadModel({modelPath}) {
      return {async createContext({threads, sequences}) {
        let left = sequences;
        return {currentThreads: threads, getSequence() {
          if (left-- <= 0) throw new Error("no sequences left");  // as node-llama-cpp: one per slot
          let hist = [];  // each sequence its own history
          return {
            async clearHistory() { hist = []; },
            async evaluateWithoutGeneratingNewTokens(t) { hist.push(...t); },
            async *evaluate(t) { hist.push(...t); for (;;) { const n = (hist[hist.length - 1] * 7 + 3) % 50; hist.push(n); yield n; } },
          };
        }};
      }};
    }};
}
"""


def _rule(prompt: list[int], n: int) -> list[int]:
    out, last = [], prompt[-1]
    for _ in range(n):
        last = (last * 7 + 3) % 50
        out.append(last)
    return out


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    pkg = tmp_path / "node_modules" / "node-llama-cpp"
    pkg.mkdir(parents=True)
    (pkg / "package.json").write_text(json.dumps({"name": "node-llama-cpp", "version": "0.0.0-stand-in",
                                                  "type": "module", "exports": "./index.js"}))
    (pkg / "index.js").write_text(FAKE)
    monkeypatch.setenv("CODEX_LAB_LLAMA_CPP", str(tmp_path))
    return tmp_path


def test_without_llama_cpp_the_scenario_says_how_to_install_and_skips(tmp_path, monkeypatch, small_tokenizer):
    monkeypatch.setenv("CODEX_LAB_LLAMA_CPP", str(tmp_path / "nothing-here"))
    assert peer.find_node_llama_cpp() is None
    rows = peer.bench_llama_cpp(seeded_model(small_tokenizer), small_tokenizer)
    assert rows == [{"scenario": "llama_cpp", "skipped": peer.INSTALL_HINT}]
    assert "scripts/get_llama_cpp.sh" in rows[0]["skipped"]
    with pytest.raises(FileNotFoundError, match="get_llama_cpp.sh"):
        peer.LlamaCppPeer(tmp_path / "m.gguf", threads=1, context=64)


@needs_node
def test_the_peer_protocol_returns_the_sequences_tokens_and_times(stand_in):
    with peer.LlamaCppPeer(stand_in / "any.gguf", threads=1, context=64) as p:
        assert p.info["llama_cpp_release"] == "stand-in" and p.info["node_llama_cpp"] == "0.0.0-stand-in"
        assert p.info["threads"] == 1
        for prompt in ([5, 9, 11], [2]):
            toks, secs = p.generate(prompt, 6)
            assert toks == _rule(prompt, 6) and secs >= 0  # the history was cleared between jobs
        assert p.prefill([1, 2, 3]) >= 0


@needs_node
def test_the_scenario_compares_tokens_and_reports_both_engines(stand_in, small_tokenizer):
    model = seeded_model(small_tokenizer)
    rows = peer.bench_llama_cpp(model, small_tokenizer, prompt_lens=(16, 32), new_tokens=8, rounds=2, compile=False)
    assert sorted((r["impl"], r["prompt_len"]) for r in rows) == [
        ("codex_lab_fast_decode", 16), ("codex_lab_fast_decode", 32), ("llama_cpp", 16), ("llama_cpp", 32)]
    prompts = peer.corpus_prompts(small_tokenizer, (16, 32))
    from codex_lab.infer.fast_decode import FastDecoder

    for r in rows:
        assert r["decode_min"] <= r["decode_tokens_per_s"] <= r["decode_max"] and r["rounds"] == 2
        assert r["prefill_min"] <= r["prefill_tokens_per_s"] <= r["prefill_max"]
        # every round kept beside the median; each row states its KV cache's precision
        assert len(r["decode_rounds"]) == 2 and min(r["decode_rounds"]) == r["decode_min"]
        assert r["kv_cache"] == ("f32" if r["impl"] == "codex_lab_fast_decode" else "f16 (node-llama-cpp's default)")
        assert r["decode_ratio_vs_llama_cpp"] == pytest.approx(
            r["decode_tokens_per_s"] / next(x for x in rows if x["impl"] == "llama_cpp"
                                             and x["prompt_len"] == r["prompt_len"])["decode_tokens_per_s"])
        ours = FastDecoder(model, max_len=40, compile=False).generate(prompts[r["prompt_len"]], 8)[0]
        theirs = _rule(prompts[r["prompt_len"]], 8)
        if r["impl"] == "llama_cpp":  # the stand-in's rule, compared with what FastDecoder gave
            assert r["same_tokens"] == (theirs == ours) and r["llama_llama_cpp_release"] == "stand-in"
            want = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), 8)
            assert r["common_prefix"] == want
        else:
            assert r["same_tokens"] and r["common_prefix"] == 8
            # each length's decoder holds its run, prompt + new tokens (as llama-bench sizes its context)
            assert r["cache_slots"] == r["prompt_len"] + 8


@needs_node
def test_q8_0_runs_the_int8_copy_against_the_q8_0_export_and_says_so(stand_in, small_tokenizer, monkeypatch):
    """--peer-precision q8_0: the exported file is Q8_0, FastDecoder decodes the weight-only int8 copy
    (its tokens are that copy's, not the float model's), and each row names its weights' format."""
    import codex_lab.hf.gguf_export as ge
    from codex_lab.infer.fast_decode import FastDecoder
    from codex_lab.nn.int8 import quantize_int8

    asked = []
    real = ge.export_gguf
    monkeypatch.setattr(ge, "export_gguf", lambda *a, **kw: (asked.append(kw.get("gguf_type")), real(*a, **kw))[1])
    model = seeded_model(small_tokenizer)
    rows = peer.bench_llama_cpp(model, small_tokenizer, prompt_lens=(16,), new_tokens=8, rounds=1, compile=False,
                                precision="q8_0")
    assert asked == ["q8_0"]
    ours = next(r for r in rows if r["impl"] == "codex_lab_fast_decode")
    theirs = next(r for r in rows if r["impl"] == "llama_cpp")
    assert ours["precision"].startswith("int8") and theirs["precision"].startswith("Q8_0")
    prompt = peer.corpus_prompts(small_tokenizer, (16,))[16]
    int8_tokens = FastDecoder(quantize_int8(model)[0], max_len=24, compile=False).generate(prompt, 8)[0]
    # llama.cpp's tokens are compared with the int8 copy's (the stand-in's rule against what the copy decodes)
    assert theirs["same_tokens"] == (int8_tokens == _rule(prompt, 8))
    assert theirs["common_prefix"] == next((i for i, (a, b) in enumerate(zip(int8_tokens, _rule(prompt, 8))) if a != b), 8)
    with pytest.raises(ValueError, match="precision='f16'"):
        peer.bench_llama_cpp(model, small_tokenizer, prompt_lens=(16,), new_tokens=8, rounds=1, compile=False,
                             precision="f16")


@needs_node
def test_streams_run_one_prompt_per_sequence_and_refuse_more_than_the_slots(stand_in):
    prompts = [[5, 9, 11], [2], [40, 41], [7]]
    with peer.LlamaCppPeer(stand_in / "any.gguf", threads=1, context=64, sequences=4) as p:
        toks, secs = p.streams(prompts, 5)
        assert toks == [_rule(q, 5) for q in prompts] and secs >= 0  # each stream continued its own prompt
        toks, _ = p.streams(prompts[:2], 3)  # fewer prompts than slots; histories cleared between jobs
        assert toks == [_rule(q, 3) for q in prompts[:2]]
        with pytest.raises(ValueError, match="5 prompts for a context of 4 sequences"):
            p.streams(prompts + [[1]], 3)
    with pytest.raises(ValueError, match="sequences must be >= 1"):
        peer.LlamaCppPeer(stand_in / "any.gguf", threads=1, context=64, sequences=0)


@needs_node
def test_the_streams_scenario_reports_both_engines_and_compares_every_stream(stand_in, small_tokenizer):
    model = seeded_model(small_tokenizer)
    rows = peer.bench_llama_cpp_streams(model, small_tokenizer, streams=3, prompt_len=12, new_tokens=6, rounds=2,
                                        compile=False)
    assert [r["impl"] for r in rows] == ["codex_lab_engine", "llama_cpp"]
    prompts = peer.stream_prompts(small_tokenizer, 3, 12)
    assert len({tuple(q) for q in prompts}) == 3 and all(len(q) == 12 for q in prompts)
    from codex_lab.infer.fast_decode import FastDecoder

    # the engine's greedy tokens are FastDecoder's; the stand-in's are its rule: count the streams that agree
    ours = [FastDecoder(model, max_len=18, compile=False).generate(q, 6)[0] for q in prompts]
    theirs = [_rule(q, 6) for q in prompts]
    same = sum(a == b for a, b in zip(ours, theirs))
    prefix = min(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), 6) for a, b in zip(ours, theirs))
    for r in rows:
        assert r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"] and r["rounds"] == 2
        assert r["same_streams"] == same and r["shortest_common_prefix"] == prefix and r["streams"] == 3
        assert r["ratio_vs_llama_cpp"] == pytest.approx(rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"])
    assert rows[1]["llama_llama_cpp_release"] == "stand-in"


def test_without_llama_cpp_the_streams_scenario_skips_with_the_install_hint(tmp_path, monkeypatch, small_tokenizer):
    monkeypatch.setenv("CODEX_LAB_LLAMA_CPP", str(tmp_path / "nothing-here"))
    rows = peer.bench_llama_cpp_streams(seeded_model(small_tokenizer), small_tokenizer)
    assert rows == [{"scenario": "llama_cpp_streams", "skipped": peer.INSTALL_HINT}]


@pytest.mark.skipif(peer.find_node_llama_cpp() is None, reason="llama.cpp not installed (scripts/get_llama_cpp.sh)")
def test_real_llama_cpp_decodes_the_exported_gguf_as_fast_decoder(tmp_path, small_tokenizer):
    from codex_lab.hf.gguf_export import export_gguf
    from codex_lab.infer.fast_decode import FastDecoder

    torch.manual_seed(0)
    model = seeded_model(small_tokenizer)
    gguf = export_gguf(model, small_tokenizer, tmp_path / "m.gguf", gguf_type="f32")
    prompts = peer.corpus_prompts(small_tokenizer, (24, 48))
    with peer.LlamaCppPeer(gguf, threads=1, context=128) as p:
        for prompt in prompts.values():
            ours = FastDecoder(model, max_len=80, compile=False).generate(prompt, 16)[0]
            theirs, _ = p.generate(prompt, 16)
            assert theirs == ours
    with peer.LlamaCppPeer(gguf, threads=1, context=80, sequences=2) as p:  # two streams batched by llama.cpp
        theirs, _ = p.streams(list(prompts.values()), 16)
        assert theirs == [FastDecoder(model, max_len=80, compile=False).generate(q, 16)[0] for q in prompts.values()]


def test_the_report_quotes_the_recorded_peer_run_or_says_how_to_measure_it():
    from codex_lab.course.bench_figures import bench_record
    from codex_lab.lessons.l06_inference.report import peer_lines

    assert "not recorded" in peer_lines({}) and "get_llama_cpp.sh" in peer_lines({})
    rec = bench_record()["llama_cpp"]
    text = peer_lines({"llama_cpp": rec})
    assert f"recorded {rec['measured']}, not this run" in text
    eng = next(r for r in rec["rows"] if r["scenario"] == "llama_cpp_streams" and r["impl"] == "codex_lab_engine")
    assert f"{eng['ratio_vs_llama_cpp']:.2f}x; streams with the same tokens: {eng['same_streams']} of 8" in text
    without = {**rec, "rows": [r for r in rec["rows"] if r["scenario"] == "llama_cpp"]}  # an older record
    assert "8 streams at once: not in this record" in peer_lines({"llama_cpp": without})
    assert "over HTTP: not recorded" in text and "build_llama_cpp.sh" in text  # no server record given
    srv = bench_record()["serving_llama_cpp"]
    both = peer_lines({"llama_cpp": rec, "serving_llama_cpp": srv})
    for r in srv["rows"]:
        if r["impl"] == "codex_lab_serve":
            assert (f"{r['concurrency']} client(s) over HTTP" in both
                    and f"{r['tokens_per_s']:.0f} tokens/s" in both and f"{r['ratio_vs_llama_server']:.2f}x" in both)
    for r in rec["rows"]:
        if r["impl"] == "codex_lab_fast_decode":
            assert f"after a {r['prompt_len']}-token prompt" in text
            assert f"{r['decode_ratio_vs_llama_cpp']:.2f}x; prefill {r['prefill_ratio_vs_llama_cpp']:.2f}x" in text
            if "decode_ratio_vs_llama_native" in r:  # llama.cpp built from source, in the same rounds
                assert f"FastDecoder {r['decode_ratio_vs_llama_native']:.2f}x its decode" in text
    assert "built from source here" in text  # the shipped record has the source build's rows


def test_the_single_stream_record_prints_each_engine_and_its_split_or_says_how_to_measure_it():
    from codex_lab.lessons.l06_inference.report import single_stream_lines

    assert "not recorded" in single_stream_lines({}) and "--scenarios single_stream" in single_stream_lines({})
    base = {"scenario": "single_stream", "prompt_len": 128, "new_tokens": 128, "rounds": 3, "threads": 1,
            "same_tokens": True, "tokens_per_s_min": 1.0, "tokens_per_s_max": 2000.0}
    rec = {"measured": "2026-01-01", "command": "codex-lab bench inference --scenarios single_stream --json", "conditions": "quiet",
           "rows": [{**base, "impl": "fast_decode", "slots": 1, "tokens_per_s": 1000.0, "vs_fast_decode": 1.0,
                     "ms_per_token": 1.0},
                    {**base, "impl": "engine_solo", "slots": 8, "tokens_per_s": 400.0, "vs_fast_decode": 0.4,
                     "step_ms_per_token": 2.0, "other_ms_per_token": 0.5},
                    {**base, "impl": "engine_padded", "slots": 8, "tokens_per_s": 200.0, "vs_fast_decode": 0.2,
                     "step_ms_per_token": 4.5, "other_ms_per_token": 0.5},
                    {**base, "impl": "serve_http", "slots": 8, "tokens_per_s": 250.0, "vs_fast_decode": 0.25,
                     "http_ms_per_token": 1.5}]}
    text = single_stream_lines({"single_stream": rec})
    assert "recorded 2026-01-01, not this run" in text and "FastDecoder 1000 tokens/s" in text
    assert "what `codex-lab serve` runs), 8 slots: 400 tokens/s (1-2000), 0.40x FastDecoder; per token 2.00 ms" in text
    assert "padded to its slots, 8 slots: 200 tokens/s (1-2000), 0.20x FastDecoder; per token 4.50 ms" in text
    assert "over HTTP (a streaming client in a process of its own): 250 tokens/s (1-2000), 0.25x FastDecoder" in text
    assert "add 1.50 ms per token over the engine in process" in text
    # a record from before the HTTP row still prints
    old = {**rec, "rows": rec["rows"][:3]}
    assert "over HTTP" not in single_stream_lines({"single_stream": old})


def test_the_single_stream_scenario_times_each_engine_with_the_same_tokens(small_tokenizer):
    from codex_lab.measure.single_stream import bench_single_stream

    rows = bench_single_stream(seeded_model(small_tokenizer), small_tokenizer, slots=3, new_tokens=6, prompt_len=16,
                               rounds=2, compile=False)
    assert [r["impl"] for r in rows] == ["fast_decode", "engine_solo", "engine_padded", "serve_http", "serve_http_process"]
    for r in rows:  # the engines gave FastDecoder's greedy tokens in every round
        assert r["same_tokens"] and r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"]
        assert r["rounds"] == 2 and r["new_tokens"] == 6
    assert rows[0]["vs_fast_decode"] == 1.0 and rows[0]["ms_per_token"] > 0
    for r in rows[1:3]:  # the engine's time per token, split: the model step and the loop around it
        assert r["step_ms_per_token"] > 0 and r["other_ms_per_token"] > 0 and r["slots"] == 3
    # through HTTP (a client process of its own): what it adds per token over the engine in process
    for http in rows[3:]:  # the engine on the server's thread, and in a process of its own
        assert http["http_ms_per_token"] == pytest.approx(1000 / http["tokens_per_s"] - 1000 / rows[1]["tokens_per_s"])


def test_a_source_built_llama_bench_runs_in_the_same_rounds(stand_in, small_tokenizer, tmp_path, monkeypatch):
    """Where llama.cpp is built from source, its llama-bench runs in every round beside the others:
    prefill from an empty cache, decode after the prompt in the cache; its rows carry speeds only
    (no tokens: same_tokens None), and FastDecoder's rows get the ratios to it."""
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "llama-bench"
    fake.write_text(f"""#!/usr/bin/env python3
import json, sys
a = sys.argv[1:]
open({str(calls)!r}, "a").write(" ".join(a) + "\\n")
gen = int(a[a.index("-n") + 1])
print(json.dumps([{{"avg_ts": 1000.0 if gen else 5000.0, "build_commit": "abc123", "cpu_info": "stand-in CPU"}}]))
""")
    fake.chmod(0o755)
    monkeypatch.setenv("CODEX_LAB_LLAMA_BENCH", str(fake))
    rows = peer.bench_llama_cpp(seeded_model(small_tokenizer), small_tokenizer, prompt_lens=(16,), new_tokens=8,
                                rounds=2, compile=False)
    native = next(r for r in rows if r["impl"] == "llama_cpp_native")
    assert native["decode_tokens_per_s"] == 1000.0 and native["prefill_tokens_per_s"] == 5000.0
    assert native["same_tokens"] is None and native["llama_build_commit"] == "abc123" and native["build_type"] == "source"
    ours = next(r for r in rows if r["impl"] == "codex_lab_fast_decode")
    assert ours["decode_ratio_vs_llama_native"] == pytest.approx(ours["decode_tokens_per_s"] / 1000.0)
    assert ours["prefill_ratio_vs_llama_native"] == pytest.approx(ours["prefill_tokens_per_s"] / 5000.0)
    lines = calls.read_text().splitlines()  # two tests per round: prefill of 16, then 8 tokens at depth 16
    assert len(lines) == 4 and "-p 16 -n 0 -d 0" in lines[0] and "-p 0 -n 8 -d 16" in lines[1]


def test_the_report_prints_every_recorded_variant_of_the_peer_run_and_the_restart_record():
    from codex_lab.course.bench_figures import bench_record
    from codex_lab.lessons.l06_inference.report import restart_lines, peer_lines

    rec = bench_record()["llama_cpp"]
    variant = {**rec, "command": "codex-lab bench inference --peer llama.cpp --threads 2 --json",
               "rows": [{**r, "decode_tokens_per_s": 2 * r["decode_tokens_per_s"]} if r.get("impl") == "codex_lab_fast_decode"
                        else r for r in rec["rows"]]}
    text = peer_lines({"llama_cpp": rec, "llama_cpp_2threads": variant})
    assert "- F32, 2 threads each (recorded" in text and "--threads 2 --json" in text
    for r in variant["rows"]:
        if r.get("scenario") == "llama_cpp" and r["impl"] == "codex_lab_fast_decode":
            assert f"after {r['prompt_len']} tokens FastDecoder {r['decode_tokens_per_s']:.0f} tokens/s" in text
    assert "8-bit" not in text  # no such record given: no line
    srv = bench_record()["serving_llama_cpp"]
    both = peer_lines({"llama_cpp": rec, "serving_llama_cpp_process": srv})
    assert "over HTTP, the engine in a process of its own" in both and "over HTTP: not recorded" not in both

    assert "not recorded" in restart_lines({}) and "restart_time.py" in restart_lines({})
    restart = {"measured": "2026-01-01", "command": "python scripts/restart_time.py --json", "conditions": "quiet",
               "rows": [{"scenario": "restart", "run": "cold", "loaded_s": 4.0, "ready_s": 61.5, "graphs": "3/3"},
                        {"scenario": "restart", "run": "warm", "loaded_s": 3.8, "ready_s": 5.2, "graphs": "3/3"}]}
    text = restart_lines({"restart": restart})
    assert "cold (an empty compile cache: the graphs built)" in text and "after 61.5 s" in text
    assert "warm (the same cache: the graphs loaded)" in text and "after 5.2 s" in text


def test_the_serving_records_answers_are_printed_and_an_older_record_prints_none():
    """Lesson 06 prints the answer checks of a serving record against llama-server: equal texts,
    where they part, batched against alone, under load (a record without them prints no line)."""
    from codex_lab.course.bench_figures import bench_record
    from codex_lab.lessons.l06_inference.report import answers_line, peer_lines

    ours = {"answers_same_as_peer": 4, "answers_compared": 5, "answers_differ": {"def add(a, b):\n": 17},
            "answers_batched_same_as_alone": 8, "answers_batched": 8, "answers_consistent": 254, "answers_under_load": 256}
    theirs = {**ours, "answers_batched_same_as_alone": 7, "answers_consistent": 256}
    line = answers_line(ours, theirs, 8)
    assert "the same text on 4 of 5 prompts (they part: 'def add(a, b):\\n' from character 17)" in line
    assert "8 of 8 of `codex-lab serve`'s answers as they were alone, 7 of 8 of llama-server's" in line
    assert "under load at 8 clients 254 of 256 and 256 of 256" in line
    assert "they part" not in answers_line({**ours, "answers_same_as_peer": 5, "answers_differ": {}}, theirs, 8)
    rows = [{"impl": impl, "concurrency": 8, "tokens_per_s": 10.0, "tokens_per_s_min": 9.0, "tokens_per_s_max": 11.0,
             "ratio_vs_llama_server": 1.0} for impl in ("codex_lab_serve", "llama_server")]
    rec = {"measured": "2026-01-01", "command": "codex-lab bench serving --peer llama.cpp", "rows": rows}
    peer = bench_record()["llama_cpp"]
    older = peer_lines({"llama_cpp": peer, "serving_llama_cpp": rec})
    assert "8 client(s) over HTTP" in older and "- answers" not in older  # an older record: no checks, no line
    rows = [{**rows[0], **ours}, {**rows[1], **theirs}]
    assert line in peer_lines({"llama_cpp": peer, "serving_llama_cpp": {**rec, "rows": rows}})
