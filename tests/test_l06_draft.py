"""Lesson 06's distilled draft: built from the target, trained by distillation, shipped, accepted."""

import json

import pytest
import torch

from codex_lab.lessons.l06_inference.draft import (
    DRAFT_DIR, DistillConfig, draft_meta, draft_state, distill, heldout_agreement, kl_to_target, load_draft,
    make_draft, save_draft,
)
from codex_lab.infer.generate import generate_ids
from codex_lab.infer.speculative import speculative_generate
from codex_lab.nn.model import CodexModel
from codex_lab.nn.surgery import truncated_draft
from codex_lab.training_state import training_state

from conftest import tiny_config


def model_of(seed: int = 0, **kw) -> CodexModel:
    torch.manual_seed(seed)
    return CodexModel(tiny_config(**kw)).eval()


def test_draft_starts_as_the_early_exit_and_shares_only_embedding_and_head():
    target = model_of()
    draft = make_draft(target, 1)
    x = torch.randint(0, target.cfg.vocab_size, (2, 9))
    with torch.no_grad():
        assert torch.equal(draft(x).logits, truncated_draft(target, 1)(x).logits)
    assert draft.embed is target.embed and draft.lm_head is target.lm_head
    assert draft.layers[0] is not target.layers[0] and draft.norm is not target.norm  # copies: training leaves the target alone
    assert set(draft_state(draft)) == {k for k in draft.state_dict() if k.startswith(("layers.", "norm."))}
    with pytest.raises(ValueError, match="n_layer"):
        make_draft(target, target.cfg.n_layer + 1)


def test_kl_is_zero_for_equal_logits_and_positive_otherwise():
    a = torch.randn(3, 5, 11)
    assert float(kl_to_target(a, a)) == pytest.approx(0.0, abs=1e-6)
    assert float(kl_to_target(a, a + 3.0)) == pytest.approx(0.0, abs=1e-5)  # a shift of every logit is the same distribution
    assert float(kl_to_target(a, torch.randn(3, 5, 11))) > 0.1


