"""The server with each version's engine in a child process (ServerConfig(engine_process=True),
codex_lab.serve.engine_process): the same answers as the thread worker's, streamed, with
logprobs, a disconnect freeing its slot in the child, and a crashing engine a 500 then 503."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.generate import generate_ids
from codex_lab.serve.app import serve_in_background
from codex_lab.serve.engine_process import EngineProcess
from codex_lab.serve.metrics import parse_metrics
from codex_lab.serve.router import ModelServer, ServerConfig
from serving_helpers import make_model, wait_idle

NAME = "tiny"


def wait_ready(bg, timeout: float = 120.0) -> None:
    # the child imports torch and builds its engine before it reports: a hang guard, not a goal
    t0 = time.time()
    while time.time() - t0 < timeout:
        if httpx.get(bg.url + "/ready").status_code == 200:
            return
        time.sleep(0.1)
    raise AssertionError(f"not ready after {timeout} s: {httpx.get(bg.url + '/health').json()}")


@pytest.fixture(scope="module")
def served(small_tokenizer):
    model = make_model(small_tokenizer.vocab_size)
    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME, max_batch_size=4, engine_process=True))
    srv.add_version("v0001", model)
    bg = serve_in_background(srv)
    wait_ready(bg)
    yield bg, srv, small_tokenizer, model
    bg.stop()
    srv.close()


def test_the_engine_runs_in_a_child_process(served):
    bg, srv, tok, model = served
    w = srv.workers["v0001"]
    assert isinstance(w, EngineProcess) and w.proc.is_alive() and w.proc.pid != threading.get_native_id()


def test_answers_equal_the_plain_generator_plain_streamed_and_concurrent(served):
    bg, srv, tok, model = served
    client = openai.OpenAI(base_url=bg.url + "/v1", api_key="unused", max_retries=0)
    prompts = ["def add(a, b):\n", "import os\n", "class A:\n"]
    refs = [tok.decode(generate_ids(model, tok.encode(p), max_new_tokens=16, eos_id=tok.eot_id)[0]) for p in prompts]
    r = client.completions.create(model=NAME, prompt=prompts[0], max_tokens=16, temperature=0)
    assert r.choices[0].text == refs[0] and r.usage.completion_tokens >= 1
    chunks = list(client.completions.create(model=NAME, prompt=prompts[0], max_tokens=16, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == refs[0] and len(chunks) >= 3
    # three at once: the child batches them, each answer its own
    out: dict[int, str] = {}

    def one(i: int) -> None:
        out[i] = client.completions.create(model=NAME, prompt=prompts[i], max_tokens=16, temperature=0).choices[0].text

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [out[i] for i in range(3)] == refs
    wait_idle(srv)


def test_logprobs_come_back_from_the_child(served):
    bg, srv, tok, model = served
    body = {"model": NAME, "prompt": "x = 1\n", "max_tokens": 6, "temperature": 0, "logprobs": 2}
    r = httpx.post(bg.url + "/v1/completions", json=body, timeout=60).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) >= 1
    assert all(v <= 0.0 for v in lp["token_logprobs"]) and all(len(t) <= 2 for t in lp["top_logprobs"])
    # the same request on the thread worker gives the same numbers (same engine code, same weights)
    thread_srv = ModelServer(tok, ServerConfig(model_name=NAME, max_batch_size=4))
    thread_srv.add_version("v0001", model)
    bg2 = serve_in_background(thread_srv)
    try:
        r2 = httpx.post(bg2.url + "/v1/completions", json=body, timeout=60).json()
    finally:
        bg2.stop()
        thread_srv.close()
    assert r2["choices"][0]["text"] == r["choices"][0]["text"]
    assert r2["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(lp["token_logprobs"], abs=1e-5)


def test_a_disconnect_frees_the_slot_in_the_child(small_tokenizer):
    model = make_model(small_tokenizer.vocab_size)
    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME, engine_process=True))
    srv.add_version("v0001", model, step_delay_s=0.1)  # 200 tokens take >= 20 s
    bg = serve_in_background(srv)
    try:
        wait_ready(bg)
        body = {"model": NAME, "prompt": "a", "max_tokens": 200, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", bg.url + "/v1/completions", json=body, timeout=60) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= 4:  # a few tokens in
                    break
        t0 = time.time()
        wait_idle(srv)
        # freed at once, not when the rest (>= 19 s of sleeps alone) would have run: the bound is half of
        # that, far from both, so a busy machine's slower steps cannot make it flake
        assert time.time() - t0 < 10.0
        m = parse_metrics(httpx.get(bg.url + "/metrics").text)
        assert sum(v for lab, v in m["codex_lab:request_errors_total"] if lab["kind"] == "disconnected") == 1
    finally:
        bg.stop()
        srv.close()


class CrashingEngine(Engine):
    """An engine whose decode blows up (module level: the child process unpickles it by name)."""

    def step(self):
        raise RuntimeError("simulated kernel failure")


def test_a_crashing_engine_is_a_500_then_503_not_a_hang(small_tokenizer):
    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME, engine_process=True), engine_factory=CrashingEngine)
    srv.add_version("v0001", make_model(small_tokenizer.vocab_size))
    bg = serve_in_background(srv)
    try:
        body = {"model": NAME, "prompt": "a", "max_tokens": 4}
        r1 = httpx.post(bg.url + "/v1/completions", json=body, timeout=60)
        assert r1.status_code == 500 and "simulated kernel failure" in r1.json()["error"]["message"]
        codes = [r1.status_code]
        for _ in range(3):  # three failed steps in a row mark the engine dead
            codes.append(httpx.post(bg.url + "/v1/completions", json=body, timeout=60).status_code)
        assert codes[-1] == 503 and set(codes) <= {500, 503}, codes
        t0 = time.time()
        while srv.health()["status"] != "degraded" and time.time() - t0 < 30:  # hang guard
            time.sleep(0.05)
        h = srv.health()
        assert h["status"] == "degraded" and h["dead_engines"] == ["v0001"] and h["in_flight"] == 0
    finally:
        bg.stop()
        srv.close()


def test_a_retired_version_stops_its_engine_process_once_idle(small_tokenizer):
    """Promoting a canary retires the old primary: its child process stops once no request is in
    flight there, and a request routed to it after that is told to route again (WorkerClosed)."""
    from codex_lab.serve.worker import WorkerClosed

    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME, engine_process=True))
    srv.add_version("v0001", make_model(small_tokenizer.vocab_size, 0))
    srv.add_version("v0002", make_model(small_tokenizer.vocab_size, 1))
    old = srv.workers["v0001"]
    srv.set_canary("v0002", 0.5)
    assert srv.promote_canary() == "v0002" and "v0001" not in srv.workers
    t0 = time.time()
    while old.proc.is_alive() and time.time() - t0 < 60:  # a hang guard: the reader polls every 50 ms
        time.sleep(0.05)
    assert not old.proc.is_alive() and old.closed and old.error is None
    with pytest.raises(WorkerClosed):
        old.submit(object())  # type: ignore[arg-type]
    srv.close()
    assert not srv.workers["v0002"].proc.is_alive()
