"""codex-lab export: a folder transformers loads alone (greedy tokens equal codex-lab generate, and it
stops where codex-lab stops: at end-of-text and at a FIM sentinel generated outside FIM), and a
llama-architecture GGUF that gguf's reader reads back, held to the model by a NumPy forward pass that
uses llama.cpp's RoPE convention (adjacent pairs)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from codex_lab.cli import main as cli
from codex_lab.data.tokenizer import EOT, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, PAD, SPECIAL_TOKENS
from codex_lab.data.fim import stop_token_ids
from codex_lab.infer.generate import answer_end_ids, generate, generate_ids
from codex_lab.infer.sampling import SamplingParams
from codex_lab.training.checkpoint import load_pretrained

transformers = pytest.importorskip("transformers")

PROMPTS = ["def fibonacci(n):\n", "import os\n\nclass Config:\n", "for i in range(10):\n    print("]
# the shipped model's greedy first token after this prompt is <|fim_suffix|>: a plain answer of 0 tokens
STOPS_AT_ONCE = "for i in range(10):\n    "


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "hf"
    gguf_ok = True
    try:
        import gguf  # noqa: F401
    except ImportError:
        gguf_ok = False
    assert cli(["export", str(out)] + (["--gguf"] if gguf_ok else [])) == 0
    return out, load_pretrained("cpu")


def test_folder_has_the_files_and_tokenizer_config(exported):
    out, ck = exported
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (out / f).is_file(), f
    tc = json.loads((out / "tokenizer_config.json").read_text())
    assert tc["model_max_length"] == ck.model.cfg.max_seq_len
    tok = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert tok.model_max_length == ck.model.cfg.max_seq_len
    assert tok.eos_token == EOT and tok.pad_token == PAD
    assert tok.eos_token_id == ck.tokenizer.eot_id and tok.pad_token_id == ck.tokenizer.pad_id
    assert set(SPECIAL_TOKENS) <= set(tok.all_special_tokens)
    for text in PROMPTS + ["<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "x = '\u00e9\U0001F600'\n"]:
        assert tok(text).input_ids == ck.tokenizer.encode(text)
    ids = ck.tokenizer.encode(PROMPTS[0]) + [ck.tokenizer.eot_id]
    assert tok.decode(ids, skip_special_tokens=True) == PROMPTS[0]
    gc = json.loads((out / "generation_config.json").read_text())
    assert gc["max_length"] == ck.model.cfg.max_seq_len
    stops = stop_token_ids(ck.tokenizer)  # end-of-text first, then the FIM sentinels
    assert gc["eos_token_id"] == stops and gc["pad_token_id"] == ck.tokenizer.pad_id
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == stops  # config.json says the same


def hf_greedy(hf, ids: list[int], n: int, **kw) -> list[int]:
    """transformers' greedy new tokens after ``ids`` (the token that ended it, if any, is kept)."""
    with torch.no_grad():
        return hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, **kw)[0, len(ids):].tolist()


def test_stop_ids_are_where_codex_lab_ends_a_plain_answer(exported):
    _, ck = exported
    tok = ck.tokenizer
    stops = stop_token_ids(tok)
    assert [tok.tok.id_to_token(i) for i in stops] == [EOT, FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE]
    # the ids generate() and the server (serve.completion) hand the sampler for a request without suffix:
    # eos_id=eot_id and end_ids=answer_end_ids(...), turned into the ending ids by SamplingParams.for_prompt
    ids = tok.encode(STOPS_AT_ONCE)
    ends = SamplingParams(max_tokens=1).for_prompt(ids, eos_id=tok.eot_id, end_ids=answer_end_ids(tok, ids)).end_ids
    assert sorted(ends) == sorted(stops)
    # a FIM request is not a plain answer: there a sentinel is part of the layout, only end-of-text ends it
    assert answer_end_ids(tok, ids, fim=True) == [] and answer_end_ids(tok, [tok.token_id(FIM_PREFIX), *ids]) == []


