"""lm-evaluation-harness against `codex-lab serve`: its local-completions model with default settings
(only base_url and model given) runs a loglikelihood task (multiple choice) and a generate_until task
written here (local JSON data, nothing downloaded), and the loglikelihoods it reports equal the ones
computed in-process from one forward pass.

lm_eval's defaults send token ids (tokenized_requests=True), batched as a list of token-id lists,
tokenize through the server's vLLM-style /tokenize route (tokenizer_backend auto-detects it), and
score with echo=True, logprobs=1, max_tokens=1.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed: pip install 'codex_lab[evalharness]'")

MODEL = "codex-lab-tiny"
MC = [  # context, choices, label
    ("def add(a, b):\n    return", [" a + b", " a - b", " None"], 0),
    ("import os\nprint(os.path.", ["join('a', 'b'))", "banana)", "42)"], 0),
    ("for i in range(10):\n   ", [" print(i)", " pass", " i = 1"], 0),
    ("class Point:\n    def __init__(self, x, y):\n        self.x =", [" x", " y", " 3"], 0),
]
GEN = [("def square(x):\n    return", " x * x"), ("import", " os")]
# ll of the same tokens from the server's forward and from ours: the same float32 model on the same
# CPU; summed over <= 10 tokens the two agree to ~1e-6. 1e-4 is rounding room, far below any real
# error (a token off by one position changes a log-probability by > 0.1)
TOL = 1e-4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "codex_lab.cli", "serve", "--no-compile", "--port", str(port),
                             "--max-tokens", "64"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while True:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:  # /health is 200 while the model loads
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.time() - t0 > 120:
            proc.kill()
            pytest.fail(f"codex-lab serve did not start: {proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(30)


def write_tasks(d: Path) -> None:
    (d / "mc.jsonl").write_text("".join(json.dumps({"context": c, "choices": ch, "label": y}) + "\n" for c, ch, y in MC))
    (d / "gen.jsonl").write_text("".join(json.dumps({"prompt": p, "target": t}) + "\n" for p, t in GEN))
    common = "dataset_path: json\ntest_split: test\n"
    (d / "codex_mc.yaml").write_text(
        f"task: codex_mc\n{common}dataset_kwargs:\n  data_files:\n    test: {d / 'mc.jsonl'}\n"
        "output_type: multiple_choice\ndoc_to_text: '{{context}}'\ndoc_to_choice: choices\ndoc_to_target: label\n"
        "target_delimiter: ''\nmetric_list:\n  - metric: acc\n")
    (d / "codex_gen.yaml").write_text(
        f"task: codex_gen\n{common}dataset_kwargs:\n  data_files:\n    test: {d / 'gen.jsonl'}\n"
        "output_type: generate_until\ndoc_to_text: '{{prompt}}'\ndoc_to_target: '{{target}}'\n"
        "generation_kwargs:\n  until: [\"\\n\\n\"]\n  max_gen_toks: 8\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")


def encode_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm_eval's split of a request into context and continuation tokens (trailing spaces move right)."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole, ctx = tok.encode(context + continuation), tok.encode(context)
    return ctx, whole[len(ctx):]


def test_lm_eval_local_completions_against_codex_lab_serve(server, tmp_path):
    from codex_lab.infer.generate import generate_ids
    from codex_lab.training.checkpoint import load_pretrained

    write_tasks(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf_cache"), "OMP_NUM_THREADS": "1", "OPENAI_API_KEY": "unused"}
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions",
           "--model_args", f"base_url={server}/v1/completions,model={MODEL}",
           "--tasks", "codex_mc,codex_gen", "--include_path", str(tmp_path), "--log_samples", "--output_path", str(out)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    print("\nlm_eval results:", {k: {m: v for m, v in d.items() if "stderr" not in m} for k, d in results.items()})
    assert "acc,none" in results["codex_mc"] and "exact_match,none" in results["codex_gen"]

    ck = load_pretrained("cpu")
    tok, model = ck.tokenizer, ck.model
    mc = [json.loads(x) for x in next(out.rglob("samples_codex_mc_*.jsonl")).read_text().splitlines()]
    assert len(mc) == len(MC)
    n_checked = 0
    for s in mc:
        ctx_text, choices = s["doc"]["context"], s["doc"]["choices"]
        for choice, resp in zip(choices, s["filtered_resps"]):
            ctx, cont = encode_pair(tok, ctx_text, choice)
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ctx + cont])).logits[0].float(), dim=-1)
            # ll = sum over continuation tokens of log p(token | everything before it)
            ll = sum(float(logp[len(ctx) + i - 1, t]) for i, t in enumerate(cont))
            greedy = all(int(logp[len(ctx) + i - 1].argmax()) == t for i, t in enumerate(cont))
            assert abs(float(resp[0]) - ll) < TOL, (ctx_text, choice, resp, ll)
            assert str(resp[1]) == str(greedy)  # the samples file writes the bool as text
            n_checked += 1
    assert n_checked == sum(len(c) for _, c, _ in MC)
    acc = sum(int(s["acc"]) for s in mc) / len(mc)
    assert abs(results["codex_mc"]["acc,none"] - acc) < 1e-9

    gen = [json.loads(x) for x in next(out.rglob("samples_codex_gen_*.jsonl")).read_text().splitlines()]
    assert len(gen) == len(GEN)
    for s in gen:  # generate_until's text is the server's greedy continuation, cut at "\n\n"
        ids = tok.encode(s["doc"]["prompt"])
        ref = tok.decode(generate_ids(model, ids, max_new_tokens=8, eos_id=tok.eot_id)[0]).split("\n\n")[0]
        assert s["filtered_resps"][0] == ref
