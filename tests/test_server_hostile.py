"""The server against hostile clients: hundreds of malformed bodies (0 answers in 5xx), tiny
temperatures, Host / Content-Type / API-key checks, 429 with Retry-After, slow and
half-sent requests, the connection cap, and the serve command's flag checks.

The malformed-body test prints its figures (bodies tried, statuses, 5xx count) for the README.
"""

from __future__ import annotations

import json
import socket
import time
from collections import Counter

import httpx
import openai
import pytest
import torch

from codex_lab.infer.generate import generate_ids
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.serve.app import serve_in_background
from codex_lab.serve.router import ModelServer, ServerConfig
from codex_lab.serve.loadtest import malformed_bodies

NAME = "tiny"
KEY = "s3cret-key"


def make_model(vocab: int) -> CodexModel:
    torch.manual_seed(0)
    return CodexModel(ModelConfig(vocab_size=vocab, d_model=64, n_layer=2, n_head=4, max_seq_len=256)).eval()


@pytest.fixture(scope="module")
def model(small_tokenizer):
    return make_model(small_tokenizer.vocab_size)


@pytest.fixture(scope="module")
def served(small_tokenizer, model):
    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME, max_batch_size=4, max_waiting=8,
                                                    header_timeout_s=1.0, body_timeout_s=1.0))
    srv.add_version("v0001", model)
    bg = serve_in_background(srv)
    yield bg, srv
    bg.stop()


def _raw(base: dict, field: str, raw: str) -> bytes:
    """``base`` as JSON with ``field`` set to the literal JSON text ``raw`` (NaN, 10**400, ...)."""
    return json.dumps({**base, field: "__RAW__"}).replace('"__RAW__"', raw).encode()


BIG = "9" * 400  # an integer too large for a float
# per field, values that are all invalid for it (as literal JSON text)
BAD_VALUES: dict[str, list[str]] = {
    "model": ["7", "null", '""', '"gpt-4"', f'"{NAME}@v9"', '"\\ud800"', "[]", "{}", "true", BIG],
    "prompt": ['""', "3", "[]", '["a", 3]', "[1, -4]", "[1000000000000000000000000000000]", "[true]", '{"a": 1}',
              '"\\ud800"', '"def f():\\udfff"', "null", "1.5", "[[1], []]", "[1.0]"],
    "max_tokens": ["0", "-5", "1000000000", '"8"', "true", "2.5", "[]", "{}", "NaN", "Infinity", BIG, "-" + BIG,
                   "1e400"],
    "temperature": ["-1", '"hot"', "true", "2.5", "NaN", "Infinity", "-Infinity", BIG, "-" + BIG, "1e400", "[]",
                    "{}", '"0.5"'],
    "top_p": ["0", "-0.5", "1.5", "NaN", "Infinity", BIG, '"1"', "true", "[]", "1e-400"],
    "top_k": ["-1", "1.5", '"3"', "true", "[]", "-" + BIG],
    "stop": ["5", '["a", 3]', '[""]', '""', '["a", "b", "c", "d", "e"]', '{"a": 1}', '["\\ud800"]', "[[]]", "true"],
    "seed": ["1.5", '"7"', "true", str(2**70), str(2**64), str(-(2**63) - 1), BIG, "[]", "NaN"],
    "stream": ['"yes"', "1", "0", "[]", "{}", '"true"', "NaN"],
    "n": ["65", "0", "-1", '"1"', "1.5", BIG],
    "echo": ['"true"', "1"],
    "logprobs": ["21", "-1", '"5"', "1.5"],
    "best_of": ["0", '"2"'],
    "presence_penalty": ["2.5", "NaN", BIG],
    "logit_bias": ['{"1": 101}', '{"x": 1}', "[1]"],
    "suffix": ['"x"'],
}


