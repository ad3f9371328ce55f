"""/v1/completions as vLLM serves a base model: batches of prompts, n and best_of, logprobs and
echo held to a forward pass, presence / frequency penalties held to a hand computation,
fill-in-the-middle through ``suffix``, streaming of each, and the refusals (400 naming the field)."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest
import torch

from codex_lab.data.fim import fim_prompt_ids
from codex_lab.infer.engine.loop import Engine
from codex_lab.infer.generate import generate_ids
from codex_lab.infer.sampling import SamplingParams, apply_penalties, token_logprobs
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.serve.app import serve_in_background
from codex_lab.serve.router import ModelServer, ServerConfig

NAME = "tiny"
# float32 logits of one prompt computed two ways (the engine's cached decode vs one full forward)
# differ by rounding only: ~1e-6 for this 2-layer model; 1e-4 leaves room and still catches any
# real error (a wrong position or a missing log-softmax is off by > 0.1)
TOL = 1e-4


@pytest.fixture(scope="module")
def served(small_corpus):
    from codex_lab.data.tokenizer import train_tokenizer

    tok = train_tokenizer(small_corpus.texts("train")[:10], vocab_size=400)
    torch.manual_seed(0)
    model = CodexModel(ModelConfig(vocab_size=tok.vocab_size, d_model=64, n_layer=2, n_head=4, max_seq_len=256)).eval()
    srv = ModelServer(tok, ServerConfig(model_name=NAME, max_batch_size=4, max_waiting=16, fim_format="psm"))
    srv.add_version("v0001", model)
    bg = serve_in_background(srv)
    yield bg, srv, tok, model
    bg.stop()


def post(bg, body: dict, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(bg.url + path, json=body, timeout=60)


def sse(bg, body: dict) -> list[dict]:
    chunks = []
    with httpx.stream("POST", bg.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


@torch.no_grad()
def forward_logp(model, ids: list[int]) -> torch.Tensor:
    """log-softmax of one full forward over ``ids``: row t predicts ids[t + 1]. (T, V)"""
    return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def greedy(model, tok, ids: list[int], n: int) -> list[int]:
    return generate_ids(model, ids, max_new_tokens=n, eos_id=tok.eot_id)[0]


# ---- penalties: the formula, by hand ----------------------------------------------------------
def test_penalties_equal_hand_computation():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    out = apply_penalties(logits, [2, 2, 1], presence=0.5, frequency=0.25)
    # token 2 seen twice: 3 - 2*0.25 - 0.5 = 2.0; token 1 once: 2 - 0.25 - 0.5 = 1.25; others unchanged
    assert out.tolist() == [[1.0, 1.25, 2.0, 0.5]]
    assert torch.equal(apply_penalties(logits, [], 1.0, 1.0), logits)  # nothing generated: no change
    neg = apply_penalties(logits, [0], presence=-1.0, frequency=0.0)  # a negative penalty favours repeats
    assert neg.tolist() == [[2.0, 2.0, 3.0, 0.5]]


def test_penalties_change_greedy_decoding_same_in_engine_and_generator(served):
    _, _, tok, model = served
    ids = tok.encode("def f(x):\n    return")
    p = SamplingParams(max_tokens=12, frequency_penalty=2.0, presence_penalty=2.0)
    eng = Engine(model, tok, max_batch_size=2)
    eng.submit(ids, p)
    eng.submit(ids, SamplingParams(max_tokens=12))
    fins = sorted(eng.run_until_done(), key=lambda f: f.rid)
    ref_pen = generate_ids(model, ids, p, eos_id=tok.eot_id)[0]
    assert fins[0].output_ids == ref_pen  # the engine and the plain generator share the one sampling path
    assert fins[1].output_ids == greedy(model, tok, ids, 12)
    # by hand: each penalised step's choice is the argmax of logits - penalties over the tokens so far
    lp_ids = list(ids)
    for t in ref_pen:
        logits = forward_logp(model, lp_ids)[-1]  # log-softmax differs from logits by a constant per row
        gen = lp_ids[len(ids):]
        assert int(apply_penalties(logits[None], gen, 2.0, 2.0).argmax()) == t
        lp_ids.append(t)
    assert fins[0].output_ids != fins[1].output_ids, "penalties of 2.0 did not change a 12-token greedy output"


def test_logit_bias_bans_and_forces_tokens(served):
    bg, _, tok, model = served
    ids = tok.encode("def f(x):\n")
    first = greedy(model, tok, ids, 1)[0]
    body = {"model": NAME, "prompt": ids, "max_tokens": 3, "temperature": 0, "logprobs": 0}
    banned = post(bg, {**body, "logit_bias": {str(first): -100}}).json()["choices"][0]
    assert banned["logprobs"]["tokens"][0] != tok.decode([first])
    forced = post(bg, {**body, "logit_bias": {"42": 100}}).json()["choices"][0]
    assert forced["logprobs"]["tokens"] == [tok.decode([42])] * 3
    # logprobs stay the model's own: the forced token's is its raw log-softmax, not ~0
    assert abs(forced["logprobs"]["token_logprobs"][0] - float(forward_logp(model, ids)[-1, 42])) < TOL


def test_an_ending_end_of_text_is_listed_with_its_logprob(served):
    bg, _, tok, model = served
    ids = tok.encode("x = 1\n")
    body = {"model": NAME, "prompt": ids, "max_tokens": 4, "temperature": 0, "logprobs": 1, "echo": True,
            "logit_bias": {str(tok.eot_id): 100}}
    c = post(bg, body).json()["choices"][0]
    assert c["finish_reason"] == "stop" and c["text"] == tok.decode(ids)  # nothing generated but the end
    lp = c["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 1 and lp["tokens"][-1] == tok.decode([tok.eot_id])
    assert abs(lp["token_logprobs"][-1] - float(forward_logp(model, ids)[-1, tok.eot_id])) < TOL
    streamed = [c for ch in sse(bg, body) for c in ch["choices"]]
    assert sum(len(c["logprobs"]["tokens"]) for c in streamed) == len(ids) + 1


# ---- logprobs and echo against a forward pass ------------------------------------------------
def test_logprobs_and_echo_equal_forward_log_softmax(served):
    bg, _, tok, model = served
    ids = tok.encode("import os\n\ndef main():\n")
    r = post(bg, {"model": NAME, "prompt": ids, "max_tokens": 6, "temperature": 0, "logprobs": 3, "echo": True})
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    out = greedy(model, tok, ids, 6)
    full = ids + out
    lp = c["logprobs"]
    assert len(lp["tokens"]) == len(full) and lp["tokens"] == [tok.decode([t]) for t in full]
    assert c["text"] == tok.decode(ids) + tok.decode(out)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # the first token has no context
    ref = forward_logp(model, full)  # (T, V)
    for t in range(1, len(full)):
        assert abs(lp["token_logprobs"][t] - float(ref[t - 1, full[t]])) < TOL, t
        vals, idx = torch.topk(ref[t - 1], 3)
        top = lp["top_logprobs"][t]
        assert len(top) <= 3
        want: dict[str, float] = {}
        for i, v in zip(idx.tolist(), vals.tolist()):
            want.setdefault(tok.decode([i]), v)  # two ids with one text: the likelier is reported
        assert top.keys() == want.keys() and all(abs(top[s] - want[s]) < TOL for s in want)
    # greedy: every generated token is its position's most likely one
    for t in range(len(ids), len(full)):
        assert abs(lp["token_logprobs"][t] - max(lp["top_logprobs"][t].values())) < TOL
    # text_offset: where each token's text starts in the returned text
    offs = lp["text_offset"]
    assert offs[0] == 0 and all(offs[k + 1] == offs[k] + len(lp["tokens"][k]) for k in range(len(full) - 1))


def test_echo_only_scores_the_prompt(served):
    bg, _, tok, model = served
    texts = ["def add(a, b):\n    return a + b\n", "x = 1\n"]
    r = post(bg, {"model": NAME, "prompt": texts, "max_tokens": 0, "echo": True, "logprobs": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for text, c in zip(texts, body["choices"]):
        ids = tok.encode(text)
        assert c["text"] == text
        ref = forward_logp(model, ids)
        want = [float(ref[t - 1, ids[t]]) for t in range(1, len(ids))]
        assert all(abs(a - b) < TOL for a, b in zip(c["logprobs"]["token_logprobs"][1:], want))
        assert c["logprobs"]["top_logprobs"][1] == {}  # logprobs=0: the token's own logprob, no alternatives
    assert body["usage"]["completion_tokens"] == 0
    assert body["usage"]["prompt_tokens"] == sum(len(tok.encode(t)) for t in texts)


# ---- batches, n, best_of ------------------------------------------------------------------------
def test_batched_prompts_answer_in_one_response(served):
    bg, _, tok, model = served
    texts = ["def add(a, b):\n", "class Foo:\n", "import sys\n"]
    client = openai.OpenAI(base_url=bg.url + "/v1", api_key="unused", max_retries=0)
    r = client.completions.create(model=NAME, prompt=texts, max_tokens=8, temperature=0)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    for c in r.choices:
        assert c.text == tok.decode(greedy(model, tok, tok.encode(texts[c.index]), 8))
    ids = [tok.encode(t) for t in texts]
    r2 = post(bg, {"model": NAME, "prompt": ids, "max_tokens": 8, "temperature": 0}).json()
    assert [c["text"] for c in sorted(r2["choices"], key=lambda c: c["index"])] == [
        c.text for c in sorted(r.choices, key=lambda c: c.index)]
    assert r2["usage"]["prompt_tokens"] == sum(map(len, ids))


def test_n_and_best_of(served):
    bg, _, tok, model = served
    body = {"model": NAME, "prompt": ["def f(x):\n", "y = "], "max_tokens": 6, "temperature": 1.0, "seed": 7,
            "logprobs": 0}
    three = post(bg, {**body, "n": 3}).json()["choices"]
    assert [c["index"] for c in three] == list(range(6))  # index = prompt * n + rank
    assert len({c["text"] for c in three[:3]}) > 1, "three seeded samples were identical"
    again = post(bg, {**body, "n": 3}).json()["choices"]
    assert [c["text"] for c in again] == [c["text"] for c in three]  # same seed, same samples
    best = post(bg, {**body, "n": 1, "best_of": 3}).json()["choices"]
    assert [c["index"] for c in best] == [0, 1]
    for i in range(2):  # best_of keeps the sample with the highest cumulative logprob among the same three
        sums = [sum(c["logprobs"]["token_logprobs"]) for c in three[3 * i:3 * i + 3]]
        assert abs(sum(best[i]["logprobs"]["token_logprobs"]) - max(sums)) < 1e-6
        assert best[i]["text"] == three[3 * i + sums.index(max(sums))]["text"]


# ---- streaming with each -------------------------------------------------------------------------
def test_streaming_batches_n_logprobs_echo_match_the_plain_answer(served):
    bg, _, _, _ = served
    body = {"model": NAME, "prompt": ["def f(x):\n", "import os\n"], "max_tokens": 7, "temperature": 0.8,
            "seed": 3, "n": 2, "logprobs": 2, "echo": True, "presence_penalty": 0.5, "frequency_penalty": 0.5,
            "stream_options": {"include_usage": True}}
    plain_body = {k: v for k, v in body.items() if k != "stream_options"}
    plain = post(bg, plain_body).json()
    chunks = sse(bg, body)
    texts: dict[int, str] = {}
    lps: dict[int, dict] = {}
    for ch in chunks[:-1]:
        for c in ch["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
            if c["logprobs"]:
                acc = lps.setdefault(c["index"], {k: [] for k in c["logprobs"]})
                for k, v in c["logprobs"].items():
                    acc[k] += v
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == plain["usage"]
    for c in plain["choices"]:
        assert texts[c["index"]] == c["text"]
        assert lps[c["index"]]["tokens"] == c["logprobs"]["tokens"]
        assert lps[c["index"]]["text_offset"] == c["logprobs"]["text_offset"]
        for a, b in zip(lps[c["index"]]["token_logprobs"], c["logprobs"]["token_logprobs"]):
            assert (a is None and b is None) or abs(a - b) < 1e-6


# ---- fill-in-the-middle ----------------------------------------------------------------------------
def test_suffix_is_served_by_fim_prompt(served):
    bg, _, tok, model = served
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    r = post(bg, {"model": NAME, "prompt": prefix, "suffix": suffix, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    ids = fim_prompt_ids(tok, prefix, suffix, "psm")
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    want = greedy(model, tok, ids, 8)
    # in FIM mode a generated sentinel does not end the answer; the text leaves it out (skip_special_tokens)
    assert r.json()["choices"][0]["text"] == tok.decode(want, skip_special_tokens=True)
    streamed = "".join(c["text"] for ch in sse(bg, {"model": NAME, "prompt": prefix, "suffix": suffix, "max_tokens": 8,
                                                     "temperature": 0}) for c in ch["choices"])
    assert streamed == r.json()["choices"][0]["text"]
    raw = post(bg, {"model": NAME, "prompt": prefix, "suffix": suffix, "max_tokens": 8, "temperature": 0,
                    "skip_special_tokens": False, "spaces_between_special_tokens": False}).json()
    assert raw["choices"][0]["text"] == tok.decode(want)  # asked for: every token's text, control tokens too


def test_suffix_refused_without_fim_training(small_corpus):
    from codex_lab.data.tokenizer import train_tokenizer

    tok = train_tokenizer(small_corpus.texts("train")[:5], vocab_size=300)
    model = CodexModel(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layer=1, n_head=2, max_seq_len=64)).eval()
    srv = ModelServer(tok, ServerConfig(model_name=NAME))
    srv.add_version("v1", model)
    bg = serve_in_background(srv)
    try:
        r = post(bg, {"model": NAME, "prompt": "a", "suffix": "b"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
        assert "fill-in-the-middle" in r.json()["error"]["message"]
    finally:
        bg.stop()
        srv.close()


# ---- chat, tokenizer routes, refusals ---------------------------------------------------------------
def test_chat_completions_says_base_model(served):
    bg, _, _, _ = served
    r = post(bg, {"model": NAME, "messages": [{"role": "user", "content": "hi"}]}, "/v1/chat/completions")
    assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]
    client = openai.OpenAI(base_url=bg.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="base code model"):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}])


def test_tokenize_and_detokenize(served):
    bg, _, tok, _ = served
    ids = httpx.post(bg.url + "/tokenize", json={"prompt": "def f(): pass"}).json()["tokens"]
    assert ids == tok.encode("def f(): pass")
    assert httpx.post(bg.url + "/detokenize", json={"tokens": ids}).json()["prompt"] == "def f(): pass"
    info = httpx.get(bg.url + "/tokenizer_info").json()
    assert info["eos_token"] == "<|endoftext|>" and info["model_max_length"] == 256


@pytest.mark.parametrize("extra, param", [
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"n": 3, "best_of": 2}, "best_of"),
    ({"n": 0}, "n"),
    ({"n": 2, "best_of": 3, "stream": True}, "best_of"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"echo": "yes"}, "echo"),
    ({"prompt": ["ok", ""]}, "prompt"),
    ({"prompt": [[1, 2], []]}, "prompt"),
    ({"prompt": [[1, 2], [99999]]}, "prompt"),
    ({"prompt": ["a"] * 40, "n": 2}, "n"),
    ({"suffix": "x", "echo": True}, "echo"),
    ({"suffix": "x", "prompt": [1, 2]}, "prompt"),
    ({"suffix": "<|fim_middle|>"}, "suffix"),
    ({"logit_bias": {"1": 500}}, "logit_bias"),
    ({"logit_bias": {"x": 5}}, "logit_bias"),
    ({"logit_bias": {"99999": 5}}, "logit_bias"),
    ({"logit_bias": [1]}, "logit_bias"),
])
def test_bad_fields_fail_alone_with_400_naming_the_field(served, extra, param):
    bg, srv, _, _ = served
    body = {"model": NAME, "prompt": "def f():", "max_tokens": 4, **extra}
    raw = json.dumps(body, allow_nan=True)
    r = httpx.post(bg.url + "/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
    assert srv.in_flight == 0  # nothing admitted is left behind
    ok = post(bg, {"model": NAME, "prompt": "x", "max_tokens": 2})  # the next request is served
    assert ok.status_code == 200


def test_token_logprobs_of_a_row(served):
    logits = torch.tensor([0.0, math.log(3.0)])
    e = token_logprobs(logits, 0, 2)  # p = (1/4, 3/4)
    assert abs(e.logprob - math.log(0.25)) < 1e-6 and e.top[0][0] == 1 and abs(e.top[0][1] - math.log(0.75)) < 1e-6


@pytest.mark.parametrize("stream", [True, False])
def test_client_leaving_a_batched_request_frees_every_choice(served, stream):
    bg, srv, _, _ = served
    import time

    from codex_lab.serve.metrics import parse_metrics

    def disconnected() -> float:
        m = parse_metrics(httpx.get(bg.url + "/metrics").text)
        return sum(v for lab, v in m.get("codex_lab:request_errors_total", []) if lab["kind"] == "disconnected")

    before = disconnected()
    body = {"model": NAME, "prompt": ["def f(x):\n", "y = "], "n": 2, "max_tokens": 200, "temperature": 1.0,
            "seed": 1, "stream": stream, "logit_bias": {str(srv.tokenizer.eot_id): -100}}  # no early end
    if stream:  # leave after the first bytes
        with httpx.stream("POST", bg.url + "/v1/completions", json=body, timeout=60) as r:
            for _ in r.iter_bytes():
                break
    else:  # leave before the answer, once the server is generating (a raw socket: no client-side race)
        import json as _json
        import socket
        from urllib.parse import urlparse

        u = urlparse(bg.url)
        payload = _json.dumps(body).encode()
        sock = socket.create_connection((u.hostname, u.port), timeout=10)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: " + u.hostname.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: " + str(len(payload)).encode() +
                     b"\r\n\r\n" + payload)
        t0 = time.time()
        while time.time() - t0 < 15 and srv.health()["running"] < 4:
            time.sleep(0.01)
        assert srv.health()["running"] == 4, srv.health()  # all four choices are being generated
        sock.close()
    t0 = time.time()
    while time.time() - t0 < 15:  # all four engine requests are cancelled and released
        h = srv.health()
        if h["in_flight"] == 0 and h["running"] == 0 and h["waiting"] == 0:
            break
        time.sleep(0.05)
    h = srv.health()
    assert h["in_flight"] == 0 and h["running"] == 0 and h["waiting"] == 0, h
    assert disconnected() - before == 4  # each choice was cancelled as disconnected, none ran to 200 tokens
