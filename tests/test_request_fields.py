"""Every request field is honoured or refused: vLLM's sampling extensions (min_p, repetition_penalty,
min_tokens, ignore_eos, stop_token_ids, include_stop_str_in_output, prompt_logprobs, skip_special_tokens,
spaces_between_special_tokens) held to the semantics vLLM documents, by hand computations and by a
plain loop over full forwards; special tokens out of the text (server, stream, ``generate``) with the
FIM-sentinel rule; ``usage`` counting an ending end-of-text; ``max_tokens`` defaulting to the context;
unknown fields refused (or ignored with --lenient); ``/tokenize``'s options; model cards; and a request
that can never fit the server refused with a 400 naming its capacity (issue 42)."""

from __future__ import annotations

import argparse
import json

import httpx
import pytest
import torch

from codex_lab.infer.generate import generate, output_text
from codex_lab.infer.sampling import (SamplingParams, apply_repetition_penalty, min_p_filter)
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel
from codex_lab.serve.app import serve_in_background
from codex_lab.serve.router import ModelServer, ServerConfig
from codex_lab.serve.protocol import COMPLETION_FIELDS
from codex_lab.serve.api_errors import NO_TOKEN_CAP, Limits

NAME = "tiny"
CTX = 128
# float32 logits of the same context computed by the engine's cached decode and by one full
# forward differ by rounding (~1e-6 here): a greedy pick can only differ on a near-tie, which
# these seeded models do not have on the prompts below (the tests would show it as a mismatch)
TOL = 1e-4


@pytest.fixture(scope="module")
def tok(small_corpus):
    from codex_lab.data.tokenizer import train_tokenizer

    return train_tokenizer(small_corpus.texts("train")[:10], vocab_size=400)


@pytest.fixture(scope="module")
def model(tok):
    torch.manual_seed(0)
    return CodexModel(ModelConfig(vocab_size=tok.vocab_size, d_model=64, n_layer=2, n_head=4, max_seq_len=CTX)).eval()


def _serve(tok, model, **cfg):
    limits = cfg.pop("limits", Limits())
    srv = ModelServer(tok, ServerConfig(model_name=NAME, max_batch_size=4, max_waiting=8, limits=limits, **cfg))
    srv.add_version("v0001", model)
    return serve_in_background(srv), srv


@pytest.fixture(scope="module")
def served(tok, model):
    bg, srv = _serve(tok, model)
    yield bg, srv
    bg.stop()


