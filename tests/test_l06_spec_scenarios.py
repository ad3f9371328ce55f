"""Lesson 06's speculative scenario: the typed prompts and the bench's bookkeeping (no timing asserted)."""

import math

import pytest
import torch

from codex_lab.data.fim import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX
from codex_lab.lessons.l06_inference.draft import make_draft
from codex_lab.infer.speculative import expected_speedup
from codex_lab.lessons.l06_inference.spec_scenarios import PROMPT_TYPES, acceptance, bench_speculative, typed_prompts
from codex_lab.nn.model import CodexModel
from codex_lab.infer.speculative import SpecStats

from conftest import tiny_config


@pytest.fixture(scope="module")
def shipped_tok():
    from codex_lab.training.checkpoint import load_pretrained

    return load_pretrained("cpu").tokenizer


def test_typed_prompts_end_where_each_kind_says(shipped_tok):
    tok = shipped_tok
    ps = typed_prompts(tok, 3, max_prompt=160)
    assert set(ps) == set(PROMPT_TYPES)
    for kind, prompts in ps.items():
        assert len(prompts) == 3 and all(16 <= len(p) <= 160 for p in prompts), kind
    for p in ps["docstring"]:
        assert tok.decode(p).rstrip().endswith(('"""', "'''"))
    for p in ps["imports"]:
        assert tok.decode(p).rstrip("\n").splitlines()[-1].startswith(("import ", "from "))
    for p in ps["mid_function"]:
        assert tok.decode(p).endswith("\n")
    pre, suf, mid = (tok.token_id(s) for s in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE))
    for p in ps["fim"]:  # psm: <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|>
        assert p[0] == pre and p[-1] == mid and suf in p
    assert typed_prompts(tok, 3, max_prompt=160) == ps  # deterministic for a seed
    assert typed_prompts(tok, 3, max_prompt=160, seed=1) != ps


def test_pooled_acceptance():
    st = [SpecStats(gamma=4, accepted=3, rejections=1), SpecStats(gamma=4, accepted=1, rejections=3)]
    assert acceptance(st) == 0.5 and acceptance([]) == 0.0


def test_bench_records_gamma_chosen_by_the_formula_and_same_tokens(shipped_tok):
    torch.manual_seed(0)
    target = CodexModel(tiny_config(vocab_size=shipped_tok.vocab_size, max_seq_len=256)).eval()
    draft = make_draft(target, 1)
    with torch.no_grad():
        rows = bench_speculative(target, shipped_tok, draft, n_per_type=1, new_tokens=6, gammas=(1, 2),
                                 cost_repeats=3, rounds=2, fast_decoder=False)
    acc = [r for r in rows if r["impl"] == "acceptance"]
    assert [r["prompt_type"] for r in acc] == list(PROMPT_TYPES)
    assert all(0.0 <= r["acceptance_rate"] <= 1.0 and r["same_tokens"] for r in acc)
    sp = next(r for r in rows if r["impl"].startswith("speculative_g"))
    pred = {int(g): p for g, p in sp["predicted_by_gamma"].items()}
    assert sp["gamma"] == max(pred, key=pred.get)
    assert sp["predicted_speedup"] == pytest.approx(expected_speedup(sp["acceptance_rate"], sp["gamma"], sp["c"], sp["v"]))
    assert sp["speedup_vs_plain_lo"] <= sp["speedup_vs_plain"] <= sp["speedup_vs_plain_hi"]
    assert {r["impl"] for r in rows} >= {"plain_eager", sp["impl"]}
    assert all(math.isfinite(r["tokens_per_s"]) for r in rows if "tokens_per_s" in r)
