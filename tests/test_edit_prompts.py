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


def test_lesson_06_prints_the_recorded_compiled_lookup_with_what_caps_it():
    """The code-edit record's compiled rows, labelled as recorded: the ratio and its rounds, and the
    two figures that cap it (rounds with nothing to copy, a verify's cost in steps); none recorded
    (or an older record without the compiled rows): how to measure it."""
    from codex_lab.lessons.l06_inference.report import code_edit_lines

    row = {"scenario": "code_edit", "impl": "prompt_lookup_fast_aot_d16", "speedup_vs_fast_decode": 1.25,
           "speedup_rounds": [1.1, 1.3, 1.25], "tokens_per_target_call": 2.5, "acceptance_rate": 0.9, "same_tokens": True,
           "no_match_share": 0.4, "verify_cost_vs_step": {"1": 1.2, "2": 1.4, "4": 1.8}}
    rec = {"measured": "2026-01-01", "command": "codex-lab bench --mode full inference --scenarios code_edit --json",
           "conditions": "quiet", "rows": [{"scenario": "code_edit", "impl": "plain_static_cache"}, row]}
    text = code_edit_lines({"code_edit": rec})
    assert "recorded 2026-01-01, not this run" in text and "1.25x, goal 1.30x: missed (rounds 1.10-1.30)" in text
    met = code_edit_lines({"code_edit": {**rec, "rows": [{**row, "speedup_vs_fast_decode": 1.31}]}})
    assert "1.31x, goal 1.30x: met" in met  # the input that flips the goal
    assert "nothing to copy in 40% of the decode rounds" in text and "4 guesses cost 1.80x a one-token step" in text
    older = {**rec, "rows": rec["rows"][:1]}  # before the compiled path was timed
    for r in ({}, {"code_edit": older}):
        assert "not recorded" in code_edit_lines(r) and "--scenarios code_edit" in code_edit_lines(r)
    # a row without the caps (recorded before they were): the ratio alone
    bare = {k: v for k, v in row.items() if k not in ("no_match_share", "verify_cost_vs_step")}
    assert "nothing to copy" not in code_edit_lines({"code_edit": {**rec, "rows": [bare]}})
