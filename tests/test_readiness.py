"""Readiness (issue 40, item 1): GET /health reports the server's phase (starting -> warming ->
ready, or degraded) and stays 200 while the process lives (liveness); GET /ready answers 503
until the compiled graphs serve (readiness); /metrics says the same with a one-hot phase gauge
and the compile's progress; the compile cache folder must be private or it is refused, with
the reason in /health. The graphs here compile with the "eager" backend (dynamo traces, nothing
is built by a C++ compiler): the same background-compile path as `codex-lab serve`, in seconds."""

from __future__ import annotations

import os
import stat
import threading
import time
from typing import Callable

import httpx
import pytest

from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.engine.runner.options import served_step_options
from codex_lab.serve.app import BackgroundServer, create_app
from codex_lab.serve.router import ModelServer, ServerConfig
from codex_lab.serve.metrics import PHASES, parse_metrics
from codex_lab.infer.compile_cache import COMPILE_CACHE_ENV, compile_cache_dir, use_compile_cache

from conftest import COMPILE_HANG_S, seeded_model

NAME = "tiny"
BODY = {"model": NAME, "prompt": "def f(x):\n", "max_tokens": 4, "temperature": 0}


def gated_factory(gate: threading.Event, *, fail: bool = False, steps: list | None = None) -> Callable:
    """An engine factory as `codex-lab serve`'s (background compile of every bucket, both shapes)
    whose compile builds its first graph, then waits for ``gate``; ``fail``: every compile raises."""
    def factory(model, tokenizer, **kw):
        eng = Engine(model, tokenizer, compile=True, compile_backend="eager",
                     step_options=served_step_options(kw.get("max_batch_size", 2)), **kw)
        step, compiled, calls = eng.fast_step, eng.fast_step._compiled, []

        def slow(*a, **k):
            if threading.current_thread().name == "codex-lab-compile":
                calls.append(1)
                if len(calls) > 1:
                    gate.wait(COMPILE_HANG_S)  # the test sets it; the bound only keeps a failed test from hanging
            return compiled(*a, **k)

        def broken(*a, **k):
            raise RuntimeError("no C++ compiler here")

        step._compiled = slow
        if fail:
            step._fn = broken
        if steps is not None:
            steps.append(step)
        step.warmup_background(freeze_gc=False)
        return eng
    return factory


def start(srv: ModelServer, **kw) -> BackgroundServer:
    return BackgroundServer(create_app(srv, **kw), config=srv.config)


def phase_gauge(url: str) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """({phase: value}, {version: graphs done}, {version: graphs total}) from /metrics."""
    m = parse_metrics(httpx.get(url + "/metrics").text)
    one_hot = {lab["phase"]: v for lab, v in m["codex_lab:server_phase"]}
    done = {lab["version"]: v for lab, v in m.get("codex_lab:compile_graphs_done", [])}
    total = {lab["version"]: v for lab, v in m.get("codex_lab:compile_graphs_total", [])}
    return one_hot, done, total


def wait_for(cond: Callable[[], bool], timeout: float = COMPILE_HANG_S) -> None:
    """Poll ``cond`` until it holds; ``timeout`` is a hang guard (conftest.COMPILE_HANG_S)."""
    t0 = time.time()
    while not cond():
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.05)


def test_phase_goes_starting_warming_ready_and_ready_route_follows(tok):
    gate, steps = threading.Event(), []
    # as the CLI: the HTTP server answers before the model (and its tokenizer) is loaded
    srv = ModelServer(None, ServerConfig(model_name=NAME, max_batch_size=2), engine_factory=gated_factory(gate, steps=steps))
    bg = start(srv)
    try:
        h = httpx.get(bg.url + "/health")
        assert h.status_code == 200 and h.json()["phase"] == "starting" and h.json()["status"] == "starting"
        assert httpx.get(bg.url + "/ready").status_code == 503
        assert phase_gauge(bg.url)[0] == {p: float(p == "starting") for p in PHASES}
        r = httpx.post(bg.url + "/v1/completions", json=BODY)  # no model yet: 503 with Retry-After, not a crash
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready" and "retry-after" in r.headers
        assert httpx.post(bg.url + "/tokenize", json={"prompt": "x"}).status_code == 503

        srv.tokenizer = tok
        srv.add_version("v0001", seeded_model(tok))
        total = len(steps[0].compile_plan())
        assert total >= 3  # decode buckets and the mixed shape's: several graphs, so progress shows
        wait_for(lambda: httpx.get(bg.url + "/health").json()["compile"]["graphs_done"] == 1)
        h = httpx.get(bg.url + "/health")
        body = h.json()
        assert h.status_code == 200 and body["phase"] == "warming" and not body["ready"] and body["status"] == "ok"
        assert body["compile"]["graphs_total"] == total and body["versions"]["v0001"]["phase"] == "warming"
        for route in ("/ready", "/health/ready"):
            r = httpx.get(bg.url + route)
            assert r.status_code == 503 and r.json()["phase"] == "warming"
        one_hot, done, tot = phase_gauge(bg.url)
        assert one_hot == {p: float(p == "warming") for p in PHASES}
        assert done == {"v0001": 1.0} and tot == {"v0001": float(total)}
        # served while compiling (the default, --serve-while-compiling): the eager step answers
        assert httpx.post(bg.url + "/v1/completions", json=BODY, timeout=60).status_code == 200

        gate.set()
        wait_for(lambda: httpx.get(bg.url + "/ready").status_code == 200)
        body = httpx.get(bg.url + "/ready").json()
        assert body["phase"] == "ready" and body["ready"] and body["compile"] == {
            "graphs_done": total, "graphs_total": total, "error": "", "cache": None}
        one_hot, done, tot = phase_gauge(bg.url)
        assert one_hot == {p: float(p == "ready") for p in PHASES} and done == tot == {"v0001": float(total)}
        assert steps[0].serving_graphs
        assert httpx.post(bg.url + "/v1/completions", json=BODY, timeout=60).status_code == 200
    finally:
        gate.set()
        bg.stop()


