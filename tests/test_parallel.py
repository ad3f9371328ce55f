"""codex_lab.parallel: the units of an experiment run in worker processes give the same numbers
as the plain loop in this process (the reference path), in the order given; errors name the
unit; the worker count follows CODEX_LAB_JOBS and the cores, not the mode."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from codex_lab.parallel import cpu_seconds, run_units, unit_workers
from codex_lab.runtime import use_compute_threads


def _spin(seconds: float, tag: str) -> tuple[str, float]:
    """Burn ``seconds`` of CPU; return the tag and the CPU time this process spent."""
    t0 = time.process_time()
    x = 0
    while time.process_time() - t0 < seconds:
        x += 1
    return tag, time.process_time() - t0


def _fail_on(n: int) -> int:
    if n == 2:
        raise ValueError("unit two is broken")
    return n * n


def test_results_come_back_in_the_order_given_with_keywords_and_common_arguments():
    out = run_units(_spin, [dict(tag="a"), dict(tag="b"), dict(tag="c")], common=dict(seconds=0.01), jobs=2)
    assert [t for t, _ in out] == ["a", "b", "c"]
    both = run_units(_fail_on, [(1,), (3,)], jobs=2)
    assert both == [1, 9]


def test_each_result_is_handed_over_as_its_unit_finishes():
    """on_done(i, result) runs in this process as each unit ends, in the order they end: a long
    unit given first does not hold back the short ones after it (a reference run stores each at
    once), and the returned list keeps the order given. The plain path calls it too."""
    seen: list[tuple[int, str]] = []
    out = run_units(_spin, [dict(tag="long", seconds=1.5), dict(tag="short1", seconds=0.01),
                            dict(tag="short2", seconds=0.01)], jobs=2,
                    on_done=lambda i, r: seen.append((i, r[0])))
    assert [t for t, _ in out] == ["long", "short1", "short2"]
    assert sorted(seen) == [(0, "long"), (1, "short1"), (2, "short2")] and seen[-1] == (0, "long")
    plain: list[int] = []
    assert run_units(_fail_on, [(1,), (3,)], jobs=1, on_done=lambda i, r: plain.append(r)) == [1, 9] == plain


def test_a_failing_unit_is_named_and_its_error_kept():
    with pytest.raises(RuntimeError, match=r"seed 2 of _fail_on failed in a worker process: ValueError: unit two is broken"):
        run_units(_fail_on, [(1,), (2,), (3,)], jobs=2, names=["seed 1", "seed 2", "seed 3"])
    with pytest.raises(ValueError, match="unit two is broken"):  # the plain path raises the error itself
        run_units(_fail_on, [(2,)], jobs=1)


def test_a_function_workers_cannot_import_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="module-level function, or set CODEX_LAB_JOBS=1"):
        run_units(lambda n: n, [(1,), (2,)], jobs=2)
    with pytest.raises(ValueError, match="one per unit"):
        run_units(_fail_on, [(1,), (3,)], jobs=2, names=["only one"])


def test_worker_count_follows_the_environment_and_the_cores(monkeypatch):
    monkeypatch.delenv("CODEX_LAB_JOBS", raising=False)
    monkeypatch.delenv("CODEX_LAB_THREADS", raising=False)
    assert unit_workers(1) == 1
    cores = len(__import__("os").sched_getaffinity(0))
    expected = min(8, max(1, cores // (1 if cores <= 2 else cores - 1)))
    assert unit_workers(8) == expected
    assert unit_workers(2) <= 2
    monkeypatch.setenv("CODEX_LAB_MODE", "fast")  # the mode has no say: units carry their own sizes
    assert unit_workers(8) == expected
    monkeypatch.setenv("CODEX_LAB_JOBS", "3")
    assert unit_workers(8) == 3 and unit_workers(2) == 2
    monkeypatch.setenv("CODEX_LAB_JOBS", "two")
    with pytest.raises(ValueError, match="CODEX_LAB_JOBS='two'"):
        unit_workers(4)


def test_cpu_seconds_counts_the_workers_time():
    before_self, before_all = time.process_time(), cpu_seconds()
    out = run_units(_spin, [(0.3, "a"), (0.3, "b")], jobs=2)
    spent_here, spent_all = time.process_time() - before_self, cpu_seconds() - before_all
    burned = sum(s for _, s in out)
    # the workers burned ~0.6 s that this process did not: cpu_seconds sees it (start-up adds more)
    assert spent_all - spent_here >= burned * 0.95, (spent_all, spent_here, burned)


@pytest.fixture(scope="module")
def gqa_inputs():
    import codex_lab as cl
    from codex_lab.lessons.l03_gqa import experiments as gqa
    from codex_lab.lessons.l03_gqa.sizes import protocol_sizes

    sizes = dataclasses.replace(protocol_sizes("fast"), pretrain_steps=12, uptrain_steps=2, eval_every=4,
                                uptrain_eval_every=1, eval_windows=8, max_files=20, warmup=2)
    train, val, vocab = gqa.protocol_data(cl.load_corpus(max_files=sizes.max_files), sizes)
    return gqa, sizes, train, val, vocab


def test_protocol_seeds_in_workers_equal_the_plain_loop(gqa_inputs):
    gqa, sizes, train, val, vocab = gqa_inputs
    units = [(0,), (1,)]
    common = dict(train_tokens=train, val_tokens=val, vocab_size=vocab, sizes=sizes, group_sizes=(1, 4))
    with use_compute_threads():  # the workers' thread count, so the sums are taken in the same order
        plain = run_units(gqa.run_protocol_seed, units, common=common, jobs=1)
    pooled = run_units(gqa.run_protocol_seed, units, common=common, jobs=2)
    for a, b in zip(plain, pooled):
        assert a.seed == b.seed
        assert a.base == b.base and a.scratch == b.scratch and a.uptrain == b.uptrain and a.converted == b.converted
    assert plain[0].base != plain[1].base  # the seeds differ: the comparison above is not of two copies


def test_moe_arms_in_workers_equal_the_plain_loop():
    from codex_lab.lessons.l04_moe.protocol import arm_configs, train_arms

    torch.manual_seed(0)
    toks = torch.randint(0, 64, (4000,))
    configs = arm_configs(64, d_model=16, n_layer=1, n_head=2, n_experts=4, top_k=2, expert_hidden=16, max_seq_len=16)
    arms = list(configs)[:2]
    kw = dict(steps=6, batch_size=4, seq_len=16, lr=3e-3, min_lr=3e-4, eval_every=3, eval_batches=1)
    seen: list[tuple[str, int]] = []
    with use_compute_threads():
        plain = train_arms(configs, arms, (0, 1), toks[:3000], toks[3000:], **kw)
    import os

    os.environ["CODEX_LAB_JOBS"] = "2"
    try:
        pooled = train_arms(configs, arms, (0, 1), toks[:3000], toks[3000:], on_run=lambda a, s, r: seen.append((a, s)),
                            **kw)
    finally:
        del os.environ["CODEX_LAB_JOBS"]
    assert seen == [(a, s) for s in (0, 1) for a in arms]  # on_run in seed-major order, as the loop
    for a in arms:
        assert [r.curve for r in plain[a]] == [r.curve for r in pooled[a]]
        assert [r.val_loss for r in plain[a]] == [r.val_loss for r in pooled[a]]


def _sleep_and_report(folder: str, tag: str) -> None:
    """A unit that writes its pid, then sleeps past any test (killed with its parent, or never ends)."""
    import os
    from pathlib import Path

    (Path(folder) / f"{tag}.pid").write_text(str(os.getpid()))
    time.sleep(600)


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_workers_end_when_the_process_that_started_them_is_killed(tmp_path):
    """A run stopped by its pid (SIGKILL: no handler runs) must not leave its workers training on,
    writing checkpoints a resumed run reads: each worker gets SIGTERM when its parent dies.
    Without the signal armed, the two sleeping workers below live on for 600 s."""
    import os
    import signal
    import subprocess
    import sys

    script = ("import sys; sys.path[:0] = [%r, %r]\n"
              "from codex_lab.parallel import run_units\n"
              "from test_parallel import _sleep_and_report\n"
              "run_units(_sleep_and_report, [(%r, 'a'), (%r, 'b')], jobs=2)\n"
              % (os.path.dirname(__file__), os.path.dirname(os.path.dirname(__file__)), str(tmp_path), str(tmp_path)))
    parent = subprocess.Popen([sys.executable, "-c", script])
    pids: list[int] = []
    deadline = time.monotonic() + 300  # a hang guard: spawning two workers that import torch, on a busy machine
    while time.monotonic() < deadline and len(pids) < 2:
        pids = [int(p.read_text()) for p in tmp_path.glob("*.pid") if p.read_text()]
        time.sleep(0.2)
    try:
        assert len(pids) == 2, "the workers never started"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=60)

        def alive(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            return not open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z")  # a zombie has ended

        deadline = time.monotonic() + 60  # SIGTERM arrives at once; the wait is a hang guard
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.2)
        assert not any(alive(p) for p in pids), "a worker outlived the process that started it"
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


class _Counter:
    """A picklable object with state, for :class:`Remote`."""

    def __init__(self, start: int) -> None:
        if start < 0:
            raise ValueError("start must be >= 0")
        self.n = start

    def add(self, k: int) -> int:
        if k == 13:
            raise KeyError("thirteen")
        self.n += k
        return self.n


def test_a_remote_object_keeps_its_state_and_reports_errors_by_name():
    from codex_lab.parallel import Remote, call_all

    with Remote(_Counter, 5) as a, Remote(_Counter, 100) as b:
        local = _Counter(1000)
        # remotes are started first, then the local call, then the remotes received: order kept
        assert call_all([a.method("add"), local.add, b.method("add")], 2) == [7, 1002, 102]
        assert a.call("add", 1) == 8  # the state stays in the process between calls
        with pytest.raises(RuntimeError, match="_Counter failed in its process: KeyError: 'thirteen'"):
            call_all([a.method("add"), b.method("add")], 13)
        assert b.call("add", 0) == 102  # both answers were received: nothing left in flight
        with pytest.raises(RuntimeError, match="receive"):
            a.send("add", 1)
            a.send("add", 1)
        assert a.receive() == 9
        with pytest.raises(RuntimeError, match="nothing was sent"):
            a.receive()
    with pytest.raises(RuntimeError, match="ValueError: start must be >= 0"):
        Remote(_Counter, -1)


def test_an_arm_with_its_seeds_in_processes_equals_the_arm_in_place(tmp_path):
    """Lesson 02's reference arm with each seed's session in its own process (the seeds side by
    side) gives the numbers of the sessions in this process, stopping point and extension included."""
    from codex_lab.lessons.l02_sparse_attention.geometry import arms_for, fast_config
    from codex_lab.lessons.l02_sparse_attention.plateau import StopPlan, pattern_unit

    cfg = dataclasses.replace(fast_config(), warmup=4, eval_every=4, eval_sequences=8, batch=4, seeds=(10, 11, 12))
    patterns = arms_for("fast", cfg.n_layer, cfg)["window+stride"]
    stop = StopPlan(chunk=4, min_steps=4, max_steps=8)
    here = pattern_unit("window+stride", patterns, cfg=cfg, stop=stop, checkpoints=tmp_path / "a")
    apart = pattern_unit("window+stride", patterns, cfg=cfg, stop=stop, checkpoints=tmp_path / "b", seed_processes=True)
    assert [r.curve for r in apart.runs] == [r.curve for r in here.runs]
    assert [r.accuracy for r in apart.runs] == [r.accuracy for r in here.runs]
    assert (apart.steps, apart.reached, apart.state.state) == (here.steps, here.reached, here.state.state)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == sorted(p.name for p in (tmp_path / "a").iterdir())


def test_a_design_arm_with_its_seeds_in_processes_equals_the_arm_in_place(tmp_path, small_corpus):
    """Lesson 08's design unit (a language-model arm driven by ``lm_to_plateau``) with each seed's
    session in its own process gives the curves, stopping point, held-out losses and weights of
    the sessions in this process, and the converted models' step-0 losses too."""
    from codex_lab.lessons.l08_capstone import trade as t8

    s = dataclasses.replace(t8.TRADE_SIZES["fast"], seeds=(10, 11), confirm=True)
    train, val, tok = t8.trade_data(small_corpus, s)
    pre = t8.pretrain_unit(s, train, val, tok.vocab_size)
    here = t8.design_unit("gqa4", pre, s, train, val, tok.vocab_size, checkpoints=tmp_path / "a")
    apart = t8.design_unit("gqa4", pre, s, train, val, tok.vocab_size, checkpoints=tmp_path / "b", seed_processes=True)
    assert apart.curves == here.curves and apart.final == here.final and apart.converted == here.converted
    assert (apart.steps, apart.reached, apart.state.state) == (here.steps, here.reached, here.state.state)
    assert apart.weights.keys() == here.weights.keys()
    assert all(torch.equal(apart.weights[k], here.weights[k]) for k in here.weights)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == sorted(p.name for p in (tmp_path / "a").iterdir())