def hostile_bodies() -> list[tuple[str, bytes]]:
    """At least 200 named bodies, each one a client error."""
    out = [(n, b) for n, b in malformed_bodies(NAME, 256)]
    for stream in (False, True):
        base = {"model": NAME, "prompt": "def f():", "max_tokens": 4, "stream": stream}
        for field, values in BAD_VALUES.items():
            if field == "stream" and stream:
                continue
            out += [(f"{field}={v[:20]} stream={stream}", _raw(base, field, v)) for v in values]
        out += [(f"stream_options={v} stream={stream}", _raw(base, "stream_options", v))
                for v in ('"x"', '{"include_usage": "yes"}', "[]", "5") + (() if stream else ('{"include_usage": true}',))]
    depth = 30_000
    out += [
        ("nested object 30000 deep", b'{"a": ' * depth + b"1" + b"}" * depth),
        ("nested list as stop", b'{"model": "tiny", "prompt": "a", "stop": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"),
        ("truncated", b'{"model": "tiny", "prompt": "a'), ("trailing garbage", b'{"model": "tiny"} xyz'),
        ("json null", b"null"), ("json string", b'"hello"'), ("json number", b"42"), ("json true", b"true"),
        ("NUL byte", b'{"model": "tiny",\x00 "prompt": "a"}'), ("utf-16 body", '{"model": "tiny"}'.encode("utf-16")),
        ("overlong utf-8", b'{"model": "tiny", "prompt": "\xc0\xaf"}'), ("BOM then garbage", b"\xef\xbb\xbf{"),
        ("huge exponent", b'{"model": "tiny", "prompt": "a", "temperature": 1e999999}'),
        ("only whitespace", b"   \n\t "), ("5000-digit seed", b'{"model": "tiny", "prompt": "a", "seed": ' + b"1" * 5000 + b"}"),
    ]
    return out


def test_hostile_bodies_all_get_openai_4xx(served):
    bg, srv = served
    bodies = hostile_bodies()
    assert len(bodies) >= 200
    statuses: Counter = Counter()
    wrong = []
    with httpx.Client(timeout=30) as client:
        for name, body in bodies:
            r = client.post(bg.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
            statuses[r.status_code] += 1
            try:
                err = r.json()["error"]
                shaped = set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)
            except Exception:  # noqa: BLE001 (not JSON or not an error: the shape is wrong)
                shaped = False
            if not (400 <= r.status_code < 500 and shaped):
                wrong.append((name, r.status_code, r.text[:120]))
    five = sum(n for s, n in statuses.items() if s >= 500)
    print(f"\nhostile bodies: {len(bodies)} tried, statuses {dict(sorted(statuses.items()))}, 5xx: {five}")
    assert wrong == [] and five == 0, wrong[:10]
    # the server is fine afterwards and no client error was counted against the model version
    ok = httpx.post(bg.url + "/v1/completions", json={"model": NAME, "prompt": "a", "max_tokens": 2})
    assert ok.status_code == 200
    assert srv.metrics.version_counts("v0001")["failures"] == 0
    assert srv.health()["status"] == "ok" and srv.health()["in_flight"] == 0


EXTREME_BUT_VALID = [
    {"temperature": 1.0, "top_p": 5e-324}, {"temperature": 1.0, "top_p": 1e-300}, {"temperature": 2e-6, "top_p": 1e-300},
    {"temperature": 1.0, "top_k": 10**30}, {"temperature": 2.0, "top_k": 1}, {"temperature": 1e-6},
    {"seed": -1, "temperature": 1.0}, {"seed": 2**64 - 1, "temperature": 0.7}, {"prompt": "\x00\x00"},
    {"prompt": "\uffff\U0001F600"}, {"stop": ["\x00"]}, {"model": NAME + "@"}, {"prompt": [0]},
    {"user": "x", "best_of": 1, "logit_bias": {"1": 100}, "echo": False, "logprobs": None},
]


@pytest.mark.parametrize("stream", [False, True])
def test_extreme_but_valid_requests_are_served(served, stream):
    bg, srv = served
    for extra in EXTREME_BUT_VALID:
        body = {"model": NAME, "prompt": "def f():", "max_tokens": 4, "stream": stream, **extra}
        r = httpx.post(bg.url + "/v1/completions", content=json.dumps(body), timeout=30,
                       headers={"content-type": "application/json"})
        assert r.status_code == 200, (extra, r.text[:200])
        assert r.text.rstrip().endswith("data: [DONE]") if stream else r.json()["choices"][0]["finish_reason"] in (
            "stop", "length")
    assert srv.metrics.version_counts("v0001")["failures"] == 0


@pytest.mark.parametrize("t", [1e-38, 1e-300, 5e-324])
def test_tiny_temperatures_are_greedy_and_keep_the_engine_alive(served, small_tokenizer, model, t):
    bg, srv = served
    ref = small_tokenizer.decode(generate_ids(model, small_tokenizer.encode("def f():"), max_new_tokens=8,
                                              eos_id=small_tokenizer.eot_id)[0])
    body = {"model": NAME, "prompt": "def f():", "max_tokens": 8, "temperature": t, "seed": 3}
    r = httpx.post(bg.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == ref
    with httpx.stream("POST", bg.url + "/v1/completions", json={**body, "stream": True}, timeout=30) as s:
        lines = [ln for ln in s.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert "".join(json.loads(ln[6:])["choices"][0]["text"] for ln in lines[:-1]) == ref
    assert srv.health()["dead_engines"] == []


def test_host_header_allow_list(served, small_tokenizer, model):
    bg, _ = served
    port = bg.port
    body = {"model": NAME, "prompt": "a", "max_tokens": 1}
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil", "0.0.0.0"):
        r = httpx.post(bg.url + "/v1/completions", json=body, headers={"host": host})
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", host
        assert httpx.get(bg.url + "/v1/models", headers={"host": host}).status_code == 403
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", "LOCALHOST"):
        assert httpx.post(bg.url + "/v1/completions", json=body, headers={"host": host}).status_code == 200, host
    # a configured allow-list replaces the default
    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME, allowed_hosts=("codex.test",)))
    srv.add_version("v0001", model)
    bg2 = serve_in_background(srv)
    try:
        assert httpx.get(bg2.url + "/v1/models", headers={"host": "codex.test:80"}).status_code == 200
        assert httpx.get(bg2.url + "/v1/models").status_code == 403
    finally:
        bg2.stop()


def test_only_json_bodies(served):
    bg, _ = served
    ok = json.dumps({"model": NAME, "prompt": "a", "max_tokens": 1})
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                  "application/jsonx", "", "text/json"):
        r = httpx.post(bg.url + "/v1/completions", content=ok, headers={"content-type": ctype})
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", ctype
    r = httpx.post(bg.url + "/v1/completions", content=ok, headers={"content-type": "Application/JSON; charset=utf-8"})
    assert r.status_code == 200