def trained_tiny_target() -> tuple[CodexModel, torch.Tensor]:
    """A tiny target trained for 60 steps on a learnable stream (each token = (2 x previous + the
    one before) mod 64, 10% noise), so its second block matters and its early exit is off."""
    from codex_lab.data.batches import random_batch

    torch.manual_seed(0)
    target = CodexModel(tiny_config()).train()
    g = torch.Generator().manual_seed(0)
    seq = [1, 2]
    for _ in range(4000):
        seq.append((2 * seq[-1] + seq[-2]) % 64)
    base = torch.tensor(seq)
    stream = torch.where(torch.rand(base.shape, generator=g) < 0.9, base, torch.randint(0, 512, base.shape, generator=g))
    opt = torch.optim.AdamW(target.parameters(), lr=1e-2)
    for _ in range(60):
        x, y = random_batch(stream[:3000], 8, 32, g)
        loss = target(x, y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return target.eval(), stream


def test_distillation_brings_the_draft_closer_and_leaves_the_target_untouched():
    target, stream = trained_tiny_target()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    flags = [p.requires_grad for p in target.parameters()]
    cfg = DistillConfig(steps=30, batch_size=4, seq_len=32, lr=3e-3, warmup=2, eval_every=10, eval_windows=8)
    for loss in ("kl", "greedy"):
        cfg.loss = loss
        res = distill(target, None, cfg, data=(stream[:3000], stream[3000:]))
        (s0, a0, k0), (s1, a1, k1) = res.curve[0], res.curve[-1]
        assert (s0, s1) == (0, 30) and len(res.curve) == 4
        assert k0 > 0.05 and a0 < 0.95, "the test's target is too close to its own early exit to show anything"
        if loss == "kl":  # what each loss minimises moved the right way on held-out windows
            assert k1 < 0.5 * k0, f"held-out KL did not fall ({k0:.3f} -> {k1:.3f})"
        else:
            assert a1 > a0, f"held-out agreement did not rise ({a0:.3f} -> {a1:.3f})"
    for k, v in target.state_dict().items():
        assert torch.equal(v, before[k]), f"distillation changed the target's {k}"
    assert [p.requires_grad for p in target.parameters()] == flags
    with pytest.raises(ValueError, match="loss"):
        distill(target, None, DistillConfig(loss="mse"), data=(stream, stream))


def test_save_and_load_round_trip(tmp_path):
    target = model_of()
    draft = make_draft(target, 2)
    with torch.no_grad():
        for p in draft_state(draft).values():
            p.add_(0.01 * torch.randn_like(p))  # a draft that differs from the target's blocks
    from codex_lab.lessons.l06_inference.draft import DistillResult

    save_draft(DistillResult(draft, DistillConfig(n_layer=2), curve=[(0, 0.1, 2.0)]), tmp_path, command="test")
    back = load_draft(target, tmp_path)
    x = torch.randint(0, target.cfg.vocab_size, (1, 12))
    with torch.no_grad():
        # stored in float16: ~3 significant digits
        torch.testing.assert_close(back(x).logits, draft(x).logits, atol=2e-2, rtol=0)
    assert back.cfg.n_layer == 2 and json.loads((tmp_path / "meta.json").read_text())["command"] == "test"


def test_speculative_with_a_distilled_draft_equals_target_greedy():
    target = model_of(n_kv_head=2, attn_patterns=["window:6", "dense"])
    draft = make_draft(target, 1)
    prompt = torch.randint(0, 512, (7,), generator=torch.Generator().manual_seed(1)).tolist()
    ref, _ = generate_ids(target, prompt, max_new_tokens=15)
    for gamma in (1, 3, 5):
        assert speculative_generate(target, draft, prompt, max_new_tokens=15, gamma=gamma)[0] == ref


# ---- the shipped draft, around the shipped model ----

@pytest.fixture(scope="module")
def shipped():
    from codex_lab.training.checkpoint import load_pretrained

    ck = load_pretrained("cpu")
    return ck, load_draft(ck.model)


def test_shipped_draft_is_small_and_says_how_it_was_made():
    size = (DRAFT_DIR / "draft.safetensors").stat().st_size
    assert size < 2 * 2**20, f"the shipped draft is {size / 2**20:.2f} MiB; keep it under 2 MiB"
    meta = draft_meta()
    for key in ("command", "commit", "date", "machine", "train_cpu_s", "config", "curve"):
        assert key in meta, f"meta.json lacks {key}"
    curve = [(s, a) for s, a, _ in meta["curve"]]
    assert curve[0][0] == 0 and curve[-1][0] == meta["config"]["steps"]
    # the held-out curve was recorded densely enough for the training-state rule to judge it
    # (the report prints the state), and the run neither diverged nor degraded
    st = training_state([curve], higher_is_better=True, min_change=0.01, arm="draft")
    assert not st.reason and st.state != "degrading", st.describe()
    assert curve[-1][1] > curve[0][1] + 0.1  # distillation raised held-out agreement over the early exit


def test_shipped_draft_is_accepted_on_held_out_prompts_and_changes_no_token(shipped):
    from codex_lab.lessons.l06_inference.spec_scenarios import PROMPT_TYPES, acceptance, typed_prompts

    ck, draft = shipped
    torch.set_grad_enabled(False)
    try:
        prompts = typed_prompts(ck.tokenizer, 2, fim_format=ck.meta.get("fim_format", "psm"))
        stats = []
        for kind in PROMPT_TYPES:
            for p in prompts[kind]:
                ref, _ = generate_ids(ck.model, p, max_new_tokens=32)
                ids, _, st = speculative_generate(ck.model, draft, p, max_new_tokens=32, gamma=4)
                assert ids == ref, f"speculative != target greedy on a {kind} prompt"
                stats.append(st)
        untrained = [speculative_generate(ck.model, truncated_draft(ck.model, 1), p, max_new_tokens=32, gamma=4)[2]
                     for p in prompts["mid_function"]]
    finally:
        torch.set_grad_enabled(True)
    alpha = acceptance(stats)
    assert alpha >= 0.5, f"the shipped draft's acceptance on held-out prompts is {alpha:.2f} (< 0.5)"
    assert acceptance(untrained) < alpha  # distillation is what bought it


def test_heldout_agreement_of_a_model_with_itself_is_one():
    target = model_of()
    x = [torch.randint(0, target.cfg.vocab_size, (2, 10))]
    a, k = heldout_agreement(target, target, x)
    assert a == 1.0 and k == pytest.approx(0.0, abs=1e-6)
