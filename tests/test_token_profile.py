"""Lesson 06's operator profile of a lone stream (issue 41): the categories, the split of the
wall time (nothing counted twice, the rest is Python), the scenario's rows and their report."""

from __future__ import annotations

import pytest
import torch

from codex_lab.measure.token_profile import CATEGORIES, bench_token_profile, category, op_split
from conftest import seeded_model


@pytest.mark.parametrize("name, cat", [
    ("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::bmm", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"), ("aten::_softmax", "attention"),
    ("aten::index_select", "attention"), ("aten::index", "attention"), ("aten::index_put_", "other ops"),
    ("aten::argmax", "sampling"), ("aten::topk", "sampling"),
    ("Torch-Compiled Region: 0/0", "compiled graph"), ("TorchDynamo Cache Lookup", "python"),
    ("aten::mul", "other ops"), ("aten::copy_", "other ops"), ("aten::rsqrt", "other ops"),
    # a compiled graph's own C++ kernels, named under Inductor's kernel profiling, and its ATen calls
    ("graph_1_gemm_m1n4096k256_cpp_fused__unsafe_view_add_mean_mm_mul_pow_rsqrt_slice_view_17", "matmul"),
    ("graph_3_cpp_fused__scaled_dot_product_flash_attention_for_cpu_3", "attention"),
    ("graph_0_cpp_fused__unsafe_view_argmax_select_18", "sampling"),
    ("graph_0_cpp_fused_add_mean_mul_pow_rsqrt_2", "other ops"),
    ("aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aoti_torch_cpu_addmm_out", "matmul"), ("## Call CompiledFxGraph None ##", "compiled graph"),
])
def test_operators_fall_in_their_category(name: str, cat: str) -> None:
    assert category(name) == cat


def test_the_split_adds_up_to_the_profiled_wall_time() -> None:
    """Self times exclude children, so matmul inside linear is counted once; python is the rest."""
    w = torch.randn(64, 64)
    x = torch.randn(1, 64)

    def run() -> int:
        for _ in range(8):
            torch.nn.functional.linear(x, w).softmax(-1).argmax(-1)
        return 8

    split = op_split(run, 8)
    ms = split["ms_per_token"]
    assert set(ms) == {*CATEGORIES, "python"}
    assert ms["matmul"] > 0 and ms["sampling"] > 0 and ms["attention"] > 0  # mm, argmax, softmax
    # the categories and python partition the wall time (python is clamped at 0, never negative)
    assert sum(ms.values()) == pytest.approx(split["profiled_ms_per_token"], rel=1e-6)
    with pytest.raises(RuntimeError, match="made 8 tokens, expected 9"):
        op_split(run, 9)


def test_the_scenario_profiles_each_path_on_the_same_tokens(small_tokenizer) -> None:
    rows = bench_token_profile(seeded_model(small_tokenizer), small_tokenizer, new_tokens=6, prompt_len=16, slots=3,
                               compile=False, rounds=1)
    assert [r["impl"] for r in rows] == ["fast_decode_eager", "fast_decode", "engine_solo"]
    for r in rows:
        assert r["same_tokens"] and r["unprofiled_ms_per_token"] > 0 and r["new_tokens"] == 6
        assert r["ms_per_token"]["matmul"] > 0 and r["top_ops"]


def test_the_profile_record_prints_its_table_or_says_how_to_measure_it() -> None:
    from codex_lab.lessons.l06_inference.report import token_profile_lines

    assert "not recorded" in token_profile_lines({}) and "--scenarios token_profile" in token_profile_lines({})
    ms = {"matmul": 1.0, "attention": 0.5, "sampling": 0.0, "compiled graph": 0.0, "other ops": 0.25, "python": 0.25}
    rec = {"measured": "2026-01-01", "command": "codex-lab bench inference --scenarios token_profile --json",
           "conditions": "quiet", "rows": [{"impl": "fast_decode", "new_tokens": 64, "prompt_len": 128,
                                             "unprofiled_ms_per_token": 1.5, "profiled_ms_per_token": 2.0,
                                             "ms_per_token": ms}]}
    text = token_profile_lines({"token_profile": rec})
    assert "recorded 2026-01-01, not this run" in text
    assert "| FastDecoder, compiled | 1.50 | 2.00 | 1.00 (50%) | 0.50 (25%) | 0.00 (0%) | 0.00 (0%) | 0.25 (12%) | 0.25 (12%) |" in text


def test_kernel_profiling_opens_the_compiled_graph() -> None:
    """With ``cpp.enable_kernel_profile`` a compiled graph's C++ kernels are profiler events of their
    own, so their time leaves the opaque ``compiled graph`` category for what they compute."""
    x = torch.randn(64, 4096)  # element-wise work large enough for its kernel to lead the top operators
    fn = torch.compile(lambda a: (a.sin() * a.cos()).argmax(-1), options={"cpp.enable_kernel_profile": True})
    fn(x)  # compiles

    def run() -> int:
        for _ in range(8):
            fn(x)
        return 8

    split = op_split(run, 8)
    kernels = [name for name, _ in split["top_ops"] if name.startswith("graph_")]
    assert kernels, f"no kernel of the graph was profiled: {split['top_ops']}"
    assert split["ms_per_token"]["sampling"] > 0  # the fused sin-cos-argmax kernel, by its name
