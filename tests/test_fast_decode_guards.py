"""FastDecoder skips dynamo's guard evaluation after its first compiled step (``skip_guards``):
the same tokens as with every guard evaluated and as the plain cached generator, no
recompiles, and a step that dynamo refuses in that stance runs with its guards instead."""

import pytest
import torch

from codex_lab.infer.fast_decode import FastDecoder
from codex_lab.infer.generate import generate_ids_cached
from codex_lab.nn.model import CodexModel

from conftest import tiny_config


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return CodexModel(tiny_config(vocab_size=300)).eval()


def test_unguarded_steps_give_the_guarded_tokens(model):
    ids = torch.randint(0, 300, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    ref = generate_ids_cached(model, ids, max_new_tokens=20)[0]
    dec = FastDecoder(model, max_len=40, backend="eager")  # "eager" traces with dynamo: the same guards, no codegen
    assert dec.skip_guards
    fast = dec.generate(ids, 20)[0]
    dec.skip_guards = False
    guarded = dec.generate(ids, 20)[0]
    assert fast == guarded == ref
    assert dec.compiled and dec.recompiles == 0
    # a second decoder (another graph of the same code) is told apart by the guards that still run
    other = CodexModel(tiny_config(vocab_size=300)).eval()
    dec2 = FastDecoder(other, max_len=40, backend="eager")
    assert dec2.generate(ids, 20)[0] == generate_ids_cached(other, ids, max_new_tokens=20)[0]
    assert dec.generate(ids, 20)[0] == ref


def test_a_refused_recompile_runs_the_step_with_its_guards():
    calls = []

    def step(tokens, pos):
        calls.append(torch.compiler.is_compiling())
        if len(calls) == 1:
            raise RuntimeError("Recompilation triggered with skip_guard_eval_unsafe stance. ...")
        return tokens[:, 0] + 1

    out = FastDecoder._unguarded(step, torch.tensor([[4]]), torch.tensor([7]))
    assert out.tolist() == [5] and len(calls) == 2

    def broken(tokens, pos):
        raise RuntimeError("a real failure")

    with pytest.raises(RuntimeError, match="a real failure"):
        FastDecoder._unguarded(broken, torch.tensor([[4]]), torch.tensor([7]))
