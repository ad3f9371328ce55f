"""Load generator: loopback only, bounded, summary numbers, and the CLI with --json."""

from __future__ import annotations

import json
import math

import pytest
import torch

from codex_lab.cli import main as cli_main
from codex_lab.nn.config import ModelConfig
from codex_lab.serve.loadtest import LoadReport, check_url, malformed_bodies
from codex_lab.nn.model import CodexModel
from codex_lab.serve.app import serve_in_background
from codex_lab.serve.router import ModelServer, ServerConfig



def test_loopback_only():
    assert check_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert check_url("http://localhost:1") == "http://localhost:1"
    for bad in ("http://10.0.0.2:8000", "http://example.com", "http://0.0.0.0:80"):
        with pytest.raises(ValueError, match="only targets this machine"):
            check_url(bad)


def test_summary_numbers():
    rep = LoadReport(ttft=[0.05, 0.08, 0.2, 0.09], tbt=[0.01, 0.03], ok=4, tokens=40, duration_s=2.0,
                     errors={"status 429": 1})
    s = rep.summary()
    assert s["ttft_share_under_100ms"] == 0.75 and s["tbt_share_under_20ms"] == 0.5
    assert s["tokens_per_s"] == 20.0 and s["errors"] == 1
    assert math.isclose(s["ttft_p50_ms"], 85.0)  # median of 50, 80, 90, 200 ms
    assert LoadReport().summary()["ttft_p95_ms"] is None


def test_malformed_bodies_cover_the_issue_cases():
    names = {n for n, _ in malformed_bodies("m", 128)}
    for must in ("invalid json", "missing prompt", "max_tokens 0", "max_tokens huge", "prompt too long",
                 "unknown model", "oversize body", "max_tokens string"):
        assert must in names


def _tiny_model(tokenizer) -> CodexModel:
    torch.manual_seed(0)
    return CodexModel(ModelConfig(vocab_size=tokenizer.vocab_size, d_model=64, n_layer=2, n_head=4,
                                  max_seq_len=128)).eval()


def _served(tokenizer):
    """A tiny model served in the background (``.url``; ``.stop()`` when done)."""
    srv = ModelServer(tokenizer, ServerConfig(model_name="tiny"))
    srv.add_version("v0001", _tiny_model(tokenizer))
    return serve_in_background(srv)