def test_api_key(small_tokenizer, model):
    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME, api_key=KEY))
    srv.add_version("v0001", model)
    bg = serve_in_background(srv)
    try:
        body = {"model": NAME, "prompt": "a", "max_tokens": 2}
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}, {"authorization": "Basic " + KEY},
                        {"authorization": f"Bearer {KEY}x"}):
            r = httpx.post(bg.url + "/v1/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", headers
        assert httpx.get(bg.url + "/metrics").status_code == 401
        assert httpx.get(bg.url + "/v1/models").status_code == 401
        assert httpx.get(bg.url + "/health").status_code == 200  # liveness probes need no key
        r = httpx.post(bg.url + "/v1/completions", json=body, headers={"authorization": f"Bearer {KEY}"})
        assert r.status_code == 200
        good = openai.OpenAI(base_url=bg.url + "/v1", api_key=KEY, max_retries=0)
        assert good.completions.create(model=NAME, prompt="a", max_tokens=2).usage.completion_tokens >= 1
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=bg.url + "/v1", api_key="nope", max_retries=0).models.list()
    finally:
        bg.stop()


def long_prompt(model, tok, n: int) -> str:
    """A prompt whose greedy continuation does not reach end-of-text within n tokens."""
    for p in ("def f():\n", "x = 1\n", "import os\n", "class A:\n", "a", "for i in range(3):\n"):
        if len(generate_ids(model, tok.encode(p), max_new_tokens=n, eos_id=tok.eot_id)[0]) == n:
            return p
    raise AssertionError("every candidate prompt reaches end-of-text; change the model seed")