def post(bg, body: dict, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(bg.url + path, json=body, timeout=60)


def ok(bg, body: dict) -> dict:
    r = post(bg, {"model": NAME, **body})
    assert r.status_code == 200, r.text
    return r.json()


def sse(bg, body: dict) -> list[dict]:
    chunks = []
    with httpx.stream("POST", bg.url + "/v1/completions", json={"model": NAME, **body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


@torch.no_grad()
def hand_greedy(model, ids: list[int], n: int, edit=lambda logits, seq, out: logits, temperature: float = 0.0,
                seed: int = 0) -> list[int]:
    """Tokens by full forwards (no cache), the logits of each step passed through ``edit`` first:
    greedy, or sampled at ``temperature`` with a generator seeded ``seed`` (the server's per-request one)."""
    from codex_lab.infer.sampling import sample_next

    seq, out, gen = list(ids), [], torch.Generator().manual_seed(seed)
    for _ in range(n):
        logits = edit(model(torch.tensor([seq])).logits[0, -1].float().clone(), seq, out)
        t = int(logits.argmax()) if temperature == 0 else int(sample_next(logits[None], temperature=temperature,
                                                                           generator=gen)[0])
        out.append(t)
        seq.append(t)
    return out


# ---- the formulas, by hand ----------------------------------------------------------------------
def test_min_p_keeps_tokens_within_min_p_of_the_top_one():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    # p >= 0.5 * 0.5 = 0.25 keeps 0.5 and 0.3; 0.15 and 0.05 go
    assert torch.isinf(min_p_filter(logits, 0.5)).tolist() == [[False, False, True, True]]
    assert torch.isinf(min_p_filter(logits, 0.3)).tolist() == [[False, False, False, True]]  # 0.15 >= 0.15
    assert torch.equal(min_p_filter(logits, 0.0), logits)
    # the probabilities are the sampled ones: at temperature 2 they are flatter (p ~ sqrt), so more stay
    flat = torch.softmax(logits / 2, -1)[0]
    keep = (flat >= 0.5 * flat.max()).tolist()
    assert (~torch.isinf(min_p_filter(logits, 0.5, temperature=2.0)))[0].tolist() == keep == [True, True, True, False]
    assert torch.equal(min_p_filter(logits, 0.9, temperature=0.0), logits)  # greedy: nothing to filter


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    logits = torch.tensor([2.0, -1.0, 3.0, 0.5, -2.0])
    out = apply_repetition_penalty(logits, [0, 1, 1, 4], 2.0)  # tokens 0, 1, 4 seen (1 twice: still once)
    assert out.tolist() == [1.0, -2.0, 3.0, 0.5, -4.0]
    enc = apply_repetition_penalty(logits, [0, 1], 0.5)  # < 1 favours repeats
    assert enc.tolist() == [4.0, -0.5, 3.0, 0.5, -2.0]
    assert torch.equal(apply_repetition_penalty(logits, [0], 1.0), logits)


def test_penalize_order_bias_repetition_presence_min_tokens_min_p():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5, 0.0]])
    sp = SamplingParams(logit_bias={3: 1.0}, repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25,
                        min_tokens=2, stop_token_ids=[1], end_ids=(4,), context_ids=(0,))
    out = sp.penalize(logits, [2])  # prompt [0], output [2]
    # bias: token 3 -> 1.5; repetition over prompt+output {0, 2}: 1.0 -> 0.5, 3.0 -> 1.5;
    # presence + frequency over the output [2]: 1.5 - 0.5 - 0.25 = 0.75; min_tokens (1 of 2 so far): ids 1 and 4 -> -inf
    assert out.tolist() == [[0.5, float("-inf"), 0.75, 1.5, float("-inf")]]
    assert torch.isfinite(sp.penalize(logits, [2, 2])).all()  # 2 tokens generated: nothing held back
    # min_p last: p_t / p_max = e^(logit_t - 3); 0.3 keeps token 1 (e^-1 = 0.37) and drops token 0 (e^-2 = 0.14)
    mp = SamplingParams(min_p=0.3, temperature=1.0).penalize(logits, [])
    assert torch.isinf(mp).tolist() == [[True, False, False, True, True]]
    assert torch.equal(SamplingParams(min_p=0.3, temperature=0.0).penalize(logits, []), logits)  # greedy: no-op


def test_output_text_skips_or_spaces_special_tokens(tok):
    a, b = tok.encode("x = 1"), tok.encode("y")
    mid = tok.token_id("<|fim_middle|>")
    ids = a + [mid] + b
    assert output_text(tok, ids) == "x = 1y"  # default: no special token in the text
    assert output_text(tok, ids, skip_special_tokens=False, spaces_between_special_tokens=False) == "x = 1<|fim_middle|>y"
    # vLLM joins the pieces (runs of text, special tokens) with one space
    assert output_text(tok, ids, skip_special_tokens=False) == "x = 1 <|fim_middle|> y"
    assert output_text(tok, a, skip_special_tokens=False) == "x = 1"