def test_transformers_stops_where_codex_lab_stops_because_of_the_export(exported, capsys):
    out, ck = exported
    tok, n = ck.tokenizer, 32
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    ids = tok.encode(STOPS_AT_ONCE)
    g = generate(ck.model, tok, STOPS_AT_ONCE, SamplingParams(max_tokens=n))
    assert g.ids == [] and g.finish_reason == "stop"  # codex-lab: 0 tokens
    capsys.readouterr()
    assert cli(["generate", STOPS_AT_ONCE, "--max-new-tokens", str(n)]) == 0
    assert "[0 tokens, finish_reason=stop]" in capsys.readouterr().out
    free = generate_ids(ck.model, ids, SamplingParams(max_tokens=n), eos_id=None)[0]  # greedy, nothing ends it
    assert free[0] == tok.token_id(FIM_SUFFIX) and len(free) == n
    # transformers with the exported generation config: the same 0 tokens, ended by the same <|fim_suffix|>
    y = hf_greedy(hf, ids, n)
    assert y == [free[0]] and y[:-1] == g.ids
    # counterfactual: without the exported stop ids transformers runs on for all n tokens, the same tokens
    # codex-lab's loop gives with no ending id: the export is what makes it stop
    assert hf_greedy(hf, ids, n, eos_token_id=None) == free
    assert hf_greedy(hf, ids, n, eos_token_id=tok.eot_id) == free  # end-of-text alone (the export before)


def test_server_stops_there_too(exported):
    import httpx

    from codex_lab.serve.app import serve_in_background
    from codex_lab.serve.router import ModelServer, ServerConfig

    _, ck = exported
    srv = ModelServer(ck.tokenizer, ServerConfig(model_name="shipped", max_batch_size=2, max_waiting=4))
    srv.add_version("v1", ck.model)
    bg = serve_in_background(srv)
    try:
        for prompt, sentinel in ((STOPS_AT_ONCE, FIM_SUFFIX), (PROMPTS[1], FIM_MIDDLE)):
            body = {"model": "shipped", "prompt": prompt, "max_tokens": 32, "temperature": 0, "logprobs": 0}
            r = httpx.post(bg.url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            g = generate(ck.model, ck.tokenizer, prompt, SamplingParams(max_tokens=32))
            assert g.ids == [] and g.finish_reason == "stop", prompt
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "stop" and choice["text"] == "", prompt
            # 0 tokens of answer; the server lists (and counts, as vLLM counts end-of-text) the token that ended it
            assert choice["logprobs"]["tokens"] == [sentinel] and r.json()["usage"]["completion_tokens"] == 1, prompt
    finally:
        bg.stop()
        srv.close()


def test_transformers_greedy_equals_codex_lab_generate(exported, capsys):
    out, ck = exported
    tok = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    n = 24
    for prompt in PROMPTS + [STOPS_AT_ONCE]:
        x = tok(prompt, return_tensors="pt").input_ids
        assert x[0].tolist() == ck.tokenizer.encode(prompt)
        y = hf_greedy(hf, x[0].tolist(), n)
        raw = generate_ids(ck.model, ck.tokenizer.encode(prompt), SamplingParams(max_tokens=n), eos_id=None)[0]
        g = generate(ck.model, ck.tokenizer, prompt, SamplingParams(max_tokens=n))
        # the same tokens, and the same token ends both (transformers keeps it; codex-lab's ids stop before it)
        assert y == raw[: len(g.ids) + (g.finish_reason == "stop")], prompt
        assert y[: len(g.ids)] == g.ids
        capsys.readouterr()
        assert cli(["generate", prompt, "--max-new-tokens", str(n)]) == 0
        printed = capsys.readouterr().out
        # codex-lab generate leaves control tokens out of the text (as vLLM and llama.cpp) and a FIM sentinel
        # ends a plain answer: the text is that of the tokens before the first sentinel, skipping special ones
        assert printed.startswith(prompt + g.text + "\n")
        assert g.text == tok.decode(g.ids, skip_special_tokens=True) and "<|" not in g.text


def test_gguf_reads_back_with_the_tensors_and_metadata(exported):
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install 'codex_lab[gguf]')")
    from codex_lab.hf.gguf_export import gguf_tensors

    out, ck = exported
    cfg = ck.model.cfg
    r = gguf.GGUFReader(str(out / "model.gguf"))
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("GGUF.")}
    assert f["general.architecture"] == "llama"
    assert f["llama.context_length"] == cfg.max_seq_len and f["llama.block_count"] == cfg.n_layer
    assert f["llama.embedding_length"] == cfg.d_model and f["llama.feed_forward_length"] == cfg.ffn_hidden
    assert f["llama.attention.head_count"] == cfg.n_head and f["llama.attention.head_count_kv"] == cfg.n_kv_head
    assert f["llama.rope.freq_base"] == cfg.rope_theta and f["llama.rope.dimension_count"] == cfg.head_dim
    assert abs(f["llama.attention.layer_norm_rms_epsilon"] - cfg.norm_eps) < 1e-12
    assert f["tokenizer.ggml.model"] == "gpt2" and f["tokenizer.ggml.pre"] == "gpt-2"
    assert f["tokenizer.ggml.eos_token_id"] == f["tokenizer.ggml.eot_token_id"] == ck.tokenizer.eot_id
    vocab = ck.tokenizer.tok
    assert f["tokenizer.ggml.tokens"] == [vocab.id_to_token(i) for i in range(cfg.vocab_size)]
    control = {i for i, t in enumerate(f["tokenizer.ggml.token_type"]) if t == gguf.TokenType.CONTROL}
    assert control == {vocab.token_to_id(s) for s in SPECIAL_TOKENS}
    want = gguf_tensors(ck.model)
    got = {t.name: np.asarray(t.data) for t in r.tensors}
    assert got.keys() == want.keys()  # tied embeddings: no output.weight, llama.cpp reuses token_embd
    for name, arr in want.items():
        assert got[name].dtype == np.float32 and np.array_equal(got[name], arr), name
    # the tensors compute the model: a llama forward with llama.cpp's RoPE (adjacent pairs) on the
    # GGUF's own tensors gives the codex model's logits (float32 rounding: 1e-4 on logits of size ~10)
    ids = ck.tokenizer.encode(PROMPTS[0])
    with torch.no_grad():
        ref = ck.model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(llama_cpp_style_forward(got, ids, f) - ref).max() < 1e-3