def test_full_server_says_429_with_retry_after(small_tokenizer, model):
    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME, max_batch_size=1, max_waiting=0))
    srv.add_version("v0001", model, step_delay_s=0.05)  # 100 tokens: about 5 s
    bg = serve_in_background(srv)
    prompt = long_prompt(model, small_tokenizer, 100)
    try:
        with httpx.stream("POST", bg.url + "/v1/completions", timeout=30,
                          json={"model": NAME, "prompt": prompt, "max_tokens": 100, "stream": True}) as s:
            lines = s.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)  # the one slot is taken
            r = httpx.post(bg.url + "/v1/completions", json={"model": NAME, "prompt": "a", "max_tokens": 1})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
    finally:
        bg.stop()


def _open(bg, data: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", bg.port), timeout=10)
    if data:
        s.sendall(data)
    return s


def _closed_within(s: socket.socket, seconds: float) -> bool:
    """True if the server closes ``s`` (recv returns b"" or a full response, then EOF) in time."""
    s.settimeout(seconds)
    try:
        while s.recv(65536):
            pass
        return True
    except (socket.timeout, TimeoutError):
        return False
    except ConnectionResetError:
        return True
    finally:
        s.close()


def test_slow_and_half_sent_requests_are_cut(served):
    bg, _ = served  # header and body timeouts: 1 s
    partial = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    socks = [_open(bg, partial) for _ in range(40)] + [_open(bg) for _ in range(10)]  # half-sent and silent
    t0 = time.time()
    assert all(_closed_within(s, 5.0) for s in socks)
    assert time.time() - t0 < 6.0
    # a body that never finishes: 408 after the body timeout
    s = _open(bg, partial + b"Content-Length: 100\r\n\r\n{\"model\": ")
    s.settimeout(5.0)
    head = s.recv(4096)
    s.close()
    assert head.startswith(b"HTTP/1.1 408"), head[:60]
    assert httpx.post(bg.url + "/v1/completions", json={"model": NAME, "prompt": "a", "max_tokens": 1}).status_code == 200


def test_connection_cap(small_tokenizer, model):
    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME, max_connections=8, header_timeout_s=5.0))
    srv.add_version("v0001", model)
    bg = serve_in_background(srv)
    try:
        held = [_open(bg) for _ in range(8)]
        time.sleep(0.2)
        extra = _open(bg)
        extra.settimeout(5)
        answer = extra.recv(4096)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in answer.lower()
        for s in held:
            s.close()
        time.sleep(0.2)
        assert httpx.get(bg.url + "/v1/models").status_code == 200
    finally:
        bg.stop()


