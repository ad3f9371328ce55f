"""scripts/estimate_full_cpu.py: the full-mode plans it extrapolates are the lessons' own (no
timing is asserted: the figures live in codex_lab/assets/timings.json with their provenance)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from codex_lab.lessons.l02_sparse_attention.geometry import arms_for, config_for
from codex_lab.lessons.l08_capstone import trade as l08
from codex_lab.runtime import recorded_timings

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "estimate_full_cpu.py"


@pytest.fixture(scope="module")
def est():
    spec = importlib.util.spec_from_file_location("estimate_full_cpu", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_plans_are_the_full_modes_of_the_lessons(est):
    plans = est.plans()
    assert sorted(plans) == ["02", "03", "04", "05", "08"]
    c2 = config_for("full")
    assert plans["02"]["steps"] == len(arms_for("full")) * len(c2.seeds) * c2.steps
    assert plans["02"]["batch"] == (c2.batch, 1024) and plans["02"]["config"].n_layer == c2.n_layer == 4
    s8 = l08.trade_sizes("full")
    assert plans["08"]["steps"] == len(s8.seeds) * (s8.pretrain_steps + len(l08.KINDS) * s8.max_steps)
    assert all(p["steps"] > 0 and p["plan"] for p in plans.values())
    # the 04 plan times the MoE arm: its config has experts
    assert plans["04"]["config"].n_experts > 1 and plans["04"]["config"].moe_layers


def test_a_step_is_timed_on_a_tiny_model(est):
    from codex_lab.nn.config import ModelConfig

    assert est.seconds_per_step(ModelConfig(vocab_size=64, d_model=16, n_layer=1, n_head=2, max_seq_len=16),
                                (2, 8), steps=1) > 0


def test_the_shipped_full_cpu_figures_are_the_extrapolated_ones():
    t = recorded_timings()
    full = t["report"]["full/cpu"]
    assert "scripts/estimate_full_cpu.py" in t["provenance"]["report full/cpu"]
    # 1024-token sections train for days on 2 cores: no section of full mode is recorded as minutes
    assert all(full[k] > 24 * 3600 for k in ("02", "03", "05")), full
