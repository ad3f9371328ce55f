"""Load a local server with concurrent streaming clients and measure what clients see.

Loopback only (127.0.0.1 / localhost / ::1): the load generator refuses any other host.
Runs are bounded twice: by a number of requests and by a duration. Each client streams a
completion and timestamps every server-sent event that carries text:
TTFT = first text event - request sent; TBT = gaps between text events. Optional random
disconnects close a stream after a few events (the server must free the slot).
:func:`malformed_storm` sends bad requests and counts the answers by status.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, Sequence, TypeVar
from urllib.parse import urlparse

import aiohttp
import httpx

from codex_lab.runtime import progress as progress_bar
from codex_lab.serve.gates import percentile

T = TypeVar("T")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
PROMPTS = ("def add(a, b):\n", "import os\n\n\ndef list_files(path):\n", "class Stack:\n    def __init__(self):\n",
           "def parse_args(argv):\n    \"\"\"Parse the command line.\"\"\"\n", "for i in range(10):\n")


def check_url(url: str) -> str:
    """``url`` without a trailing slash; ValueError unless its host is loopback."""
    host = urlparse(url).hostname
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"refusing to load {url!r}: the load test only targets this machine "
                         f"(hosts {LOOPBACK_HOSTS}); start the server with `codex-lab serve` and use its URL")
    return url.rstrip("/")


@dataclass
class LoadReport:
    """Raw per-request measurements of one run (seconds)."""

    ttft: list[float] = field(default_factory=list)
    tbt: list[float] = field(default_factory=list)
    ok: int = 0
    disconnected: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # "status 500", "ReadTimeout", ...
    tokens: int = 0
    duration_s: float = 0.0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)  # prompt (ids as JSON) -> each finished stream's text

    def summary(self, ttft_slo_s: float = 0.1, tbt_slo_s: float = 0.02, with_texts: bool = False) -> dict[str, Any]:
        """Flat numbers: percentiles in ms, shares within the SLOs, throughput, errors; with
        ``with_texts``, also ``texts``: per prompt, each finished stream's text (in the order
        the streams ended), what a comparison of two servers' answers reads."""
        s: dict[str, Any] = {"requests_ok": self.ok, "disconnected": self.disconnected,
                             "errors": sum(self.errors.values()), "error_kinds": dict(self.errors),
                             "duration_s": round(self.duration_s, 3), "tokens": self.tokens,
                             # throughput = tokens received / wall time
                             "tokens_per_s": round(self.tokens / self.duration_s, 2) if self.duration_s else 0.0}
        for name, xs in (("ttft", self.ttft), ("tbt", self.tbt)):
            for q in (50, 95, 99):
                s[f"{name}_p{q}_ms"] = round(percentile(xs, q) * 1000, 2) if xs else None
        # share within SLO = observations <= target / observations
        s["ttft_share_under_100ms"] = round(sum(x <= ttft_slo_s for x in self.ttft) / len(self.ttft), 4) if self.ttft else None
        s["tbt_share_under_20ms"] = round(sum(x <= tbt_slo_s for x in self.tbt) / len(self.tbt), 4) if self.tbt else None
        s["finish_reasons"] = dict(self.finish_reasons)
        if with_texts:
            s["texts"] = {p: list(ts) for p, ts in self.texts.items()}
        return s


async def _one(session: "aiohttp.ClientSession", url: str, body: dict[str, Any], rep: LoadReport,
               disconnect_after: int | None) -> None:
    t0 = time.perf_counter()
    times: list[float] = []
    pieces: list[str] = []
    try:
        async with session.post(url + "/v1/completions", json=body) as r:
            if r.status != 200:
                await r.read()
                key = f"status {r.status}"
                rep.errors[key] = rep.errors.get(key, 0) + 1
                return
            async for raw in r.content:  # one server-sent-event line at a time
                if not raw.startswith(b"data: "):
                    continue
                data = raw[6:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                ch = chunk["choices"][0] if chunk.get("choices") else {}
                if ch.get("text"):
                    times.append(time.perf_counter())
                    pieces.append(ch["text"])
                if ch.get("finish_reason"):
                    reason = ch["finish_reason"]
                    rep.finish_reasons[reason] = rep.finish_reasons.get(reason, 0) + 1
                if chunk.get("usage"):  # stream_options.include_usage: a last chunk with the usage
                    rep.tokens += chunk["usage"].get("completion_tokens", 0)
                if disconnect_after is not None and len(times) >= disconnect_after:
                    rep.disconnected += 1
                    return  # leaving the block mid-stream closes the connection (it cannot be reused)
        rep.ok += 1
        prompt = body["prompt"]  # text, or token ids (the API takes both): a JSON key either way
        rep.texts.setdefault(prompt if isinstance(prompt, str) else json.dumps(prompt), []).append("".join(pieces))
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, KeyError) as exc:
        key = type(exc).__name__
        rep.errors[key] = rep.errors.get(key, 0) + 1
        return
    finally:
        if times:
            rep.ttft.append(times[0] - t0)
            rep.tbt.extend(b - a for a, b in zip(times, times[1:]))


