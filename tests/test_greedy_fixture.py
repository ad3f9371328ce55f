"""Generated tokens do not change when code moves: greedy output of the shipped model on
fixed prompts equals the tokens recorded in tests/fixtures/greedy_tiny.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from codex_lab import generate_ids, load_pretrained

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "greedy_tiny.json").read_text())


@pytest.fixture(scope="module")
def shipped():
    ck = load_pretrained()
    return ck.model.eval(), ck.tokenizer


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=lambda c: c["prompt"].split("\n")[0][:24])
def test_greedy_tokens_match_fixture(shipped, case) -> None:
    model, tok = shipped
    assert tok.encode(case["prompt"]) == case["prompt_ids"], "the tokenizer changed"
    with torch.no_grad():
        ids, reason = generate_ids(model, case["prompt_ids"], max_new_tokens=FIXTURE["max_new_tokens"], temperature=0.0)
    assert ids == case["new_ids"]
    assert reason == case["finish_reason"]