def llama_cpp_style_forward(t: dict, ids: list[int], f: dict) -> np.ndarray:
    """Logits (T, V) of a Llama as llama.cpp computes it from GGUF tensors (float64, no cache)."""
    H, Hkv, eps = f["llama.attention.head_count"], f["llama.attention.head_count_kv"], f["llama.attention.layer_norm_rms_epsilon"]
    theta, L = f["llama.rope.freq_base"], f["llama.block_count"]
    g = {k: v.astype(np.float64) for k, v in t.items()}

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(x):  # (T, h, hd), pairs (2i, 2i+1) rotated by pos * theta^(-2i/hd): llama.cpp's "normal" mode
        T, _, hd = x.shape
        ang = np.arange(T)[:, None] * theta ** (-np.arange(0, hd, 2) / hd)[None]  # (T, hd/2)
        c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
        return out

    x = g["token_embd.weight"][ids]  # (T, d)
    T = len(ids)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(L):
        p = f"blk.{i}."
        h = rms(x, g[p + "attn_norm.weight"])
        q, k, v = (h @ g[p + n + ".weight"].T for n in ("attn_q", "attn_k", "attn_v"))
        hd = q.shape[1] // H
        q, k, v = rope(q.reshape(T, H, hd)), rope(k.reshape(T, Hkv, hd)), v.reshape(T, Hkv, hd)
        k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)
        att = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", att, v).reshape(T, H * hd) @ g[p + "attn_output.weight"].T
        h = rms(x, g[p + "ffn_norm.weight"])
        gate, up = h @ g[p + "ffn_gate.weight"].T, h @ g[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ g[p + "ffn_down.weight"].T
    x = rms(x, g["output_norm.weight"])
    return x @ g.get("output.weight", g["token_embd.weight"]).T


def http_completer(url: str, model: str):
    """A gates completer over any OpenAI-compatible server: greedy streaming completions, token times."""
    import time

    import httpx

    from codex_lab.serve.gates import Sample

    def complete(prompts, max_tokens):
        out = []
        for p in prompts:
            s = Sample(body="", arrival=time.perf_counter())
            body = {"model": model, "prompt": p, "max_tokens": max_tokens, "temperature": 0, "stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        text = json.loads(line[6:])["choices"][0]["text"]
                        if text:
                            s.body += text
                            s.token_times.append(time.perf_counter())
            out.append(s)
        return out

    return complete


def llama_cpp_server_command(gguf_path, port: int, n_ctx: int, slots: int) -> list[str]:
    """The command of llama.cpp's OpenAI-compatible server on ``gguf_path``: its own ``llama-server``
    binary (``CODEX_LAB_LLAMA_SERVER``, built by scripts/build_llama_cpp.sh, or on PATH), else
    llama-cpp-python's ``llama_cpp.server``; skips, saying why, when neither is installed."""
    import sys

    from codex_lab.measure.llama_native import find_llama_server

    exe = find_llama_server()
    if exe:  # one slot per concurrent client, each with the model's whole context
        return [str(exe), "-m", str(gguf_path), "--alias", "codex-lab-tiny", "--host", "127.0.0.1", "--port", str(port),
                "-c", str(n_ctx * slots), "-np", str(slots), "-t", "1", "--no-warmup"]
    try:
        import llama_cpp  # noqa: F401
        import sse_starlette  # noqa: F401
    except ImportError:
        pytest.skip("llama.cpp is not installed: neither a llama-server binary (CODEX_LAB_LLAMA_SERVER or PATH; "
                    "build it from llama.cpp's source with cmake) nor llama-cpp-python[server] (pip builds it "
                    "from source for ~30 min on 2 cores); the GGUF was not run by llama.cpp")
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path), "--model_alias", "codex-lab-tiny",
            "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", "1"]