def test_a_failed_compile_is_degraded_not_ready_and_still_serves_eagerly(tok):
    srv = ModelServer(tok, ServerConfig(model_name=NAME, max_batch_size=2),
                      engine_factory=gated_factory(threading.Event(), fail=True))
    srv.add_version("v0001", seeded_model(tok))
    bg = start(srv)
    try:
        wait_for(lambda: httpx.get(bg.url + "/health").json()["phase"] != "warming")
        h = httpx.get(bg.url + "/health")
        body = h.json()
        assert h.status_code == 200 and body["phase"] == "degraded" and body["status"] == "degraded"
        assert "no C++ compiler" in body["compile"]["error"] and "eager step serves" in body["compile"]["error"]
        assert httpx.get(bg.url + "/ready").status_code == 503
        assert phase_gauge(bg.url)[0] == {p: float(p == "degraded") for p in PHASES}
        assert httpx.post(bg.url + "/v1/completions", json=BODY, timeout=60).status_code == 200
    finally:
        bg.stop()


def test_an_engine_that_compiles_nothing_is_ready_at_once(tok):
    """--no-compile: the eager engine; ready as soon as the version is loaded."""
    srv = ModelServer(tok, ServerConfig(model_name=NAME, max_batch_size=2))
    srv.add_version("v0001", seeded_model(tok))
    bg = start(srv)
    try:
        r = httpx.get(bg.url + "/ready")
        assert r.status_code == 200 and r.json()["compile"]["graphs_total"] == 0
        assert phase_gauge(bg.url)[0]["ready"] == 1.0
    finally:
        bg.stop()


def test_wait_ready_refuses_completions_until_the_graphs_serve(tok):
    gate = threading.Event()
    srv = ModelServer(tok, ServerConfig(model_name=NAME, max_batch_size=2), engine_factory=gated_factory(gate))
    srv.add_version("v0001", seeded_model(tok))
    bg = start(srv, wait_ready=True)
    try:
        r = httpx.post(bg.url + "/v1/completions", json=BODY)
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready" and "--wait-ready" in r.text
        assert r.headers["retry-after"] == "1"
        gate.set()
        wait_for(lambda: httpx.get(bg.url + "/ready").status_code == 200)
        assert httpx.post(bg.url + "/v1/completions", json=BODY, timeout=60).status_code == 200
    finally:
        gate.set()
        bg.stop()


def test_compile_cache_folder_is_private_and_keyed_by_torch_version(tmp_path, monkeypatch):
    import torch

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    folder = compile_cache_dir()
    assert folder.parent == tmp_path / "xdg" / "codex_lab" / "inductor" and torch.__version__ in folder.name
    info = use_compile_cache()
    assert info == {"dir": str(folder), "active": True, "reason": ""}
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "mine"))
    assert compile_cache_dir().parent == tmp_path / "mine"


def test_a_compile_cache_folder_others_can_write_is_refused_and_health_says_why(tmp_path, monkeypatch, tok):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    bad = tmp_path / "shared" / "torch-x"
    bad.mkdir(parents=True)
    bad.chmod(0o777)
    info = use_compile_cache(bad)
    assert not info["active"] and "writable by group or others (mode 777)" in info["reason"]
    assert f"chmod 700 {bad}" in info["reason"] and "private temporary folder" in info["reason"]
    used = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert used == info["dir"] and not used.startswith(str(tmp_path))  # never the refused folder
    assert stat.S_IMODE(os.stat(used).st_mode) == 0o700
    bad.chmod(0o700)
    (tmp_path / "shared").chmod(0o777)  # the folder above the key folder counts too
    info2 = use_compile_cache(bad)
    assert not info2["active"] and str(tmp_path / "shared") in info2["reason"]

    srv = ModelServer(tok, ServerConfig(model_name=NAME, max_batch_size=2))
    srv.add_version("v0001", seeded_model(tok))
    bg = start(srv, compile_cache=info)
    try:
        cache = httpx.get(bg.url + "/health").json()["compile"]["cache"]
        assert cache["active"] is False and "refusing the compile cache folder" in cache["reason"]
    finally:
        bg.stop()
        (tmp_path / "shared").chmod(0o700)


def test_serve_flags():
    import argparse

    from codex_lab.commands import serve

    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    assert p.parse_args([]).wait_ready is False
    assert p.parse_args(["--serve-while-compiling"]).wait_ready is False
    assert p.parse_args(["--wait-ready"]).wait_ready is True
    with pytest.raises(SystemExit):
        p.parse_args(["--wait-ready", "--serve-while-compiling"])
    help_text = next(a.help for a in p._actions if "--no-compile" in a.option_strings)
    assert not any(c.isdigit() for c in help_text)  # no stale figures


def test_aten_matmuls_flag_picks_the_cached_bucket_graphs():
    """``codex-lab serve`` compiles frozen weights with the C++ GEMM template by default;
    ``--aten-matmuls`` gives the per-bucket graphs over unfrozen weights (cached on disk)."""
    import argparse

    from codex_lab.commands import serve

    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    assert p.parse_args([]).aten_matmuls is False and p.parse_args(["--aten-matmuls"]).aten_matmuls is True
    help_text = next(a.help for a in p._actions if "--aten-matmuls" in a.option_strings)
    assert not any(c.isdigit() for c in help_text)  # no stale figures
