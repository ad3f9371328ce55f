"""Both engines under Linux perf (codex_lab.measure.native_profile)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from codex_lab.measure import native_profile as npf


# (binary, function) pairs as perf named them in a run of each engine (llama-bench built by
# scripts/build_llama_cpp.sh; FastDecoder compiled by Inductor, whose graphs load as c<hash>.so)
@pytest.mark.parametrize("dso,sym,cat", [
    ("llama-bench", "ggml_vec_dot_f32", "matmul"),
    ("llama-bench", "ggml_compute_forward_mul_mat", "matmul"),
    ("llama-bench", "ggml_compute_forward_flash_attn_ext_f16", "attention"),
    ("llama-bench", "ggml_compute_forward_soft_max_f32", "attention"),
    ("llama-bench", "ggml_compute_forward_rms_norm_f32", "other ops"),
    ("llama-bench", "ggml_compute_forward_rope_f32", "other ops"),
    ("llama-bench", "ggml_graph_compute_thread", "runtime"),
    ("libm.so.6", "__expf_fma", "other ops"),
    ("llama-bench", "ggml_backend_sched_graph_compute_async", "runtime"),
    ("cm6rpz7y3irjj4ns3nr3fo3b5wecgk.so", "cpp_fused__unsafe_view_mm_mul_silu_view_8_micro_gemm<true, false>", "matmul"),
    ("cm6rpz7y3irjj4ns3nr3fo3b5wecgk.so", "cpp_fused_add_index_put_3", "other ops"),
    ("libtorch_cpu.so", "mkl_blas_def_xsgemv", "matmul"),
    ("libtorch_cpu.so", "at::native::(anonymous namespace)::cpu_flash_attention<float, float, 32l, 512l, false>", "attention"),
    ("libtorch_cpu.so", "at::native::argmax_kernel_impl", "sampling"),
    ("libtorch_cpu.so", "aoti_torch_get_data_ptr", "runtime"),
    ("libtorch_python.so", "torch::dynamo::(anonymous namespace)::GuardManager::check_nopybind", "runtime"),
    ("libc.so.6", "_int_malloc", "runtime"),
    ("libc.so.6", "__memmove_avx_unaligned_erms", "other ops"),
    ("libpython3.11.so.1.0", "_PyEval_EvalFrameDefault", "python"),
    ("python3.11", "main", "python"),
    ("[kernel.kallsyms]", "handle_softirqs", "os"),
    ("[unknown]", "0x00007f4b1785ea00", "unresolved"),
    # an ahead-of-time package's library, whose kernels perf cannot name: not "runtime"
    ("cjuhuwgv42bysf2yjmnvbczroejd5kbhwiyjozublotdvj3fuiet.wrapper.so", "[unknown]", "unresolved"),
])
def test_functions_fall_in_their_category(dso: str, sym: str, cat: str) -> None:
    assert npf.native_category(dso, sym) == cat


SCRIPT = """python 
\t         af38c7c mkl_blas_def_xsgemv (/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so)
\t         1d3074f at::native::cpublas::gemm (/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so)
\t         7db3499 at::native::(anonymous namespace)::cpu_flash_attention<float, float, 32l, 512l, false> (/venv/torch/lib/libtorch_cpu.so)
\t          21c0a5 _PyEval_EvalFrameDefault (/usr/lib/libpython3.11.so.1.0)

python 
\t            1234 cpp_fused_mm_0_micro_gemm<false, false> (/tmp/torchinductor_root/ab/cab.main.so)
\t            2345 inductor_entry_impl (/tmp/torchinductor_root/ab/cab.main.so)

llama-bench 
\t           9a0f1 ggml_vec_dot_f16 (/root/.cache/codex_lab/llama.cpp/build/bin/llama-bench)
\t           9b0f2 ggml_compute_forward_flash_attn_ext_f16 (/root/.cache/codex_lab/llama.cpp/build/bin/llama-bench)
\t           9c0f3 ggml_graph_compute_thread (/root/.cache/codex_lab/llama.cpp/build/bin/llama-bench)

llama-bench 
\t           9a0f0 ggml_vec_dot_f32 (/root/.cache/codex_lab/llama.cpp/build/bin/llama-bench)
\t           9d0f4 ggml_compute_forward_mul_mat (/root/.cache/codex_lab/llama.cpp/build/bin/llama-bench)

python 
\tffffffff822424d7 exc_page_fault ([kernel.kallsyms])
\t           7db3499 at::native::(anonymous namespace)::cpu_flash_attention<float, float, 32l, 512l, false> (/venv/torch/lib/libtorch_cpu.so)