def test_cli_loadtest_json(small_tokenizer, capsys):
    bg = _served(small_tokenizer)
    try:
        assert cli_main(["loadtest", "--url", bg.url, "--concurrency", "2", "--requests", "4",
                         "--max-tokens", "4", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["requests_ok"] == 4 and out["errors"] == 0 and out["ttft_p95_ms"] > 0
        assert cli_main(["loadtest", "--url", "http://192.0.2.1:80"]) == 2  # refused, not sent
    finally:
        bg.stop()


def test_bench_serving_records(tmp_path, small_tokenizer):
    import argparse

    from codex_lab.course.benches import discover
    from codex_lab.runtime.mode import Mode
    from codex_lab.training.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "ck", _tiny_model(small_tokenizer), small_tokenizer)
    bench = discover()["serving"]
    rows = bench.run(argparse.Namespace(concurrency="1,2", requests=2, max_tokens=4, checkpoint=str(tmp_path / "ck"),
                                        threads=None, mode=Mode("fast")))
    assert [r["concurrency"] for r in rows] == [1, 2]
    assert all(r["requests"] == 2 and r["errors"] == 0 and r["ttft_p50_ms"] > 0 for r in rows)


def test_load_in_a_process_of_its_own(small_tokenizer):
    """The bench's clients run in another process (no shared interpreter lock with the
    server): the same summary comes back, and a failure in the child is raised here by name."""
    from codex_lab.serve.loadtest import run_load_in_process

    bg = _served(small_tokenizer)
    try:
        s = run_load_in_process(bg.url, concurrency=2, requests=4, max_tokens=4, progress=False)
        assert s["requests_ok"] == 4 and s["errors"] == 0 and s["ttft_p95_ms"] > 0 and s["tokens_per_s"] > 0
        assert "texts" not in s  # only when asked
        # the prompts in turn, each answer's text kept: every prompt once, then the first two again
        t = run_load_in_process(bg.url, concurrency=1, requests=5, max_tokens=4, progress=False, cycle_prompts=True,
                                prompts=["def f():", "x = 1", "import os"], with_texts=True)["texts"]
        assert sorted((p, len(ts)) for p, ts in t.items()) == [("def f():", 2), ("import os", 1), ("x = 1", 2)]
        assert t["def f():"][0] == t["def f():"][1]  # greedy: the same prompt, the same answer
    finally:
        bg.stop()
    with pytest.raises(RuntimeError, match="load test failed: ValueError: .*only targets this machine"):
        run_load_in_process("http://192.0.2.1:80", requests=1, progress=False)


def test_bench_serving_peer_without_llama_server_says_how_to_build_it(tmp_path, small_tokenizer, monkeypatch):
    import argparse

    from codex_lab.course.benches import discover
    from codex_lab.measure.llama_native import SERVER_HINT, find_llama_server
    from codex_lab.training.checkpoint import save_checkpoint

    monkeypatch.setenv("CODEX_LAB_LLAMA_CPP", str(tmp_path / "nothing-here"))
    monkeypatch.delenv("CODEX_LAB_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no llama-server on it here
    assert find_llama_server() is None and "build_llama_cpp.sh" in SERVER_HINT
    save_checkpoint(tmp_path / "ck", _tiny_model(small_tokenizer), small_tokenizer)
    rows = discover()["serving"].run(argparse.Namespace(concurrency="2", requests=2, max_tokens=4, rounds=1,
                                                        checkpoint=str(tmp_path / "ck"), threads=None, peer="llama.cpp"))
    assert rows[0] == {"impl": "llama_server", "skipped": SERVER_HINT}
    assert [(r["impl"], r["concurrency"]) for r in rows[1:]] == [("codex_lab_serve", 2)] and rows[1]["errors"] == 0


def test_bench_serving_against_a_real_llama_server(tmp_path, small_tokenizer):
    """With llama-server built (scripts/build_llama_cpp.sh): the same load on both servers in
    interleaved rounds, one row per server and level, the ratio on each (no timing asserted)."""
    import argparse

    from codex_lab.course.benches import discover
    from codex_lab.measure.llama_native import find_llama_server
    from codex_lab.training.checkpoint import save_checkpoint

    if find_llama_server() is None:
        pytest.skip("llama-server is not built (scripts/build_llama_cpp.sh)")
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package (pip install 'codex_lab[gguf]')")
    save_checkpoint(tmp_path / "ck", _tiny_model(small_tokenizer), small_tokenizer)
    rows = discover()["serving"].run(argparse.Namespace(concurrency="2", requests=2, max_tokens=4, rounds=2,
                                                        checkpoint=str(tmp_path / "ck"), threads=None, peer="llama.cpp"))
    assert sorted(r["impl"] for r in rows) == ["codex_lab_serve", "llama_server"]
    for r in rows:
        assert r["errors"] == 0 and r["requests"] == 2 and r["rounds"] == 2
        assert r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"]
        assert r["ratio_vs_llama_server"] == pytest.approx(
            next(x for x in rows if x["impl"] == "codex_lab_serve")["tokens_per_s"]
            / next(x for x in rows if x["impl"] == "llama_server")["tokens_per_s"])
    assert next(r for r in rows if r["impl"] == "llama_server")["llama_version"]  # what --version printed
    for r in rows:  # the answers were compared: under load, batched against alone, and across the servers
        assert r["answers_under_load"] == 4 and r["answers_batched"] == 6  # 3 batches of 2 hold the 5 prompts
        assert r["answers_compared"] == 5 and len(r["answers_differ"]) == 5 - r["answers_same_as_peer"]


def test_answer_checks_are_per_request_and_across_servers():
    """Batching must not change an answer (checked per request: swapped answers fail), and the
    two servers' answers are compared prompt by prompt, naming where they part."""
    from codex_lab.lessons.l07_serving.bench import answer_checks, consistent_answers

    alone = {"codex_lab_serve": {"a": ["1 2 3"], "b": ["x y"]}, "llama_server": {"a": ["1 2 3"], "b": ["x z"]}}
    batched = {"codex_lab_serve": {"a": ["1 2 3", "1 2 3"], "b": ["x y"]},
               "llama_server": {"a": ["1 2 3"], "b": ["x z"]}}
    got = answer_checks(alone, batched)
    assert (got["codex_lab_serve"]["answers_batched_same_as_alone"], got["codex_lab_serve"]["answers_batched"]) == (3, 3)
    assert got["codex_lab_serve"]["answers_same_as_peer"] == got["llama_server"]["answers_same_as_peer"] == 1
    assert got["codex_lab_serve"]["answers_compared"] == 2
    assert got["codex_lab_serve"]["answers_differ"] == {"b": 2}  # "x y" and "x z" part at character 2
    # the counterfactual: the batch swapped the two answers (the set of texts is unchanged)
    swapped = {**batched, "codex_lab_serve": {"a": ["x y"], "b": ["1 2 3"]}}
    assert answer_checks(alone, swapped)["codex_lab_serve"]["answers_batched_same_as_alone"] == 0
    # equal answers on both servers: nothing differs
    same = {**alone, "llama_server": alone["codex_lab_serve"]}
    assert answer_checks(same, batched)["llama_server"] == {"answers_batched_same_as_alone": 1, "answers_batched": 2,
                                                            "answers_same_as_peer": 2, "answers_compared": 2,
                                                            "answers_differ": {}}
    # a missing answer (an error on one server) is a difference at character 0
    assert answer_checks({**alone, "llama_server": {"a": ["1 2 3"]}}, batched)["codex_lab_serve"]["answers_differ"] == {"b": 0}
    assert consistent_answers([{"a": ["1", "1"]}, {"a": ["1"], "b": ["2"]}]) == (4, 4)
    assert consistent_answers([{"a": ["1", "1"]}, {"a": ["3"]}]) == (2, 3)