# ---- generate (the package) and codex-lab generate ------------------------------------------------
def test_generate_leaves_special_tokens_out_and_a_sentinel_ends_a_plain_answer(tok, model):
    mid, eot = tok.token_id("<|fim_middle|>"), tok.eot_id
    forced = SamplingParams(max_tokens=4, logit_bias={mid: 100.0})
    g = generate(model, tok, "def f():", forced)
    assert (g.text, g.ids, g.finish_reason) == ("", [], "stop")  # plain prompt: the sentinel ends the answer
    # a FIM prompt (it holds sentinels): the sentinel does not end it and stays out of the text
    fim = generate(model, tok, "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", forced)
    assert fim.ids == [mid] * 4 and fim.text == "" and fim.finish_reason == "length"
    keep = generate(model, tok, "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
                    SamplingParams(max_tokens=2, logit_bias={mid: 100.0}, skip_special_tokens=False,
                                   spaces_between_special_tokens=False))
    assert keep.text == "<|fim_middle|><|fim_middle|>"
    # min_tokens holds the sentinel and end-of-text back; stop_token_ids end the answer
    g = generate(model, tok, "def f():", SamplingParams(max_tokens=6, min_tokens=3, logit_bias={mid: 100.0, eot: 99.0}))
    assert len(g.ids) == 3 and g.finish_reason == "stop" and mid not in g.ids and eot not in g.ids
    plain = generate(model, tok, "def f():", SamplingParams(max_tokens=8))
    t = plain.ids[2]
    first = plain.ids.index(t)
    g = generate(model, tok, "def f():", SamplingParams(max_tokens=8, stop_token_ids=[t]))
    assert g.ids == plain.ids[:first] and g.finish_reason == "stop" and g.text == tok.decode(plain.ids[:first])
    g = generate(model, tok, "def f():", SamplingParams(max_tokens=8, stop_token_ids=[t], include_stop_str_in_output=True))
    assert g.text == tok.decode(plain.ids[: first + 1])


