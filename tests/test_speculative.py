"""Speculative decoding: greedy output == the target's greedy output, whatever the draft."""

import pytest
import torch

from codex_lab.infer.generate import generate_ids
from codex_lab.nn.model import CodexModel
from codex_lab.infer.speculative import (
    SpecStats, expected_speedup, expected_tokens_per_round, speculative_generate,
)
from codex_lab.nn.surgery import truncated_draft
from codex_lab.lessons.l06_inference.draft import make_draft

from conftest import tiny_config



def model_of(seed: int = 0, **kw) -> CodexModel:
    torch.manual_seed(seed)
    return CodexModel(tiny_config(**kw)).eval()


def moved_draft(target: CodexModel) -> CodexModel:
    """The distilled draft's shape (own block, shared embedding and head), its block moved off the copy as training would."""
    draft = make_draft(target, 1)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in draft.layers.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return draft


@pytest.mark.parametrize("kw", [{}, {"n_kv_head": 2, "attn_patterns": ["window:6", "dense"]}])
def test_speculative_equals_target_greedy(kw):
    target = model_of(**kw)
    drafts = {
        "itself": target,  # every guess right: gamma + 1 tokens per round
        "first layer": truncated_draft(target, 1),
        "own block (distilled shape)": moved_draft(target),
        "unrelated": model_of(seed=5, n_layer=1),  # mostly wrong guesses: still the same output
    }
    g = torch.Generator().manual_seed(0)
    for T in (1, 9):
        prompt = torch.randint(0, 512, (T,), generator=g).tolist()
        ref, _ = generate_ids(target, prompt, max_new_tokens=17)
        for name, draft in drafts.items():
            for gamma in (1, 4):
                ids, reason, st = speculative_generate(target, draft, prompt, max_new_tokens=17, gamma=gamma)
                assert ids == ref and reason == "length", f"draft {name}, gamma {gamma}, prompt {T}"
                if name == "itself":
                    assert st.acceptance_rate == 1.0 and st.tokens_per_round == gamma + 1
                assert st.target_calls <= 17


def test_eos_stops_like_the_target():
    target = model_of()
    prompt = [3, 4, 5]
    ref, _ = generate_ids(target, prompt, max_new_tokens=12)
    eos = ref[5]  # pretend the 6th greedy token is end-of-text
    want, reason = generate_ids(target, prompt, max_new_tokens=12, eos_id=eos)
    got, got_reason, _ = speculative_generate(target, truncated_draft(target, 1), prompt, max_new_tokens=12, gamma=3, eos_id=eos)
    assert (got, got_reason) == (want, reason) and reason == "stop"


def test_expected_tokens_formula_and_stats():
    assert expected_tokens_per_round(0.0, 4) == 1.0
    assert expected_tokens_per_round(1.0, 4) == 5.0
    assert expected_tokens_per_round(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)  # sum of a^i, i = 0..gamma
    st = SpecStats(gamma=4, rounds=2, accepted=5, rejections=1, emitted=7)
    assert st.acceptance_rate == 5 / 6 and st.tokens_per_round == 3.5
    with pytest.raises(ValueError):
        expected_tokens_per_round(1.5, 3)
    assert expected_speedup(1.0, 4, 0.0) == 5.0  # a free, perfect draft: gamma + 1 tokens per forward
    assert expected_speedup(0.5, 2, 0.25) == pytest.approx(1.75 / 1.5)
    assert expected_speedup(0.0, 4, 0.5) < 1  # useless guesses only cost time
    assert expected_speedup(1.0, 4, 0.0, verify_cost=2.5) == 2.0
    with pytest.raises(ValueError, match="n_layers"):
        truncated_draft(model_of(), 3)
