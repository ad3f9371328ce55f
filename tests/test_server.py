"""The real server on a loopback port: the official openai client, raw HTTP, bad input,
deadlines, disconnects, the queue bound, and /metrics parsed with prometheus_client."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.sampling import SamplingParams
from codex_lab.infer.generate import generate_ids
from codex_lab.serve.loadtest import malformed_bodies, malformed_storm, run_load
from codex_lab.serve.metrics import parse_metrics
from codex_lab.serve.app import serve_in_background
from codex_lab.serve.router import ModelServer, ServerConfig
from serving_helpers import make_model, wait_idle
from codex_lab.serve.security import check_loopback

NAME = "tiny"



@pytest.fixture(scope="module")
def served(small_corpus):
    from codex_lab.data.tokenizer import train_tokenizer

    tok = train_tokenizer(small_corpus.texts("train")[:10], vocab_size=400)
    model = make_model(tok.vocab_size)
    srv = ModelServer(tok, ServerConfig(model_name=NAME, max_batch_size=4, max_waiting=8, deadline_s=30.0))
    srv.add_version("v0001", model)
    bg = serve_in_background(srv)
    yield bg, srv, tok, model
    bg.stop()


def test_openai_client_plain_and_streaming_match_reference(served):
    bg, srv, tok, model = served
    client = openai.OpenAI(base_url=bg.url + "/v1", api_key="unused", max_retries=0)
    prompt = "def add(a, b):\n"
    ref_ids, _ = generate_ids(model, tok.encode(prompt), max_new_tokens=12, eos_id=tok.eot_id)
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0)
    assert r.choices[0].text == tok.decode(ref_ids)  # greedy server output == the plain generator
    assert r.usage.prompt_tokens == len(tok.encode(prompt))
    assert r.usage.completion_tokens == len(ref_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].finish_reason in ("length", "stop")
    chunks = list(client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert len(chunks) >= 3
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    # OpenAI's include_usage: the last chunk has no choices and the usage; the one before it ends
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason
    assert all(c.usage is None for c in chunks[:-1])
    plain = list(client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0, stream=True))
    assert all(c.usage is None for c in plain) and plain[-1].choices[0].finish_reason == r.choices[0].finish_reason
    ids = [m.id for m in client.models.list().data]
    assert ids == [NAME, f"{NAME}@v0001"]
    assert client.models.retrieve(f"{NAME}@v0001").id == f"{NAME}@v0001"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_sse_wire_format_ends_with_done(served):
    bg, *_ = served
    with httpx.stream("POST", bg.url + "/v1/completions",
                      json={"model": NAME, "prompt": "x = ", "max_tokens": 5, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert all(e["object"] == "text_completion" and "usage" not in e for e in events)
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]] == [None] * (len(events) - 1)
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_seeded_sampling_is_reproducible_and_stop_cuts(served):
    bg, *_ = served
    body = {"model": NAME, "prompt": "import os\n", "max_tokens": 10, "temperature": 1.0, "seed": 7}
    a = httpx.post(bg.url + "/v1/completions", json=body).json()["choices"][0]["text"]
    b = httpx.post(bg.url + "/v1/completions", json=body).json()["choices"][0]["text"]
    assert a == b
    if len(a) > 2:  # stop at a piece of that same text: the answer is cut before it
        stop = a[2:4] if a[2:4].strip() else a[2]
        c = httpx.post(bg.url + "/v1/completions", json={**body, "stop": [stop]}).json()["choices"][0]
        assert c["finish_reason"] == "stop" and stop not in c["text"] and a.startswith(c["text"])


@pytest.mark.parametrize("name,body", malformed_bodies(NAME, 256), ids=[n for n, _ in malformed_bodies(NAME, 256)])
def test_malformed_request_gets_openai_4xx(served, name, body):
    bg, *_ = served
    r = httpx.post(bg.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:200])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    expected = {"unknown model": 404, "unknown version": 404, "oversize body": 413}.get(name, 400)
    assert r.status_code == expected, (name, r.text[:200])


def test_wrong_route_and_method_are_openai_shaped(served):
    bg, *_ = served
    for r in (httpx.get(bg.url + "/v1/completions"), httpx.post(bg.url + "/v1/chat/nope", json={})):
        assert r.status_code in (404, 405) and "message" in r.json()["error"]


def test_storm_of_malformed_requests_no_crash(served):
    bg, srv, *_ = served
    rep = malformed_storm(bg.url, n=60)
    assert rep["server_errors"] == 0 and rep["non_4xx"] == 0, rep
    assert rep["bad_error_shape"] == [] and rep["healthy_after"], rep
    ok = httpx.post(bg.url + "/v1/completions", json={"model": NAME, "prompt": "a", "max_tokens": 2})
    assert ok.status_code == 200


def test_disconnect_mid_stream_frees_slot(served):
    bg, srv, tok, model = served
    # a prompt whose greedy continuation never ends by itself within 200 tokens
    cands = ("def f():\n", "x = 1\n", "import os\n", "class A:\n", "a")
    eng = Engine(model, tok)
    rids = [eng.submit(tok.encode(p), SamplingParams(max_tokens=200)) for p in cands]
    reasons = {f.rid: f.finish_reason for f in eng.run_until_done()}
    prompt = next((p for p, rid in zip(cands, rids) if reasons[rid] == "length"), None)
    assert prompt is not None, "every candidate prompt hits end-of-text; change the model seed"
    slow = ModelServer(tok, ServerConfig(model_name=NAME))
    slow.add_version("v0001", model, step_delay_s=0.01)  # 200 tokens take >= 2 s
    bg2 = serve_in_background(slow)
    try:
        with httpx.stream("POST", bg2.url + "/v1/completions",
                          json={"model": NAME, "prompt": prompt, "max_tokens": 200, "stream": True}) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= 6:  # a few tokens in
                    break
            assert slow.health()["running"] == 1
        t0 = time.time()
        wait_idle(slow)
        freed = time.time() - t0
        assert freed < 1.0, freed  # "at once": well before the >= 1.9 s the rest would take
        m = parse_metrics(httpx.get(bg2.url + "/metrics").text)
        dis = [v for lab, v in m["codex_lab:request_errors_total"] if lab["kind"] == "disconnected"]
        assert sum(dis) == 1
        # a plain (non-streaming) client that gives up is cancelled too
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(bg2.url + "/v1/completions", json={"model": NAME, "prompt": prompt, "max_tokens": 200}, timeout=0.5)
        t0 = time.time()
        wait_idle(slow)
        assert time.time() - t0 < 1.0
    finally:
        bg2.stop()


def test_deadline_ends_request_with_clear_reason(small_tokenizer):
    model = make_model(small_tokenizer.vocab_size)
    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME, deadline_s=0.3))
    srv.add_version("v0001", model, step_delay_s=0.05)  # 20 tokens/s at most: 100 tokens need 5 s
    bg = serve_in_background(srv)
    try:
        t0 = time.perf_counter()
        r = httpx.post(bg.url + "/v1/completions", json={"model": NAME, "prompt": "a", "max_tokens": 100}, timeout=10)
        dt = time.perf_counter() - t0
        choice = r.json()["choices"][0]
        # OpenAI's reasons only: a deadline is "length", the detail is the documented extension field
        assert r.status_code == 200 and choice["finish_reason"] == "length" and choice["finish_detail"] == "deadline"
        assert dt < 1.5, dt  # ended near its 0.3 s deadline, not after 5 s
        wait_idle(srv)
    finally:
        bg.stop()


def test_full_queue_answers_429(small_tokenizer):
    model = make_model(small_tokenizer.vocab_size)
    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME, max_batch_size=1, max_waiting=1))
    srv.add_version("v0001", model, step_delay_s=0.02)
    bg = serve_in_background(srv)
    try:
        rep = run_load(bg.url, concurrency=6, requests=6, max_tokens=20, duration_s=20)
        assert rep.errors.get("status 429", 0) >= 1, rep.summary()
        assert rep.ok + rep.errors["status 429"] == 6
        assert set(rep.errors) == {"status 429"}
        body = httpx.post(bg.url + "/v1/completions", json={"model": NAME, "prompt": "a", "max_tokens": 1}).json()
        assert "choices" in body  # the server serves again once the queue drained
        wait_idle(srv)
    finally:
        bg.stop()


def test_metrics_parse_and_count(served):
    bg, srv, *_ = served
    before = parse_metrics(httpx.get(bg.url + "/metrics").text)
    n0 = sum(v for _, v in before.get("codex_lab:generation_tokens_total", []))
    r = httpx.post(bg.url + "/v1/completions", json={"model": NAME, "prompt": "def g():\n", "max_tokens": 6}).json()
    m = parse_metrics(httpx.get(bg.url + "/metrics").text)
    n1 = sum(v for _, v in m["codex_lab:generation_tokens_total"])
    assert n1 - n0 == r["usage"]["completion_tokens"]
    edges = {lab["le"] for lab, _ in m["codex_lab:time_to_first_token_seconds_bucket"]}
    assert {"0.1", "0.02"} <= edges
    assert "0.02" in {lab["le"] for lab, _ in m["codex_lab:inter_token_latency_seconds_bucket"]}
    for name in ("codex_lab:num_requests_running", "codex_lab:num_requests_waiting", "codex_lab:kv_cache_usage_perc",
                 "codex_lab:peak_memory_bytes", "codex_lab:model_version_info", "codex_lab:e2e_request_latency_seconds_count",
                 "codex_lab:request_success_total", "codex_lab:prompt_tokens_total"):
        assert name in m, name
    assert m["codex_lab:peak_memory_bytes"][0][1] > 10 * 2**20  # a Python process with torch is > 10 MiB
    assert m["codex_lab:model_version_info"][0][0]["version"] == "v0001"


def test_concurrent_streams_with_disconnects_leak_nothing(served):
    bg, srv, *_ = served
    rep = run_load(bg.url, concurrency=8, requests=24, max_tokens=16, disconnect_prob=0.5, duration_s=20, seed=1)
    s = rep.summary()
    assert s["errors"] == 0, s
    assert rep.ok + rep.disconnected == 24 and rep.disconnected >= 1, s
    wait_idle(srv)  # zero leaked slots: nothing running, waiting, or holding KV


def test_only_loopback():
    check_loopback("127.0.0.1")
    with pytest.raises(ValueError, match="loopback"):
        check_loopback("0.0.0.0")
    with pytest.raises(ValueError, match="only targets this machine"):
        run_load("http://example.com:8000", requests=1)


class _CrashingEngine(Engine):
    """An engine whose decode blows up (a stand-in for a CUDA error or a bad kernel)."""

    def step(self):
        raise RuntimeError("simulated kernel failure")


def test_engine_crash_is_a_500_then_503_not_a_hang(small_tokenizer):
    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME), engine_factory=_CrashingEngine)
    srv.add_version("v0001", make_model(small_tokenizer.vocab_size))
    bg = serve_in_background(srv)
    try:
        body = {"model": NAME, "prompt": "a", "max_tokens": 4}
        r1 = httpx.post(bg.url + "/v1/completions", json=body, timeout=10)
        assert r1.status_code == 500 and "simulated kernel failure" in r1.json()["error"]["message"]
        r2 = httpx.post(bg.url + "/v1/completions", json=body, timeout=10)
        assert r2.status_code == 503 and r2.json()["error"]["code"] == "engine_failed"
        h = httpx.get(bg.url + "/health").json()
        assert h["status"] == "degraded" and h["dead_engines"] == ["v0001"] and h["in_flight"] == 0
        m = parse_metrics(httpx.get(bg.url + "/metrics").text)
        internal = sum(v for lab, v in m["codex_lab:request_errors_total"] if lab["kind"] == "internal")
        assert internal == 2  # each failure counted once
    finally:
        bg.stop()


class _FailSeed666(Engine):
    """Sampling fails for requests with seed 666, at their third token (a bad kernel or NaN
    logits that only one request of the batch meets)."""

    def _emit(self, req, logits, greedy=None):
        if req.params.seed == 666 and len(req.output) == 2:
            raise RuntimeError("simulated failure in one request")
        return super()._emit(req, logits, greedy)


def _stream(url: str, body: dict, out: dict, key: str) -> None:
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        out[key] = (r.status_code, [ln for ln in r.iter_lines() if ln])


def test_failure_in_one_request_of_a_running_batch_fails_it_alone(small_tokenizer):
    import threading
    import warnings

    tok, model = small_tokenizer, make_model(small_tokenizer.vocab_size)
    srv = ModelServer(tok, ServerConfig(model_name=NAME, max_batch_size=4), engine_factory=_FailSeed666)
    srv.add_version("v0001", model, step_delay_s=0.02)  # 20 tokens take >= 0.4 s: the four overlap
    bg = serve_in_background(srv)
    prompts = ["def f():\n", "x = 1\n", "import os\n"]
    try:
        out: dict = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the engine warns about the failed request
            threads = [threading.Thread(target=_stream, args=(bg.url, {"model": NAME, "prompt": p, "max_tokens": 20},
                                                              out, p)) for p in prompts]
            threads.append(threading.Thread(target=_stream, args=(bg.url, {"model": NAME, "prompt": "a", "max_tokens": 20,
                                                                         "temperature": 1.0, "seed": 666}, out, "bad")))
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            status, lines = out["bad"]
            assert status == 200 and lines[-1] == "data: [DONE]"
            err = json.loads(lines[-2][6:])["error"]  # an error event, then [DONE]
            assert "simulated failure" in err["message"] and err["type"] == "server_error"
            for p in prompts:  # the others finished, with the reference text
                status, lines = out[p]
                assert status == 200 and lines[-1] == "data: [DONE]"
                chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
                ref = generate_ids(model, tok.encode(p), max_new_tokens=20, eos_id=tok.eot_id)[0]
                assert "".join(c["choices"][0]["text"] for c in chunks) == tok.decode(ref), p
                assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
            # a plain request that fails: 500 in OpenAI's shape; the next one is served
            r = httpx.post(bg.url + "/v1/completions", json={"model": NAME, "prompt": "a", "max_tokens": 5,
                                                             "temperature": 1.0, "seed": 666}, timeout=30)
            assert r.status_code == 500 and "simulated failure" in r.json()["error"]["message"]
        ok = httpx.post(bg.url + "/v1/completions", json={"model": NAME, "prompt": "a", "max_tokens": 3}, timeout=30)
        assert ok.status_code == 200
        assert srv.health()["status"] == "ok" and srv.health()["dead_engines"] == []
        assert srv.metrics.version_counts("v0001")["failures"] == 2  # the two failed requests, nothing else
        wait_idle(srv)
    finally:
        bg.stop()


class _OneBadStep(Engine):
    """One whole engine step raises (the third), then the engine works again."""

    def step(self):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 3:
            raise RuntimeError("transient step failure")
        return super().step()


def test_a_failed_step_fails_its_requests_and_the_engine_goes_on(small_tokenizer):
    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME), engine_factory=_OneBadStep)
    srv.add_version("v0001", make_model(small_tokenizer.vocab_size))
    bg = serve_in_background(srv)
    try:
        body = {"model": NAME, "prompt": "a", "max_tokens": 8}
        r1 = httpx.post(bg.url + "/v1/completions", json=body, timeout=30)
        assert r1.status_code == 500 and "transient step failure" in r1.json()["error"]["message"]
        r2 = httpx.post(bg.url + "/v1/completions", json=body, timeout=30)
        assert r2.status_code == 200 and r2.json()["usage"]["completion_tokens"] >= 1
        assert srv.health()["status"] == "ok"
        wait_idle(srv)
    finally:
        bg.stop()


class _SilentEngine(Engine):
    """An engine that takes requests and never steps them (a stand-in for a wedged engine that
    neither answers nor enforces the deadline itself)."""

    def has_work(self):
        return False


def test_the_servers_own_guard_ends_a_request_the_engine_never_answers(small_tokenizer):
    """The engine enforces a request's deadline; the server keeps a guard two seconds past it, so a
    wedged engine cannot hold a client forever: the answer ends "length" / "deadline" near 0.3 + 2 s."""
    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME, deadline_s=0.3), engine_factory=_SilentEngine)
    srv.add_version("v0001", make_model(small_tokenizer.vocab_size))
    bg = serve_in_background(srv)
    try:
        for stream in (False, True):
            t0 = time.perf_counter()
            r = httpx.post(bg.url + "/v1/completions", json={"model": NAME, "prompt": "a", "max_tokens": 4,
                                                             "stream": stream}, timeout=20)
            dt = time.perf_counter() - t0
            assert r.status_code == 200, r.text
            if stream:
                chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                          if line.startswith("data: {")]
                choice = chunks[-1]["choices"][0]
                assert r.text.rstrip().endswith("data: [DONE]")
            else:
                choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "length" and choice["finish_detail"] == "deadline", choice
            # the guard fires at 2.3 s; a generous bound on a busy machine, far below the client's 20 s
            assert 2.0 < dt < 10.0, dt
    finally:
        bg.stop()