async def run_load_async(url: str, *, concurrency: int = 4, requests: int = 16, duration_s: float = 30.0,
                         max_tokens: int = 32, disconnect_prob: float = 0.0, prompts: Sequence[str] = PROMPTS,
                         model: str | None = None, seed: int = 0, timeout_s: float = 60.0,
                         progress: bool = True, fresh_connections: bool = False,
                         extra_body: dict[str, Any] | None = None, cycle_prompts: bool = False) -> LoadReport:
    """``concurrency`` clients issue streaming requests until ``requests`` were sent or
    ``duration_s`` passed (requests in flight then finish). See :func:`run_load`.
    ``progress``: a tqdm bar of finished requests (it may stop short when ``duration_s`` ends the run).
    ``fresh_connections``: one TCP connection per request instead of keep-alive (llama.cpp's
    llama-server drops kept-alive connections after a stream: aiohttp then fails a later request
    with "connection reset"; a peer comparison runs both servers this way).
    ``extra_body``: more fields of every request body (e.g. ``{"ignore_eos": true}``: every
    answer runs to ``max_tokens``, so two servers whose models stop at different places do
    the same work; a peer comparison sends it to both). It cannot replace the fields above.
    ``cycle_prompts``: request i takes ``prompts[i % len(prompts)]`` instead of a random one (every
    prompt sent once ``requests >= len(prompts)``: what a comparison of answers needs).

    The clients are aiohttp's (C-accelerated HTTP parsing): on the server's own machine every
    CPU-second a client spends is taken from the server it measures (httpx's streaming
    client, used before, spent ~170 us per event: 0.7 of a core at 16 streams, 2026-12-02)."""
    url = check_url(url)
    if concurrency < 1 or requests < 1 or duration_s <= 0:
        raise ValueError("concurrency and requests must be >= 1 and duration_s > 0")
    rng = random.Random(seed)
    rep = LoadReport()
    # per-operation limits as before (connect, each read), not a limit on a whole stream
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=fresh_connections)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, trust_env=False) as session:
        if model is None:
            async with session.get(url + "/v1/models") as r:
                model = (await r.json())["data"][0]["id"]
        t_start = time.perf_counter()
        issued = 0
        lock = asyncio.Lock()
        bar = progress_bar(total=requests, desc=f"load test ({concurrency} clients, <= {duration_s:g} s)",
                           enabled=progress, unit="req")

        async def worker() -> None:
            nonlocal issued
            while True:
                async with lock:
                    if issued >= requests or time.perf_counter() - t_start >= duration_s:
                        return
                    prompt = prompts[issued % len(prompts)] if cycle_prompts else prompts[rng.randrange(len(prompts))]
                    issued += 1
                    cut = rng.randint(1, max(1, max_tokens - 1)) if rng.random() < disconnect_prob else None
                body = {**(extra_body or {}), "model": model, "prompt": prompt, "max_tokens": max_tokens,
                        "stream": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
                await _one(session, url, body, rep, cut)
                bar.update(1)

        try:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        finally:
            bar.close()
        rep.duration_s = time.perf_counter() - t_start
    return rep


def fast_event_loop() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop factory where it is installed (as uvicorn's ``loop="auto"`` picks for
    the server), else None (asyncio's own). The clients of a load test on the server's machine
    take CPU from the server; uvloop's loop is written in C and spends less of it per event."""
    try:
        import uvloop
    except ImportError:  # Windows, or not installed: asyncio's loop
        return None
    return uvloop.new_event_loop


def run_sync(coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion in a fresh event loop on a helper thread (works inside
    Jupyter, whose own loop is already running)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            if not hasattr(asyncio, "Runner"):  # Python 3.10: asyncio's own loop
                box["v"] = asyncio.run(coro_fn())
                return
            with asyncio.Runner(loop_factory=fast_event_loop()) as runner:
                box["v"] = runner.run(coro_fn())
        except BaseException as exc:  # re-raised in the caller
            box["e"] = exc

    t = threading.Thread(target=target, name="loadtest")
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["v"]


def run_load(url: str, **kwargs: Any) -> LoadReport:
    """Blocking load test (see :func:`run_load_async` for the arguments):
    concurrency (clients), requests (most requests), duration_s (most seconds of issuing),
    max_tokens, disconnect_prob (share of streams closed early), prompts, model, seed, progress,
    fresh_connections (one connection per request), extra_body (more request fields),
    cycle_prompts (the prompts in turn, not at random)."""
    return run_sync(lambda: run_load_async(url, **kwargs))


_CHILD = """
import json, sys
from codex_lab.serve.loadtest import run_load
try:
    kw = json.loads(sys.argv[2])
    texts = kw.pop("with_texts", False)
    out = {"ok": run_load(sys.argv[1], **kw).summary(with_texts=texts)}
except Exception as exc:
    out = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


def run_load_in_process(url: str, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_load` in a process of its own (a fresh interpreter); returns its ``summary()``.

    Clients in the server's process share its interpreter lock: every streamed event they
    parse delays the engine's next step, which a real client (another process) does not do.
    ``codex-lab bench serving`` measures this way. ``kwargs`` must be JSON values (``prompts``
    a list of strings); ``with_texts=True`` adds each stream's text to the summary. Raises RuntimeError naming the child's error. A plain subprocess, not
    ``multiprocessing``: its spawn would re-run the caller's ``__main__`` (a script without a
    ``__main__`` guard would start a second server)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _CHILD, url, json.dumps(kwargs)], stdout=subprocess.PIPE,
                          text=True)  # stderr passes through: the child's progress bar
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(f"load test failed: the load-test process ended with code {proc.returncode} "
                           f"and no result") from None
    if "ok" not in out:
        raise RuntimeError(f"load test failed: {out.get('error')}")
    return out["ok"]


def malformed_bodies(model: str, max_seq_len: int) -> list[tuple[str, bytes]]:
    """Named bad request bodies for POST /v1/completions (each must get a 4xx)."""
    ok = {"model": model, "prompt": "def f():", "max_tokens": 4}
    j = lambda **kw: json.dumps({**ok, **kw}).encode()  # noqa: E731
    no = lambda key: json.dumps({k: v for k, v in ok.items() if k != key}).encode()  # noqa: E731
    return [
        ("invalid json", b"{\"model\": "), ("not an object", b"[1, 2, 3]"), ("empty body", b""),
        ("bad utf-8", b"\xff\xfe\xfa"), ("missing model", no("model")), ("missing prompt", no("prompt")),
        ("model not a string", j(model=7)), ("unknown model", j(model="gpt-4")),
        ("unknown version", j(model=model + "@v9999")), ("max_tokens 0", j(max_tokens=0)),
        ("max_tokens negative", j(max_tokens=-5)), ("max_tokens huge", j(max_tokens=10**9)),
        ("max_tokens string", j(max_tokens="8")), ("max_tokens bool", j(max_tokens=True)),
        ("max_tokens float", j(max_tokens=2.5)), ("prompt too long", j(prompt="x = 1\n" * (2 * max_seq_len))),
        ("empty prompt", j(prompt="")), ("prompt number", j(prompt=3)), ("prompt batch mixed", j(prompt=["a", 5])),
        ("prompt bad ids", j(prompt=[1, -4])), ("temperature negative", j(temperature=-1)),
        ("temperature string", j(temperature="hot")), ("top_p zero", j(top_p=0)), ("stream string", j(stream="yes")),
        ("n 0", j(n=0)), ("stop number", j(stop=5)), ("stop too many", j(stop=["a", "b", "c", "d", "e"])),
        ("seed float", j(seed=1.5)), ("echo string", j(echo="yes")), ("oversize body", j(prompt="y" * 200_000)),
        # hostile bodies that once crashed the server (500s, a dead stream)
        ("nested 30000 deep", b'{"model": "' + model.encode() + b'", "prompt": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"),
        ("5000-digit integer", b'{"model": "' + model.encode() + b'", "prompt": "a", "max_tokens": ' + b"7" * 5000 + b"}"),
        ("lone surrogate", j(prompt="def f():\ud800")), ("400-digit temperature", j(temperature=10**400)),
        ("400-digit top_p", j(top_p=10**400)), ("seed 2**70", j(seed=2**70)), ("seed 2**64", j(seed=2**64)),
        ("seed 2**64 stream", j(seed=2**64, stream=True)), ("NaN temperature", b'{"model": "' + model.encode() +
                                                           b'", "prompt": "a", "temperature": NaN}'),
    ]


async def _storm(url: str, n: int, progress: bool = True) -> dict[str, Any]:
    url = check_url(url)
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        info = (await client.get(url + "/v1/models")).json()
        model = info["data"][0]["id"]
        bodies = malformed_bodies(model, 1024)
        statuses: dict[str, int] = {}
        bad_shape: list[str] = []
        for i in progress_bar(range(n), desc="malformed requests", enabled=progress, unit="req"):
            name, body = bodies[i % len(bodies)]
            r = await client.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"})
            statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
            try:
                e = r.json()["error"]
                assert isinstance(e["message"], str) and "type" in e and "param" in e and "code" in e
            except Exception:  # noqa: BLE001 (any failure means the shape is wrong)
                bad_shape.append(name)
        for path, method in (("/v1/completions", "GET"), ("/v1/nope", "POST")):
            r = await client.request(method, url + path)
            statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
        healthy = (await client.get(url + "/health")).status_code == 200
    return {"sent": n + 2, "statuses": statuses, "server_errors": sum(v for k, v in statuses.items() if k[0] == "5"),
            "non_4xx": sum(v for k, v in statuses.items() if k[0] != "4"), "bad_error_shape": sorted(set(bad_shape)),
            "healthy_after": healthy}


def malformed_storm(url: str, n: int = 200, progress: bool = True) -> dict[str, Any]:
    """Send ``n`` malformed completions (cycling :func:`malformed_bodies`) plus a wrong method
    and an unknown route; count statuses, check the OpenAI error shape, then /health.
    ``progress``: a tqdm bar over the ``n`` requests."""
    return run_sync(lambda: _storm(url, n, progress))