python 
\t               0 [unknown] ([unknown])
"""


def test_perf_script_chains_are_parsed_leaf_first() -> None:
    chains = npf.parse_script(SCRIPT)
    assert len(chains) == 6
    assert chains[0][0] == ("libtorch_cpu.so", "mkl_blas_def_xsgemv") and len(chains[0]) == 4
    assert chains[2][1] == ("llama-bench", "ggml_compute_forward_flash_attn_ext_f16")
    assert chains[4][0] == ("[kernel.kallsyms]", "exc_page_fault")


def test_a_sample_inside_an_attention_call_counts_as_attention() -> None:
    cats = [npf.chain_category(c) for c in npf.parse_script(SCRIPT)]
    # MKL's gemv under ATen's flash attention, ggml's f16 dot under its flash attention: attention;
    # the same kinds of kernel outside attention: matmul; the kernel's own code stays os
    assert cats == ["attention", "matmul", "attention", "matmul", "os", "unresolved"]


def test_samples_become_cpu_milliseconds_per_token() -> None:
    # 2999 samples at 2999 Hz are 1 s of CPU time; over 1000 tokens, 1 ms per token
    counts = {("matmul", "llama-bench", "ggml_vec_dot_f32"): 1999, ("runtime", "llama-bench", "ggml_graph_compute_thread"): 1000}
    out = npf.split(counts, freq=2999, tokens=1000)
    assert out["cpu_ms_per_token"] == pytest.approx(1.0)
    assert out["ms_per_token"]["matmul"] == pytest.approx(1999 / 2999)
    assert sum(out["ms_per_token"].values()) == pytest.approx(out["cpu_ms_per_token"])
    assert out["samples"] == 2999 and out["top_functions"][0][0] == "llama-bench: ggml_vec_dot_f32"


def test_the_prefill_run_is_taken_away_function_by_function() -> None:
    decode = {("matmul", "llama-bench", "ggml_vec_dot_f32"): 1500, ("matmul", "llama-bench", "tinyBLAS::gemm"): 300,
              ("other ops", "llama-bench", "ggml_vec_swiglu_f32"): 10}
    prefill = {("matmul", "llama-bench", "ggml_vec_dot_f32"): 100, ("matmul", "llama-bench", "tinyBLAS::gemm"): 300,
               ("other ops", "llama-bench", "ggml_vec_swiglu_f32"): 14}  # noise: more than the decode run had
    out = npf.split(decode, freq=1000, tokens=1, minus=prefill)
    assert out["ms_per_token"]["matmul"] == pytest.approx(1400.0)
    assert out["ms_per_token"]["other ops"] == 0.0  # below zero by noise: shown as 0
    assert out["top_functions"][0][:2] == ["llama-bench: ggml_vec_dot_f32", pytest.approx(1400.0)]


def test_a_real_perf_run_is_read_back() -> None:
    perf = npf.find_perf()
    if perf is None:
        pytest.skip(npf.PERF_HINT)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "t.data"
        rec = subprocess.run([str(perf), *npf._RECORD, "-F", "499", "-o", str(data), "--", sys.executable, "-c",
                              "x = 0\nfor i in range(3_000_000): x += i"], capture_output=True, text=True)
        if rec.returncode != 0:  # e.g. perf_event_paranoid too strict for this user
            pytest.skip(f"perf record cannot run here: {rec.stderr.strip()[-200:]}")
        counts = npf.tally(npf._chains(perf, data))
    out = npf.split(counts, freq=499, tokens=1)
    # a pure-Python loop: most of its CPU time is the interpreter's own functions
    assert out["samples"] > 20
    assert out["ms_per_token"]["python"] > 0.5 * out["cpu_ms_per_token"]


def test_without_perf_or_llama_bench_the_scenario_says_how_to_get_them(monkeypatch) -> None:
    monkeypatch.setattr(npf, "find_perf", lambda: None)
    rows = npf.bench_native_profile(None, None)
    assert rows == [{"scenario": "native_profile", "skipped": npf.PERF_HINT}] and "apt-get install linux-perf" in npf.PERF_HINT
    monkeypatch.setattr(npf, "find_perf", lambda: Path("/usr/bin/perf"))
    monkeypatch.setenv("CODEX_LAB_LLAMA_CPP", "/nonexistent")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CODEX_LAB_LLAMA_BENCH", raising=False)
    monkeypatch.delenv("CODEX_LAB_LLAMA_SERVER", raising=False)
    rows = npf.bench_native_profile(None, None)
    assert "build_llama_cpp.sh" in rows[0]["skipped"]


def test_the_native_record_prints_both_engines_or_says_how_to_measure_it() -> None:
    from codex_lab.lessons.l06_inference.report import native_profile_lines

    assert "not recorded" in native_profile_lines({}) and "--scenarios native_profile" in native_profile_lines({})
    ms = dict.fromkeys(npf.CATEGORIES, 0.0) | {"matmul": 0.5, "python": 0.25}
    row = {"impl": "codex_lab_fast_decode", "reps": 10, "new_tokens": 128, "prompt_len": 128, "freq_hz": 4999,
           "ms_per_token": ms, "cpu_ms_per_token": 0.75, "wall_ms_per_token": 0.8, "wall_ms_min": 0.7,
           "wall_ms_max": 0.9, "top_functions": [["c1.so: cpp_fused_mm_0_micro_gemm", 0.5, "matmul"]]}
    rec = {"measured": "2026-01-01", "command": "codex-lab bench inference --scenarios native_profile --json",
           "conditions": "quiet", "rows": [row]}
    text = native_profile_lines({"native_profile": rec})
    assert "recorded 2026-01-01, not this run" in text
    assert "| codex-lab FastDecoder (compiled) | 0.800 (0.700-0.900) | 0.750 | 0.500 | 0.000" in text
    assert "`cpp_fused_mm_0_micro_gemm` 0.500 (matmul)" in text
    assert "unresolved: code perf cannot name" not in text  # a torch.compile record: its kernels have names
    aot = {**rec, "rows": [{**row, "step": "ahead of time"}]}
    text = native_profile_lines({"native_profile": aot})
    assert "| codex-lab FastDecoder (compiled ahead of time) |" in text
    assert "unresolved: code perf cannot name; for FastDecoder, the ahead-of-time package's library" in text
