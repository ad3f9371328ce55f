"""Lesson 06's prompt-lookup benchmark prompts: the edit prompts are built to be copied, the
continuation prompts are held-out files continued (not built to be copied), and the benchmark
keeps the two apart as two scenarios."""

from __future__ import annotations

import pytest

from codex_lab.data.corpus import load_corpus
from codex_lab.lessons.l06_inference.fast_scenarios import (CONTINUATION_FILES, bench_code_edit, code_edit_prompts,
                                                      continuation_prompts)
from conftest import seeded_model


def test_continuation_prompts_are_held_out_file_starts_cut_at_a_line_end(tok):
    prompts = continuation_prompts(tok, 3, max_prompt=120, min_prompt=40, seed=0)
    held_out = load_corpus(max_files=CONTINUATION_FILES).texts("val")
    assert len(prompts) == 3 and all(40 <= len(p) <= 120 for p in prompts)
    for p in prompts:
        text = tok.decode(p)
        assert text.endswith("\n") and any(t.startswith(text) for t in held_out), text[:80]
        assert "_v2(" not in text  # no renamed copy set up: the edit prompts' construction
    assert continuation_prompts(tok, 3, max_prompt=120, min_prompt=40, seed=1) != prompts  # the seed draws the files
    with pytest.raises(ValueError, match="held-out files give a prompt"):
        continuation_prompts(tok, 3, max_prompt=30, min_prompt=40)  # no file can give 40-30 tokens


def test_the_edit_prompts_end_on_the_renamed_copy(tok):
    for p in code_edit_prompts(tok, 2, max_prompt=200):
        assert "_v2(" in tok.decode(p).splitlines()[-1]


def test_the_benchmark_keeps_the_two_kinds_apart_with_the_same_tokens(tok):
    model = seeded_model(tok, max_seq_len=256)
    rows = bench_code_edit(model, tok, n_prompts=2, new_tokens=8, rounds=1, kind="continuation")
    assert {r["scenario"] for r in rows} == {"code_continuation"}
    look = next(r for r in rows if "speedup_vs_plain" in r)
    assert look["same_tokens"] is True and len(look["speedup_rounds"]) == 1
    fast = next(r for r in rows if r["impl"].startswith("prompt_lookup_fast"))  # the compiled path, what its rounds chose by
    assert fast["same_tokens"] is True and 0.0 <= fast["no_match_share"] <= 1.0
    assert set(fast["verify_cost_vs_step"]) == {"1", "2", "4", "8", "16"} and min(fast["verify_cost_vs_step"].values()) > 0
    with pytest.raises(ValueError, match="built to be copied"):
        bench_code_edit(model, tok, n_prompts=1, new_tokens=4, rounds=1, kind="copy")