def test_llama_cpp_server_runs_the_gguf(exported):
    """llama.cpp's OpenAI-compatible server on the exported GGUF: its greedy text equals codex-lab
    generate's, then the course's load test and gates are driven against it once."""
    import socket
    import subprocess
    import time

    import httpx

    from codex_lab.serve.app import serve_in_background
    from codex_lab.serve.router import ModelServer, ServerConfig
    from codex_lab.serve.canary import CanaryPolicy, client_window, decide
    from codex_lab.serve.gates import run_gates
    from codex_lab.serve.loadtest import run_load

    out, ck = exported
    if not (out / "model.gguf").is_file():
        pytest.skip("the gguf package is not installed, so no GGUF was exported (pip install 'codex_lab[gguf]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = llama_cpp_server_command(out / "model.gguf", port, ck.model.cfg.max_seq_len, slots=2)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        t0 = time.time()
        while True:
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.time() - t0 > 120:
                proc.kill()
                pytest.fail("llama.cpp's server did not start: " + (proc.stdout.read()[-3000:] if proc.stdout else ""))
            time.sleep(0.5)
        for prompt in PROMPTS + [STOPS_AT_ONCE]:
            r = httpx.post(url + "/v1/completions", json={"model": "codex-lab-tiny", "prompt": prompt, "max_tokens": 24,
                                                          "temperature": 0}, timeout=120).json()
            # llama.cpp ends where codex-lab ends a plain answer: at end-of-text, and at <|fim_middle|> and
            # <|fim_suffix|> through the GGUF's eom / fim_pad keys (PROMPTS[1] and STOPS_AT_ONCE open with them)
            g = generate(ck.model, ck.tokenizer, prompt, SamplingParams(max_tokens=24))
            assert r["choices"][0]["text"] == g.text, prompt
            assert r["choices"][0]["finish_reason"] == g.finish_reason, prompt
        # one connection per request: llama-server drops kept-alive connections after a stream
        rep = run_load(url, concurrency=2, requests=8, max_tokens=16, progress=False, fresh_connections=True)
        print("\nllama.cpp load test:", rep.summary())
        assert rep.ok == 8
        # the canary rule with llama.cpp's server as the candidate and codex-lab serve as the primary
        srv = ModelServer(ck.tokenizer, ServerConfig(model_name="codex-lab-tiny"))
        srv.add_version("v0001", ck.model)
        bg = serve_in_background(srv)
        try:
            ours_rep = run_load(bg.url, concurrency=2, requests=8, max_tokens=16, progress=False)
        finally:
            bg.stop()
        policy = CanaryPolicy(min_requests=8, promote_after=8)
        action, reasons = decide(client_window(rep, policy), client_window(ours_rep, policy), policy)
        print("canary, llama.cpp vs codex-lab serve:", action, reasons)
        # a window read from the clients has latency but no judged answers: the rule waits for quality data
        assert action == "wait" and any("quality" in r for r in reasons), (action, reasons)
        gates = run_gates(http_completer(url, "codex-lab-tiny"), bench=None)
        print("llama.cpp gates:", gates.scores())
        ours = run_gates(http_completer_inproc(ck), bench=None)
        # the same weights: the quality gates agree (latency differs by server)
        for k in ("syntax", "functional", "style"):
            assert abs(gates.scores()[k] - ours.scores()[k]) < 1e-9, k
    finally:
        proc.terminate()
        proc.wait(30)


def http_completer_inproc(ck):
    from codex_lab.serve.gates import engine_completer

    return engine_completer(ck.model, ck.tokenizer)


def test_export_from_checkpoint_and_registry_version(tmp_path, small_tokenizer, capsys):
    from codex_lab.nn.config import ModelConfig
    from codex_lab.nn.model import CodexModel
    from codex_lab.serve.registry import Registry
    from codex_lab.training.checkpoint import save_checkpoint

    tok = small_tokenizer
    torch.manual_seed(1)
    a = CodexModel(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layer=1, n_head=2, n_kv_head=1, max_seq_len=64)).eval()
    torch.manual_seed(2)
    b = CodexModel(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layer=1, n_head=2, n_kv_head=1, max_seq_len=64)).eval()
    save_checkpoint(tmp_path / "ck", a, tok, {"note": "a"})
    reg = Registry(tmp_path / "reg")
    v1, v2 = reg.add(a, tok), reg.add(b, tok)
    reg.promote(v1)
    x = torch.tensor([tok.encode("def f(x):\n    return x")])
    for args, model in ((["--checkpoint", str(tmp_path / "ck")], a), (["--registry", str(tmp_path / "reg")], a),
                        (["--registry", str(tmp_path / "reg"), "--version", v2], b)):
        out = tmp_path / ("out" + "_".join(args[-1:]).replace("/", "_"))
        assert cli(["export", str(out), *args]) == 0
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
        with torch.no_grad():  # the exported weights compute the chosen model (grouped-query attention too)
            assert torch.allclose(hf(x).logits, model(x).logits, atol=1e-5)
        assert transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True).model_max_length == 64
    capsys.readouterr()
    assert cli(["export", str(tmp_path / "bad"), "--version", v2]) == 2  # --version needs --registry
    assert "--registry" in capsys.readouterr().err
    moe = CodexModel(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layer=1, n_head=2, max_seq_len=64,
                                 moe_layers=[0])).eval()
    save_checkpoint(tmp_path / "moe", moe, tok)
    assert cli(["export", str(tmp_path / "moe_out"), "--checkpoint", str(tmp_path / "moe")]) == 2
    assert "mixture-of-experts" in capsys.readouterr().err