def test_codex_lab_generate_prints_no_special_token(tmp_path, tok, model, capsys):
    from codex_lab.cli import main as cli
    from codex_lab.training.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "ck", model, tok)
    assert cli(["generate", "def f():", "--checkpoint", str(tmp_path / "ck"), "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    g = generate(model, tok, "def f():", SamplingParams(max_tokens=12, seed=0))
    assert out.startswith("def f():" + g.text + "\n") and "<|" not in out.split("\n[")[0]


# ---- the server: each field --------------------------------------------------------------------
def test_min_p_equals_the_reference_loop_and_min_p_1_is_greedy(served, tok, model):
    from codex_lab.infer.generate import generate_ids

    bg, _ = served
    ids = tok.encode("def f(x):\n")
    for seed in (1, 2, 3):
        sp = SamplingParams(max_tokens=10, temperature=1.0, min_p=0.2, seed=seed, ignore_eos=True)
        want = generate_ids(model, ids, sp, eos_id=tok.eot_id)[0]  # the package's loop, same generator
        r = ok(bg, {"prompt": ids, "max_tokens": 10, "temperature": 1.0, "min_p": 0.2, "seed": seed,
                    "ignore_eos": True})
        assert r["usage"]["completion_tokens"] == 10
        assert r["choices"][0]["text"] == tok.decode(want, skip_special_tokens=True), seed
    greedy = hand_greedy(model, ids, 8)
    r = ok(bg, {"prompt": ids, "max_tokens": 8, "temperature": 1.5, "min_p": 1.0, "seed": 5, "ignore_eos": True})
    assert r["choices"][0]["text"] == tok.decode(greedy, skip_special_tokens=True)


def test_repetition_penalty_equals_the_hand_loop_over_prompt_and_output(served, tok, model):
    bg, _ = served
    ids = tok.encode("def f(a, b):\n    return a")
    for pen, temperature in ((3.0, 0.0), (1.5, 1.0), (0.6, 1.0)):
        def edit(logits, seq, out, pen=pen):
            for t in set(seq):  # seq = prompt + output so far
                logits[t] = logits[t] / pen if logits[t] > 0 else logits[t] * pen
            return logits

        want = hand_greedy(model, ids, 10, edit, temperature=temperature, seed=11)
        r = ok(bg, {"prompt": ids, "max_tokens": 10, "temperature": temperature, "seed": 11, "repetition_penalty": pen,
                    "ignore_eos": True})
        assert r["choices"][0]["text"] == tok.decode(want, skip_special_tokens=True), (pen, temperature)
    # it changes decoding (otherwise the test above would hold for any implementation)
    assert hand_greedy(model, ids, 10) != hand_greedy(model, ids, 10, lambda l, s, o: apply_repetition_penalty(l, s, 3.0))


def test_min_tokens_ignore_eos_and_usage_counting_end_of_text(served, tok):
    bg, _ = served
    eot = {str(tok.eot_id): 100}
    r = ok(bg, {"prompt": "a", "max_tokens": 8, "logit_bias": eot, "logprobs": 0})
    c = r["choices"][0]
    # the first token is end-of-text: no text, finish stop, and it is a generated token (vLLM counts it)
    assert (c["text"], c["finish_reason"], r["usage"]["completion_tokens"]) == ("", "stop", 1)
    assert c["logprobs"]["tokens"] == ["<|endoftext|>"]
    r = ok(bg, {"prompt": "a", "max_tokens": 8, "logit_bias": eot, "min_tokens": 5, "logprobs": 0})
    c = r["choices"][0]
    assert c["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 6  # 5 held, then end-of-text
    assert c["logprobs"]["tokens"][-1] == "<|endoftext|>" and "<|endoftext|>" not in c["logprobs"]["tokens"][:5]
    r = ok(bg, {"prompt": "a", "max_tokens": 4, "logit_bias": eot, "ignore_eos": True, "logprobs": 0})
    c = r["choices"][0]
    assert c["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 4
    assert c["logprobs"]["tokens"] == ["<|endoftext|>"] * 4 and c["text"] == ""  # skipped in the text
    kept = ok(bg, {"prompt": "a", "max_tokens": 2, "logit_bias": eot, "ignore_eos": True,
                   "skip_special_tokens": False, "spaces_between_special_tokens": False})
    assert kept["choices"][0]["text"] == "<|endoftext|>" * 2


def test_stop_token_ids_end_the_answer_and_include_stop_str_in_output(served, tok, model):
    bg, _ = served
    ids = tok.encode("def f(x):\n")
    samp = {"temperature": 1.0, "seed": 4, "ignore_eos": True}  # a random model's greedy repeats one token
    plain = hand_greedy(model, ids, 12, temperature=1.0, seed=4)
    k = next(i for i in range(2, 12) if plain[i] not in plain[:i])
    for stream in (False, True):
        body = {"prompt": ids, "max_tokens": 12, "stop_token_ids": [plain[k]], **samp}
        if stream:
            chunks = sse(bg, {**body, "stream_options": {"include_usage": True}})
            text = "".join(c["text"] for ch in chunks for c in ch["choices"])
            usage, finish = chunks[-1]["usage"], [c["finish_reason"] for ch in chunks for c in ch["choices"]][-1]
        else:
            r = ok(bg, body)
            text, usage, finish = r["choices"][0]["text"], r["usage"], r["choices"][0]["finish_reason"]
        assert text == tok.decode(plain[:k], skip_special_tokens=True) and finish == "stop"
        assert usage["completion_tokens"] == k + 1  # the stop id is a generated token
    r = ok(bg, {"prompt": ids, "max_tokens": 12, "stop_token_ids": [plain[k]], "include_stop_str_in_output": True,
                **samp})
    assert r["choices"][0]["text"] == tok.decode(plain[: k + 1], skip_special_tokens=True)
    # stop strings: cut before them, or kept with include_stop_str_in_output
    full = tok.decode(plain, skip_special_tokens=True)
    stop = full[len(full) // 2: len(full) // 2 + 2]
    at = full.find(stop)
    assert at > 0
    r = ok(bg, {"prompt": ids, "max_tokens": 12, "stop": [stop], **samp})
    assert r["choices"][0]["text"] == full[:at]
    r = ok(bg, {"prompt": ids, "max_tokens": 12, "stop": [stop], "include_stop_str_in_output": True, **samp})
    assert r["choices"][0]["text"] == full[: at + len(stop)]


def test_min_tokens_delays_stop_strings_and_stop_ids(served, tok, model):
    bg, _ = served
    ids = tok.encode("def f(x):\n")
    plain = hand_greedy(model, ids, 12)
    first = tok.decode(plain[:1])
    r = ok(bg, {"prompt": ids, "max_tokens": 12, "temperature": 0, "stop": [first], "ignore_eos": True})
    assert r["choices"][0]["text"] == ""  # the first token's text is a stop string
    r = ok(bg, {"prompt": ids, "max_tokens": 12, "temperature": 0, "stop": [first], "min_tokens": 4,
                "ignore_eos": True})
    text = r["choices"][0]["text"]
    # not before token 4: the text of the first 3 tokens cannot stop it
    assert text.startswith(tok.decode(plain[:3])) and r["usage"]["completion_tokens"] >= 4
    # a stop id is held back before min_tokens: the greedy token of step 0 is masked there, the next best comes
    def mask_first(logits, seq, out):
        if not out:
            logits[plain[0]] = float("-inf")
        return logits

    want = hand_greedy(model, ids, 1, mask_first)
    r = ok(bg, {"prompt": ids, "max_tokens": 1, "temperature": 0, "stop_token_ids": [plain[0]], "min_tokens": 1})
    assert r["choices"][0]["text"] == tok.decode(want, skip_special_tokens=True) and want[0] != plain[0]


def test_prompt_logprobs_equal_a_forward_pass(served, tok, model):
    bg, _ = served
    ids = tok.encode("import os\nx = os.path")
    r = ok(bg, {"prompt": ids, "max_tokens": 1, "prompt_logprobs": 3})
    plp = r["choices"][0]["prompt_logprobs"]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)  # (T, V)
    assert plp[0] is None and len(plp) == len(ids)
    for t in range(1, len(ids)):
        e = plp[t]
        own = e[str(ids[t])]
        assert abs(own["logprob"] - float(logp[t - 1, ids[t]])) < TOL
        assert own["rank"] == int((logp[t - 1] > logp[t - 1, ids[t]]).sum()) + 1
        top = torch.topk(logp[t - 1], 3)
        for rank, (i, v) in enumerate(zip(top.indices.tolist(), top.values.tolist()), start=1):
            assert abs(e[str(i)]["logprob"] - v) < TOL and e[str(i)]["rank"] == rank
        assert len(e) in (3, 4)  # the top 3, and the prompt's token when it is not among them
    first = sse(bg, {"prompt": ids, "max_tokens": 2, "prompt_logprobs": 0})[0]["choices"][0]
    assert [list(e) if e else None for e in first["prompt_logprobs"]] == [None] + [[str(i)] for i in ids[1:]]


def test_special_tokens_out_of_text_and_sentinels_end_plain_answers(served, tok):
    bg, _ = served
    mid = tok.token_id("<|fim_middle|>")
    force = {str(mid): 100}
    for stream in (False, True):
        body = {"prompt": "def f():", "max_tokens": 5, "logit_bias": force}
        if stream:
            chunks = sse(bg, {**body, "stream_options": {"include_usage": True}})
            text = "".join(c["text"] for ch in chunks for c in ch["choices"])
            usage = chunks[-1]["usage"]
            assert all(ch["system_fingerprint"] == "v0001" for ch in chunks)  # every chunk, the usage one too
        else:
            r = ok(bg, body)
            text, usage = r["choices"][0]["text"], r["usage"]
            assert r["choices"][0]["finish_reason"] == "stop"
        assert text == "" and usage["completion_tokens"] == 1  # plain mode: the sentinel ends the answer
    # a prompt that holds sentinels is fill-in-the-middle: they do not end it, and stay out of the text
    fim = "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>"
    r = ok(bg, {"prompt": fim, "max_tokens": 3, "logit_bias": force, "logprobs": 0})
    assert r["choices"][0]["text"] == "" and r["usage"]["completion_tokens"] == 3
    assert r["choices"][0]["logprobs"]["tokens"] == ["<|fim_middle|>"] * 3  # logprobs keep the raw tokens
    streamed = "".join(c["text"] for ch in sse(bg, {"prompt": fim, "max_tokens": 3, "logit_bias": force,
                                                    "skip_special_tokens": False}) for c in ch["choices"])
    assert streamed == "<|fim_middle|> <|fim_middle|> <|fim_middle|>"  # spaces_between_special_tokens (default)
    r = ok(bg, {"prompt": fim, "max_tokens": 3, "logit_bias": force, "skip_special_tokens": False,
                "spaces_between_special_tokens": False})
    assert r["choices"][0]["text"] == "<|fim_middle|>" * 3


def test_max_tokens_defaults_to_the_context_and_the_operator_cap(served, tok, model):
    bg, _ = served
    ids = tok.encode("def f(x):\n")
    r = ok(bg, {"prompt": ids, "ignore_eos": True})
    assert r["usage"]["completion_tokens"] == CTX - len(ids) and r["choices"][0]["finish_reason"] == "length"
    # two prompts: each gets what the context leaves after its own prompt
    r = ok(bg, {"prompt": [ids, ids[:2]], "ignore_eos": True})
    assert r["usage"]["completion_tokens"] == (CTX - len(ids)) + (CTX - 2)
    capped, _ = _serve(tok, model, limits=Limits(max_tokens=7))
    try:
        assert ok(capped, {"prompt": ids, "ignore_eos": True})["usage"]["completion_tokens"] == 7
        r = post(capped, {"model": NAME, "prompt": ids, "max_tokens": 8})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        assert "--max-tokens" in r.json()["error"]["message"]
    finally:
        capped.stop()


def test_serve_flags_max_tokens_and_lenient():
    from codex_lab.commands import serve as serve_cmd

    p = argparse.ArgumentParser()
    serve_cmd.add_arguments(p)
    cfg = serve_cmd.build_config(p.parse_args([]))
    assert cfg.limits.max_tokens == NO_TOKEN_CAP and not cfg.limits.lenient
    cfg = serve_cmd.build_config(p.parse_args(["--max-tokens", "64", "--lenient"]))
    assert cfg.limits.max_tokens == 64 and cfg.limits.lenient


@pytest.mark.parametrize("extra, param", [
    ({"min_p": 1.5}, "min_p"), ({"min_p": -0.1}, "min_p"), ({"min_p": "0.1"}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"repetition_penalty": 1e-9}, "repetition_penalty"),
    ({"repetition_penalty": 101}, "repetition_penalty"), ({"repetition_penalty": True}, "repetition_penalty"),
    ({"min_tokens": -1}, "min_tokens"), ({"min_tokens": 5}, "min_tokens"), ({"min_tokens": 1.5}, "min_tokens"),
    ({"ignore_eos": "yes"}, "ignore_eos"), ({"include_stop_str_in_output": 1}, "include_stop_str_in_output"),
    ({"skip_special_tokens": "false"}, "skip_special_tokens"),
    ({"spaces_between_special_tokens": 0}, "spaces_between_special_tokens"),
    ({"stop_token_ids": [400]}, "stop_token_ids"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": 3}, "stop_token_ids"), ({"stop_token_ids": [True]}, "stop_token_ids"),
    ({"stop_token_ids": list(range(65))}, "stop_token_ids"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"), ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt_logprobs": 1, "max_tokens": 0, "echo": True}, "prompt_logprobs"),
    ({"use_beam_search": True}, "use_beam_search"), ({"guided_json": {}}, "guided_json"),
    ({"response_format": {"type": "json"}}, "response_format"),
])
def test_each_field_refused_with_a_400_naming_it(served, extra, param):
    bg, _ = served
    r = post(bg, {"model": NAME, "prompt": "def f():", "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_unknown_fields_list_the_supported_ones_and_lenient_ignores_them(served, tok, model):
    bg, _ = served
    r = post(bg, {"model": NAME, "prompt": "a", "max_tokens": 2, "frobnicate": 1})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "frobnicate" and err["code"] == "unknown_field"
    assert all(f in err["message"] for f in COMPLETION_FIELDS) and "--lenient" in err["message"]
    lenient, _ = _serve(tok, model, limits=Limits(lenient=True))
    try:
        assert ok(lenient, {"prompt": "a", "max_tokens": 2, "frobnicate": 1})["usage"]["completion_tokens"] >= 1
    finally:
        lenient.stop()


def test_tokenize_options_and_model_cards(served, tok):
    bg, _ = served
    text = "def f():<|fim_middle|>"
    r = post(bg, {"prompt": text, "return_token_strs": True}, "/tokenize").json()
    assert r["tokens"] == tok.encode(text) and r["token_strs"] == [tok.tok.id_to_token(i) for i in r["tokens"]]
    assert r["token_strs"][-1] == "<|fim_middle|>"
    assert post(bg, {"prompt": text}, "/tokenize").json()["token_strs"] is None
    # the course tokenizer adds no bos/eos, so both settings give the same ids (honoured, not ignored:
    # the tokenizer's own encode(add_special_tokens=...) is what runs)
    no = post(bg, {"prompt": text, "add_special_tokens": False}, "/tokenize").json()
    assert no["tokens"] == tok.tok.encode(text, add_special_tokens=False).ids == r["tokens"]
    for bad in ({"return_token_strs": "yes"}, {"add_special_tokens": 1}, {"truncate": True}):
        e = post(bg, {"prompt": "x", **bad}, "/tokenize")
        assert e.status_code == 400 and e.json()["error"]["param"] == next(iter(bad))
    cards = httpx.get(bg.url + "/v1/models").json()["data"]
    assert cards and all(c["max_model_len"] == CTX for c in cards)
    assert httpx.get(bg.url + f"/v1/models/{NAME}").json()["max_model_len"] == CTX


def test_a_request_that_can_never_fit_gets_400_naming_the_capacity(served):
    bg, srv = served
    cap = 4 + 8  # max_batch_size x 1 version + max_waiting
    for body in ({"n": cap + 1}, {"prompt": ["a", "b", "c"], "n": 5}, {"n": 2, "best_of": cap + 1}):
        r = post(bg, {"model": NAME, "prompt": "a", "max_tokens": 1, **body})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "exceeds_capacity" and f"at most {cap}" in err["message"]
        assert err["param"] == ("best_of" if "best_of" in body else "n")
    r = post(bg, {"model": NAME, "prompt": "a", "max_tokens": 1, "n": cap})  # exactly the capacity: served
    assert r.status_code == 200 and len(r.json()["choices"]) == cap
    assert srv.health()["in_flight"] == 0


def test_ignore_eos_runs_past_the_fim_sentinels_too():
    """``ignore_eos`` (what a benchmark sends for exactly max_tokens tokens): neither end-of-text
    nor the FIM sentinels that otherwise end an answer end it; only stop_token_ids do."""
    sp = SamplingParams(max_tokens=8, stop_token_ids=[7])
    assert sp.for_prompt([1, 2], eos_id=0, end_ids=[5, 6]).end_ids == (0, 5, 6)
    ignoring = SamplingParams(max_tokens=8, stop_token_ids=[7], ignore_eos=True).for_prompt([1, 2], eos_id=0, end_ids=[5, 6])
    assert ignoring.end_ids == () and ignoring.stop_token_ids == [7]