@pytest.mark.parametrize("flags,fragment", [
    (["--deadline-s", "-5"], "--deadline-s"), (["--deadline-s", "nan"], "--deadline-s"),
    (["--deadline-s", "1e9"], "--deadline-s"), (["--max-waiting", "-100"], "--max-waiting"),
    (["--max-batch-size", "0"], "--max-batch-size"), (["--max-tokens", "-1"], "--max-tokens"),
    (["--body-timeout-s", "inf"], "--body-timeout-s"), (["--max-connections", "0"], "--max-connections"),
    (["--port", "99999"], "--port"), (["--allowed-hosts", ","], "--allowed-hosts"),
])
def test_serve_flags_are_validated(capsys, flags, fragment):
    from codex_lab.cli import main

    assert main(["serve", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err, err


def test_api_key_from_environment(monkeypatch):
    from codex_lab.cli import build_parser
    from codex_lab.commands.serve import API_KEY_ENV, build_config

    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert build_config(build_parser().parse_args(["serve"])).api_key == "from-env"
    assert build_config(build_parser().parse_args(["serve", "--api-key", "flag"])).api_key == "flag"
    monkeypatch.delenv(API_KEY_ENV)
    assert build_config(build_parser().parse_args(["serve"])).api_key is None


def test_guard_helpers():
    from codex_lab.serve.security import bearer_ok, host_allowed, host_name, is_json

    assert host_name("[::1]:8000") == "::1" and host_name("LocalHost:80") == "localhost" and host_name("::1") == "::1"
    assert host_allowed("127.0.0.1:9", ("127.0.0.1",)) and not host_allowed("127.0.0.1.nip.io", ("127.0.0.1",))
    assert not host_allowed(None, ("localhost",)) and not host_allowed("", ("localhost",))
    assert host_allowed("anything.example", ("*",))
    assert bearer_ok("Bearer k1", "k1") and bearer_ok("bearer  k1 ", "k1")
    assert not bearer_ok("Bearer k", "k1") and not bearer_ok("k1", "k1") and not bearer_ok(None, "k1")
    assert is_json("application/json") and is_json("application/json; charset=utf-8")
    assert not is_json("application/json-seq") and not is_json(None) and not is_json("text/plain")


def _metric(bg, kind: str) -> float:
    text = httpx.get(bg.url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("codex_lab:request_errors_total{") and f'kind="{kind}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_trickling_bodies_get_408_and_lose_their_connection(small_tokenizer, model):
    """16 clients trickling a body a byte at a time on --max-connections 16: each gets 408 after
    the body timeout AND its connection is closed, so normal requests then get 200, not 503."""
    import threading

    srv = ModelServer(small_tokenizer, ServerConfig(model_name=NAME, max_connections=16, body_timeout_s=1.0,
                                                    header_timeout_s=5.0, keep_alive_s=30.0))
    srv.add_version("v0001", model)
    bg = serve_in_background(srv)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 4000\r\n\r\n{\"model\": ")
    socks = [_open(bg, head) for _ in range(16)]
    stop = threading.Event()

    def trickle() -> None:  # one byte per connection every 0.1 s, for as long as the server lets it
        while not stop.is_set():
            for s in socks:
                try:
                    s.send(b" ")
                except OSError:
                    pass
            time.sleep(0.1)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        answers = []
        for s in socks:
            s.settimeout(5.0)
            got = b""
            try:
                while True:  # until the server closes the connection (EOF) or 5 s pass
                    b = s.recv(4096)
                    if not b:
                        answers.append((got, "closed"))
                        break
                    got += b
            except (socket.timeout, TimeoutError):
                answers.append((got, "open"))
            except ConnectionResetError:
                answers.append((got, "closed"))
        assert all(a.startswith(b"HTTP/1.1 408") for a, _ in answers), [a[:40] for a, _ in answers]
        assert all(state == "closed" for _, state in answers), Counter(state for _, state in answers)
        # the trickling clients still push bytes; normal requests get through
        codes = [httpx.post(bg.url + "/v1/completions", json={"model": NAME, "prompt": "a", "max_tokens": 1},
                            timeout=10).status_code for _ in range(4)]
        assert codes == [200] * 4, codes
    finally:
        stop.set()
        t.join(5)
        for s in socks:
            s.close()
        bg.stop()


def test_client_hanging_up_mid_body_is_not_an_internal_error(served, caplog):
    """A client that closes its connection halfway through the body: counted as disconnected,
    never as internal, and nothing is logged with a traceback."""
    import logging

    bg, _ = served
    before_internal, before_disc = _metric(bg, "internal"), _metric(bg, "disconnected")
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 400\r\n\r\n{\"model\": \"tiny\", \"prompt\": ")
    with caplog.at_level(logging.INFO):
        for _ in range(5):
            s = _open(bg, head)
            time.sleep(0.05)
            s.close()
        deadline = time.time() + 5
        while _metric(bg, "disconnected") < before_disc + 5 and time.time() < deadline:
            time.sleep(0.05)
    assert _metric(bg, "disconnected") == before_disc + 5
    assert _metric(bg, "internal") == before_internal
    tracebacks = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not tracebacks, [r.getMessage()[:200] for r in tracebacks]
    assert httpx.post(bg.url + "/v1/completions", json={"model": NAME, "prompt": "a", "max_tokens": 1}).status_code == 200


def test_refused_large_body_trickling_after_its_413_is_cut(served):
    """A body declared over the limit gets 413 at once; if the client then trickles the rest,
    the connection is closed after one more body timeout (1 s here) instead of held for ever."""
    bg, _ = served
    s = _open(bg, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 10000000\r\n\r\n{")
    s.settimeout(5.0)
    assert s.recv(4096).startswith(b"HTTP/1.1 413")
    t0, closed = time.time(), False
    while time.time() - t0 < 6.0:
        try:
            s.send(b" ")
            s.settimeout(0.2)
            if s.recv(4096) == b"":
                closed = True
                break
        except (socket.timeout, TimeoutError):
            continue
        except OSError:
            closed = True
            break
    s.close()
    assert closed and time.time() - t0 < 4.0, time.time() - t0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_api_key_flag_is_not_left_in_proc_cmdline(tmp_path):
    """`codex-lab serve --api-key VALUE`: once the server runs, /proc/<pid>/cmdline (readable by
    every local user) does not hold the key; the key still guards the API, and a warning names
    the safer ways."""
    import os
    import subprocess
    import sys

    if not os.path.exists("/proc/self/cmdline"):
        pytest.skip("needs /proc")
    secret, port = "k3y-" + os.urandom(8).hex(), _free_port()
    err = (tmp_path / "err.txt").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "codex_lab.cli", "serve", "--api-key", secret, "--port", str(port),
                             "--no-compile"], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        line = proc.stdout.readline()  # "serving ..." once the model is loaded and the key scrubbed
        assert line.startswith("serving"), line + (tmp_path / "err.txt").read_text()
        cmdline = open(f"/proc/{proc.pid}/cmdline", "rb").read()
        assert secret.encode() not in cmdline and b"--api-key" in cmdline, cmdline
        url = f"http://127.0.0.1:{port}/v1/models"
        deadline = time.time() + 30
        while True:
            try:
                r = httpx.get(url, timeout=5)
                break
            except httpx.TransportError:
                assert time.time() < deadline
                time.sleep(0.2)
        assert r.status_code == 401
        assert httpx.get(url, headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    finally:
        proc.terminate()
        proc.wait(20)
        err.close()
    warning = (tmp_path / "err.txt").read_text()
    assert "CODEX_LAB_API_KEY" in warning and "--api-key-file" in warning and secret not in warning, warning


def test_api_key_file(tmp_path, capsys):
    from codex_lab.cli import build_parser, main
    from codex_lab.commands.serve import build_config

    f = tmp_path / "key"
    f.write_text("from-file-key\n")
    f.chmod(0o600)
    assert build_config(build_parser().parse_args(["serve", "--api-key-file", str(f)])).api_key == "from-file-key"
    f.chmod(0o644)  # readable by others: refused, with the fix
    assert main(["serve", "--api-key-file", str(f)]) == 2
    assert "chmod 600" in capsys.readouterr().err
    f.chmod(0o600)
    assert main(["serve", "--api-key-file", str(f), "--api-key", "x"]) == 2
    assert "--api-key-file" in capsys.readouterr().err
    assert main(["serve", "--api-key-file", str(tmp_path / "nope")]) == 2
    assert "no such file" in capsys.readouterr().err
