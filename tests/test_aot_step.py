"""The decode step compiled ahead of time (codex_lab.infer.aot_step, FastDecoder(compile="aot")):
held to the eager step token for token, kept on disk and loaded by a later decoder, keyed by what
its code depends on, and refused where it cannot run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from codex_lab.infer.aot_step import package_key, weights_digest
from codex_lab.infer.compile_cache import private_folder
from codex_lab.infer.fast_decode import FastDecoder
from codex_lab.nn.config import ModelConfig
from codex_lab.nn.model import CodexModel

PROMPT = [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One compile cache for this file's tests: each package (next, logits, verify) is built once."""
    return tmp_path_factory.mktemp("aot_cache")


def model(seed: int = 0) -> CodexModel:
    """A tiny GQA model whose greedy tokens vary (weights scaled x3: seed 0 gives 9 distinct ids in
    24), so equal token lists mean equal steps, not one repeated id."""
    torch.manual_seed(seed)
    m = CodexModel(ModelConfig(vocab_size=64, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=64)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(3.0)
    return m


def test_the_aot_step_equals_the_eager_step_and_a_later_decoder_loads_it(cache_dir, monkeypatch):
    monkeypatch.setenv("CODEX_LAB_COMPILE_CACHE", str(cache_dir))
    m = model()
    eager = FastDecoder(m, compile=False).generate(PROMPT, 24)[0]
    assert len(set(eager)) >= 5  # the tokens move: equality below is a real check
    first = FastDecoder(m, compile="aot")
    assert first.generate(PROMPT, 24)[0] == eager
    assert first.compiled and not first.aot_from_disk and not first.compile_error
    assert first.decode_calls == 23  # every decode step ran the package (the first token is the prefill's)
    # the package is called straight through its loader; the same inputs through the package's own
    # wrapper (the plain path) give the same tensor, bit for bit
    from codex_lab.infer.aot_step import DirectRunner

    runner = first._aot.runner
    assert isinstance(runner, DirectRunner)
    tokens, pos = torch.tensor([[5]]), torch.tensor([[3]])
    fast = runner(tokens, pos, *first.k, *first.v).clone()
    assert torch.equal(fast, runner.compiled(tokens, pos, *first.k, *first.v))
    with pytest.raises(ValueError, match=f"takes {runner.n_inputs} tensors; got 2"):
        runner(tokens, pos)
    packages = list(cache_dir.rglob("step-*.pt2"))
    assert len(packages) == 1
    # a later decoder of the same model (a restarted process) loads the kept package instead of building it
    again = FastDecoder(m, compile="aot")
    again.prepare()
    assert again.aot_from_disk and again.generate(PROMPT, 24)[0] == eager
    assert len(list(cache_dir.rglob("step-*.pt2"))) == 1  # loaded, nothing built
    # generation twice from one decoder: the cache is rewritten by the prefill, nothing leaks between prompts
    assert again.generate([7, 8, 9], 10)[0] == FastDecoder(m, compile=False).generate([7, 8, 9], 10)[0]


def test_the_package_key_follows_what_the_code_depends_on():
    m = model()
    d = FastDecoder(m, compile=False, attention="one_query")
    key = package_key(d, "next", {})
    assert package_key(FastDecoder(m, compile=False, attention="one_query"), "next", {}) == key
    assert package_key(FastDecoder(m, compile=False, attention="one_query", max_len=32), "next", {}) != key
    assert package_key(d, "logits", {}) != key
    assert package_key(d, "next", {"freezing": True}) != key
    other = model()
    with torch.no_grad():
        next(other.parameters())[0, 0] += 1e-3  # one weight moved: another model, another package
    assert weights_digest(other) != weights_digest(m)
    assert package_key(FastDecoder(other, compile=False, attention="one_query"), "next", {}) != key
    import codex_lab.infer.aot_step as aot

    with pytest.MonkeyPatch.context() as mp:  # other source for the step (an older checkout): another package
        mp.setattr(aot, "code_digest", lambda: "0" * 64)
        assert package_key(d, "next", {}) != key


def test_the_code_digest_covers_the_steps_source(tmp_path, monkeypatch):
    """The digest reads the layers and the decoder's step: a changed line there gives another key."""
    import codex_lab.infer.aot_step as aot

    digest = aot.code_digest()
    src = Path(aot.__file__).resolve().parent.parent  # codex_lab/
    copy = tmp_path / "codex_lab"
    for sub in ("nn", "infer"):
        for f in (src / sub).rglob("*.py"):
            (copy / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (copy / f.relative_to(src)).write_bytes(f.read_bytes())
    fake = copy / "infer" / "aot_step.py"
    monkeypatch.setattr(aot, "__file__", str(fake))
    aot.code_digest.cache_clear()
    try:
        assert aot.code_digest() == digest  # the same files: the same digest
        layers = copy / "nn" / "attention.py"
        layers.write_text(layers.read_text() + "\n# one more line\n")
        aot.code_digest.cache_clear()
        assert aot.code_digest() != digest
    finally:
        aot.code_digest.cache_clear()


def test_a_folder_others_can_write_is_refused(tmp_path):
    ok = tmp_path / "mine" / "aoti"
    assert private_folder(ok) == "" and (os.stat(ok).st_mode & 0o777) == 0o700
    open_dir = tmp_path / "open" / "aoti"
    open_dir.mkdir(parents=True)
    os.chmod(open_dir, 0o777)
    why = private_folder(open_dir)
    assert "refusing" in why and "chmod 700" in why


def test_a_decoder_a_child_could_not_rebuild_is_built_in_process(monkeypatch):
    """A class defined in ``__main__`` (a notebook's own module or decoder) cannot be imported by a
    new interpreter: such a package is built in-process, every other one in a child."""
    from codex_lab.infer.aot_step import _defined_in_main

    d = FastDecoder(model(), compile=False)
    assert not _defined_in_main(type(d), d.model)

    class Local(torch.nn.Module):
        def forward(self, x):
            return x

    monkeypatch.setattr(Local, "__module__", "__main__")
    d.model.extra = Local()
    assert _defined_in_main(type(d), d.model)


def test_bad_compile_arguments_are_named():
    with pytest.raises(ValueError, match="compile='fast'"):
        FastDecoder(model(), compile="fast")  # type: ignore[arg-type]


def test_a_package_that_cannot_be_built_leaves_the_decoder_eager_and_says_why(monkeypatch):
    import codex_lab.infer.aot_step as aot

    def broken(*a, **k):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(aot, "aot_step", broken)
    m = model()
    d = FastDecoder(m, compile="aot")
    assert d.generate(PROMPT, 12)[0] == FastDecoder(m, compile=False).generate(PROMPT, 12)[0]
    assert "no C++ compiler" in d.compile_error and not d.compiled


def test_generation_through_the_aot_logits_step_matches_the_static_cache(cache_dir, monkeypatch):
    """generate_ids(cache="aot"): the package that returns logits (sampling picks from them), over
    the model's max_seq_len slots, gives the static-cache loop's greedy tokens; its logits equal the
    eager step's to float32 rounding."""
    from codex_lab.infer.generate import generate_ids

    monkeypatch.setenv("CODEX_LAB_COMPILE_CACHE", str(cache_dir))
    m = model()
    want, _ = generate_ids(m, PROMPT, max_new_tokens=20, cache="static")
    got, _ = generate_ids(m, PROMPT, max_new_tokens=20, cache="aot")
    assert got == want and len(set(want)) >= 5
    d = FastDecoder(m, compile="aot")
    eager = FastDecoder(m, compile=False, attention="one_query")
    prompt = torch.tensor([PROMPT])
    a = d.prefill_logits(prompt)
    torch.testing.assert_close(a, eager.prefill_logits(prompt))  # the prefill is the same eager step on both
    nxt = a.argmax(-1)
    la = d.decode_logits(nxt[:, None], torch.tensor([len(PROMPT)]))
    lb = eager.decode_logits(nxt[:, None], torch.tensor([len(PROMPT)]))
    assert d.aot_from_disk and d.compiled  # the package generate_ids built, loaded
    # 1e-4: the frozen GEMM kernels sum in another order than ATen's; float32 logits of size ~10 differ by ~1e-5
    torch.testing.assert_close(la, lb, atol=1e-4, rtol=1e-4)


def test_verify_sizes_are_powers_of_two_then_num_draft():
    from codex_lab.infer.prompt_lookup import verify_sizes

    assert verify_sizes(16) == [1, 2, 4, 8, 16] and verify_sizes(6) == [1, 2, 4, 6] and verify_sizes(1) == [1]
    with pytest.raises(ValueError, match="num_draft must be >= 1"):
        verify_sizes(0)


def copying_prompt() -> list[int]:
    """A prompt that repeats itself (a block of 8 ids, then its start again): lookup drafts from it."""
    block = [9, 14, 3, 27, 41, 8, 19, 33]
    return block * 3 + block[:3]


@pytest.mark.parametrize("compile", [False, "aot"])
def test_prompt_lookup_on_the_fast_decoder_gives_greedy_tokens(compile, cache_dir, monkeypatch):
    """Prompt lookup through FastDecoder's verify step (eager, and the AOT packages of the verify
    sizes) emits exactly greedy decoding's tokens, with guesses accepted and rejected along the way
    (so both the accept and the overwrite-instead-of-rollback paths ran)."""
    from codex_lab.infer.generate import generate_ids
    from codex_lab.infer.prompt_lookup import prompt_lookup_generate

    monkeypatch.setenv("CODEX_LAB_COMPILE_CACHE", str(cache_dir))
    m = model()
    prompt = copying_prompt()
    want, _ = generate_ids(m, prompt, max_new_tokens=24, cache="static")
    dec = FastDecoder(m, compile=compile)
    got, reason, st = prompt_lookup_generate(dec, prompt, max_new_tokens=24, num_draft=4)  # costs measured
    assert got == want and reason == "length"
    # every verify as cheap as a plain step: each round verifies every guess found
    free = {0: 1.0, 1: 1.0, 2: 1.0, 4: 1.0}
    got, reason, st = prompt_lookup_generate(dec, prompt, max_new_tokens=24, num_draft=4, draft_costs=free)
    assert got == want and reason == "length"
    assert st.accepted > 0 and st.rejections > 0, st
    # the same rounds as the plain-model prompt lookup: same drafts, same acceptances
    _, _, ref = prompt_lookup_generate(m, prompt, max_new_tokens=24, num_draft=4)
    assert (st.accepted, st.rejections, st.target_calls, st.no_match) == (ref.accepted, ref.rejections, ref.target_calls,
                                                                   ref.no_match)
    # every verify dearer than the tokens it could bring (5 plain steps for at most 5 tokens): no round drafts
    dear = {0: 1.0, 1: 2.0, 2: 3.0, 4: 5.0}
    got, _, st = prompt_lookup_generate(dec, prompt, max_new_tokens=24, num_draft=4, draft_costs=dear)
    assert got == want and st.rounds == 0 and st.target_calls == 24, st
    if compile == "aot":
        assert dec.compiled and not dec.compile_error
    else:  # every verify padded to the smallest size that holds its guesses, never past num_draft + 1
        shapes: list[int] = []
        real = FastDecoder.verify
        monkeypatch.setattr(FastDecoder, "verify", lambda self, x, pos: shapes.append(x.shape[1]) or real(self, x, pos))
        assert prompt_lookup_generate(FastDecoder(m, compile=False), prompt, max_new_tokens=24, num_draft=4,
                                      draft_costs=free)[0] == want
        assert shapes and set(shapes) <= {2, 3, 5} and min(shapes) < 5, shapes  # 1, 2 or 4 guesses + the last token
    with pytest.raises(ValueError, match="max_len >= "):
        prompt_lookup_generate(FastDecoder(m, compile=False, max_len=40), prompt, max_new_tokens=10, num_draft=8)
    with pytest.raises(ValueError, match="give 0 \\(a plain step\\) and each of"):
        prompt_lookup_generate(dec, prompt, max_new_tokens=10, num_draft=4, draft_costs={0: 1.0, 4: 1.0})
    with pytest.raises(ValueError, match="a model's forward verifies every guess"):
        prompt_lookup_generate(m, prompt, max_new_tokens=10, num_draft=4, draft_costs=free)


def test_draft_length_verifies_the_guesses_that_pay():
    """Expected tokens per ms decides: E[tokens of g guesses] = (1 - a^(g+1)) / (1 - a) over the
    verify size's cost, against one token per plain step. Each case has a neighbour that flips it."""
    from codex_lab.infer.prompt_lookup import draft_length

    costs = {0: 1.0, 1: 1.3, 2: 1.6, 4: 1.8, 8: 4.0}  # the shape of the shipped model's measured costs
    # a = 0.8: 4 guesses bring 3.36 tokens for 1.8 (1.87 per unit), 8 bring 4.33 for 4.0 (1.08)
    assert draft_length(9, 0.8, costs) == (4, 4)
    assert draft_length(3, 0.8, costs) == (3, 4)  # 3 found: padded to size 4, the smallest that holds them
    assert draft_length(0, 0.8, costs) == (0, 0)  # nothing found: a plain step
    # a = 0.1: the best verify (1 guess: 1.1 tokens for 1.3) loses to a plain step
    assert draft_length(9, 0.1, costs) == (0, 0)
    # verify as cheap as a plain step: every guess pays, up to the largest size
    assert draft_length(9, 0.1, dict.fromkeys(costs, 1.0)) == (8, 8)
    with pytest.raises(ValueError, match="key 0"):
        draft_length(3, 0.5, {1: 1.0})


def test_the_acceptance_estimate_recovers_through_plain_steps(monkeypatch):
    """Started pessimistic (a = 0.1: no verify pays), the rounds are plain steps; each still judges
    the first guess found against the token the step produced, so on a prompt that copies itself
    the estimate rises and verifies begin. Without those free judgements no round would draft."""
    import codex_lab.infer.prompt_lookup as pl
    from codex_lab.infer.generate import generate_ids

    m = model()
    prompt = copying_prompt()  # 27 tokens; the model's context is 64
    want, _ = generate_ids(m, prompt, max_new_tokens=32, cache="static")
    costs = {0: 1.0, 1: 1.3, 2: 1.6, 4: 1.8}
    monkeypatch.setattr(pl, "ACCEPT_PRIOR", (0.1, 0.9))
    dec = FastDecoder(m, compile=False)
    got, _, st = pl.prompt_lookup_generate(dec, prompt, max_new_tokens=32, num_draft=4, draft_costs=costs)
    assert got == want and st.rounds > 0 and st.accepted > 0, st
    # the counterfactual: guesses that are always wrong (a token greedy decoding never emits here)
    # keep the estimate low, and no round drafts
    wrong = next(t for t in range(m.cfg.vocab_size) if t not in want)
    monkeypatch.setattr(pl, "lookup_draft", lambda tokens, num_draft, **kw: [wrong] * num_draft)
    got2, _, st2 = pl.prompt_lookup_generate(dec, prompt, max_new_tokens=32, num_draft=4, draft_costs=costs)
    assert got2 == want and st2.rounds == 0 and st2.target_calls == 32, st2


def test_the_int8_copy_compiled_ahead_of_time_stays_as_close_to_float32_as_its_eager_step(cache_dir, monkeypatch):
    """The int8 matmuls (bfloat16 activations, int8 codes) compile into Inductor's weight-only int8
    kernel. Held to the plain path (every matmul dequantised to float32, ``Int8Linear.reference``):
    the package's logits are no further from it than the eager bfloat16 step's."""
    from codex_lab.nn.int8 import Int8Linear, quantize_int8

    monkeypatch.setenv("CODEX_LAB_COMPILE_CACHE", str(cache_dir))
    q, _ = quantize_int8(model(3))
    assert any(isinstance(mod, Int8Linear) for mod in q.modules())

    def logits(dec: FastDecoder) -> torch.Tensor:
        dec.prefill_logits(torch.tensor([PROMPT]))
        return dec.decode_logits(torch.tensor([[7]]), torch.tensor([len(PROMPT)]))

    with monkeypatch.context() as m:
        m.setattr(Int8Linear, "forward", Int8Linear.reference)
        ref = logits(FastDecoder(q, compile=False, attention="one_query"))
    eager_err = float((logits(FastDecoder(q, compile=False, attention="one_query")) - ref).abs().max())
    d = FastDecoder(q, compile="aot")
    aot_err = float((logits(d) - ref).abs().max())
    assert d.decode_calls == 1 and not d.compile_error  # the package ran
    assert eager_err > 0  # the fast path really rounds: a bound on its distance means something
    # the package rounds the activations to bfloat16 as the eager path does, and keeps each
    # matmul's output in float32 where the eager path rounds it too (measured: 0.021 against
    # 0.035 here); 1.25x leaves room for a different summation order, not for another rounding
    assert aot_err <= 1.25 * eager_err, (aot_err, eager_err)
