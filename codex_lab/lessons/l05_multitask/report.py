"""Report section for lesson 05: code tasks from the corpus, valid-token shares, and the
article's claim tested on codebench 2 per split: single-task specialists vs naive vs balanced
(CoBa) multi-task training at equal compute, every arm's training state from its held-out
curves, pass@1 per family with intervals over seeds and problems, the near-duplicate audit
beside every score, and the shipped model's own codebench 2 scores."""

from __future__ import annotations

import statistics
from typing import Any

TITLE = "05 Multi-task fine-tuning with balanced losses"
ORDER = 5

TASK3 = ("completion", "bugfix", "testgen")


def _tasks_table(ctx: Any, tok: Any) -> list[str]:
    from codex_lab.data.tasks import TASKS, build_tasks, encode_tasks, task_files

    fast = ctx.fast
    taskset = build_tasks(task_files(ctx.corpus(), 0.05 if fast else 0.5), TASKS, max_chars=600 if fast else 1200)
    max_len = 192 if fast else 384
    enc = encode_tasks(tok, taskset.split("train"), TASK3, max_len)
    n_s = {t: len(v) for t, v in enc.items()}
    n_v = {t: sum(len(e.answer_ids) for e in v) for t, v in enc.items()}
    lines = ["### Tasks built from the corpus", "", "| task | train | val | share of samples | share of valid tokens |",
             "|---|---|---|---|---|"]
    for t, s in taskset.sizes().items():
        share = f"{n_s[t] / sum(n_s.values()):.1%} | {n_v[t] / sum(n_v.values()):.1%}" if t in n_s else "- | -"
        lines.append(f"| {t} | {s['train']} | {s['val']} | {share} |")
    lines += ["", "`translate` here is the corpus's proxy (snake_case -> camelCase style transfer; the corpus is one "
              "language): it is retired from the experiment, which uses codebench 2's real Python -> JavaScript "
              "translation, run under Node. "
              "Testgen answers are doctests kept only if they pass in the sandbox. Shares are over the "
              f"three tasks shown, examples of <= {max_len} tokens.", ""]
    ctx.claim("Weight the mix by effective (valid) tokens per task, not by samples",
              "sample vs valid-token shares: " + ", ".join(
                  f"{t} {n_s[t] / sum(n_s.values()):.0%} / {n_v[t] / sum(n_v.values()):.0%}" for t in TASK3)
              + " (lesson 05 builds the valid-token loss and MFTCoder's per-task mean and holds them equal to the package)",
              weighting_verdict({t: n_s[t] for t in TASK3}, {t: n_v[t] for t in TASK3}), lesson="05")
    return lines


def run(ctx: Any) -> str:
    from codex_lab.evals import codebench2 as cb2
    from codex_lab.lessons.l05_multitask import experiments as ex
    from codex_lab.training_state import states_text

    ck = ctx.checkpoint()
    tok = ck.tokenizer
    lines = _tasks_table(ctx, tok)
    splits = ex.protocol_splits(ctx.mode)
    not_run = [s for s in ("iid", "length", "compose") if s not in splits]
    lines += ["### The claim on codebench 2: single-task vs naive vs CoBa at equal compute, verdicts only on plateaued arms", "",
              "codebench 2 holds out program *structure* (docs/CODEBENCH2.md): `iid` (new programs of the training "
              "distribution), `length` (train on 1-2 operations, test on 3-4), `compose` (pairs of operations never "
              "adjacent in training). Each split is trained and tested on its own parts. "
              f"Splits run in {ctx.mode} mode: {', '.join(splits)}"
              + (f"; not run in this mode: {', '.join(not_run)} (full mode runs them; "
                 "`CODEX_LAB_MODE=full codex-lab report --sections 05`)." if not_run else "."), ""]
    primary_claim = None
    for split in splits:
        setup = ex.protocol_setup(ctx.mode, split)
        res = ex.run_experiment(setup)
        states = res.states()
        prim = res.primary_comparison()
        sec = res.secondary()
        lines += [f"#### Split `{split}`", "",
                  f"Geometry ({ctx.mode} mode, "
                  + ("CI sizes, far too short to plateau on purpose: the training-state rule must withhold the verdicts"
                     if ctx.mode == "fast" else "the model, vocabulary and sequences shrunk, not the steps; whether each arm "
                     "reached its plateau is measured below") + f"): "
                  f"{setup.describe()}. The {len(setup.families)} specialists share one arm's budget. A seed draws "
                  "the initialisation, the data order and the test problems. "
                  f"Primary balanced arm (lowest mean final validation loss, never chosen on test): {res.primary}. "
                  f"CPU time of this split: {res.cpu_s:.0f} s.", "",
                  "pass@1 (greedy), mean over seeds [95% two-level bootstrap over seeds and problems]:", "",
                  "```", res.table(), res.audit_line(), "```", "",
                  "Training states (held-out mean validation loss over families, nats/token; the rule of "
                  f"`codex_lab.training_state`, min_change {setup.min_change} nats/token):", "", "```",
                  *[s.describe() for s in states.values()], "```", "",
                  "Verdicts (paired by seed, Welch 95% interval, judged on the arms' training states; the secondary "
                  "comparisons Holm-corrected together):", "", "```", "primary: " + prim.describe(),
                  *["secondary: " + c.describe() for c in sec], "```", ""]
        if split == "iid" or primary_claim is None:
            primary_claim = (split, res, prim, states)
    split, res, prim, states = primary_claim
    arms = [states["single-task"], states[res.primary]]
    he = _humaneval_pass_at_1(ctx)
    ctx.claim("Balanced multi-task models score ~8-15% higher than single-task models (HumanEval-style benchmark)",
              f"codebench 2 `{split}` split, pass@1 over all five families, {res.primary} vs single-task specialists "
              f"(equal compute, {len(res.setup.seeds)} seeds, {res.setup.per_family} test problems per family and "
              f"seed): {prim.diff:+.3f} [{prim.lo:+.3f}, {prim.hi:+.3f}] (verdict from the {split} split); "
              f"HumanEval itself: the shipped model scores pass@1 = {he['pass_at_1']:.3f} on {he['problems']} "
              "problems (greedy)", prim.verdict, lesson="05", states=states_text(arms))
    cn = res.comparison("naive", res.primary, "all")
    ctx.claim("Equal-weight summed losses let the big task dominate; balancing rescues the small tasks",
              f"codebench 2 `{split}` split, pass@1 over all families, {res.primary} vs naive pooled loss: "
              f"{cn.diff:+.3f} [{cn.lo:+.3f}, {cn.hi:+.3f}] (verdict from the {split} split)",
              cn.verdict, lesson="05", states=states_text([states["naive"], states[res.primary]]))
    lines += reference_lines(ctx.mode)
    lines += _shipped_lines(ctx, ck)
    lines += [f"HumanEval with the shipped model (greedy, {he['problems']} of 164 problems, the course's engine "
              f"and sandbox; `codex-lab eval humaneval` runs all of them): pass@1 = {he['pass_at_1']:.3f} "
              f"({he['passed']} passed)."]
    return "\n".join(lines)


def reference_lines(mode: str) -> list[str]:
    """The shipped reference runs at the converging sizes (scripts/reference_l05.py), one per
    codebench 2 split that has one (iid, length, compose), beside this run's figures and labelled
    as such: a per-split summary of the primary verdicts, then each run's provenance, every arm's
    training state and its verdicts. Nothing when none is shipped or in full mode (which runs
    larger sizes itself, every split)."""
    from codex_lab.reference import describe_provenance, load_reference

    refs = {sp: r for sp in ("iid", "length", "compose") if (r := load_reference(f"l05_converge_{sp}")) is not None}
    if not refs or mode == "full":
        return []
    out = ["### Reference runs at the converging sizes, per split (shipped, not this run)", "",
           "The same protocol and statistics as above, trained longer, on each codebench 2 split: does multi-task "
           "training help in distribution (iid), on longer programs (length: train on 1-2 operations, test on 3-4), "
           "on unseen combinations (compose)?", "",
           "| split | primary comparison | naive vs balanced | arms trained |", "|---|---|---|---|"]
    for sp, ref in refs.items():
        d = ref["data"]
        pr = d["primary"]
        trained = sum(bool(t) for t in d.get("trained", {}).values())
        out.append(f"| {sp} | {d['primary_arm']} minus single-task {pr['diff']:+.3f} [{pr['lo']:+.3f}, {pr['hi']:+.3f}]: "
                   f"{pr['verdict']} | {d['naive_vs_primary'].split(' -> ')[-1].split(' (')[0]} | "
                   f"{trained} of {len(d.get('trained', {}))} |")
    out.append("")
    for sp, ref in refs.items():
        d = ref["data"]
        command = "python scripts/reference_l05.py" + ("" if sp == "iid" else f" --split {sp}")
        out += [f"#### Split `{sp}`", "",
                f"{describe_provenance(ref)}. Geometry: {d['setup']}. Rerun it with `{command}` (resumable, about "
                "20 min on 2 cores).", "",
                "```", d["table"], d["audit"], *d["states"].values(), "primary: " + d["primary"]["describe"],
                "secondary: " + d["naive_vs_primary"], "```", ""]
    return out


# The shipped model fine-tuned on codebench 2 iid (issue 39, item 7): a recorded run (too slow
# for the report: ~1.9 CPU s per step), the configuration of scripts/l05_calibrate_shipped.py
# (every family pooled, token loss, mix=size, max_len 320, greedy answers of <= 160 tokens,
# 48 iid test problems per family drawn with seed 0); intervals: 95% bootstrap over problems.
SHIPPED_TUNED: dict[str, Any] | None = {
    "steps": 1000, "batch_size": 16, "lr": 1e-3, "n": 48,
    "when": "2026-12-03, one CPU thread at nice 10 beside other work (1727 CPU s in all)",
    "command": "python scripts/l05_calibrate_shipped.py --steps 1000 --n 48",
    "families": {"completion": {"tuned": 17 / 48, "lo": 0.229, "hi": 0.479},
                 "bugfix": {"tuned": 21 / 48, "lo": 0.312, "hi": 0.583},
                 "testgen": {"tuned": 2 / 48, "lo": 0.0, "hi": 0.104},
                 "translate": {"tuned": 20 / 48, "lo": 0.271, "hi": 0.562},
                 "fim": {"tuned": 28 / 48, "lo": 0.438, "hi": 0.708}},
}


def _shipped_lines(ctx: Any, ck: Any) -> list[str]:
    """The shipped model's untuned pass@1 on codebench 2 iid (measured here) and, when
    recorded, its fine-tuned figure with the run's provenance."""
    from codex_lab.evals import codebench2 as cb2
    from codex_lab.lessons.l05_multitask.experiments import score_model

    n = 4 if ctx.fast and ctx.mode == "fast" else 16
    problems = cb2.load_problems("iid", "all", n=n, seed=0)
    sc = score_model(ck.model, ck.tokenizer, problems, 96)
    lines = ["### The shipped model on codebench 2", "",
             f"Untuned (greedy, {n} iid test problems per family, docstrings with examples): "
             + ", ".join(f"{f} {statistics.fmean(v):.3f}" for f, v in sc.items())
             + ". " + cb2.split_audit("iid", problems).line() + "."]
    if SHIPPED_TUNED:
        t = SHIPPED_TUNED
        lines.append(f"Fine-tuned ({t['steps']} steps of {t['batch_size']}, lr {t['lr']}, every family pooled; "
                     f"recorded run, {t['when']}, `{t['command']}`, {t['n']} problems per family): "
                     + ", ".join(f"{f} {v['tuned']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}]" for f, v in t["families"].items())
                     + f"; in the 20-80% band: {sum(0.2 <= v['tuned'] <= 0.8 for v in t['families'].values())} of "
                     f"{len(t['families'])} families (issue 39 asks for >= 3). The run keeps no held-out curve, so its "
                     "training state is not known: this places the benchmark's range for the shipped model, it is not "
                     "a quality verdict (300 steps had given 0.04-0.21).")
    else:
        lines.append("Fine-tuned: not measured in this report (it takes ~20 CPU minutes): "
                     "`nice -n 10 python scripts/l05_calibrate_shipped.py --steps 600 --n 48`.")
    return lines + [""]


def _humaneval_pass_at_1(ctx: Any) -> dict[str, Any]:
    """Greedy pass@1 of the shipped model on HumanEval (fast mode: the first 16 problems)."""
    from codex_lab.evals import humaneval

    ck = ctx.checkpoint()
    problems = humaneval.load_problems(limit=16 if ctx.fast else None)
    completions, _ = humaneval.complete(ck.model.eval(), ck.tokenizer, problems, max_new_tokens=128 if ctx.fast else 384)
    results = humaneval.execute(problems, completions, workers=4)
    passed = sum(r.passed for rs in results for r in rs)
    return {"problems": len(problems), "passed": passed, "pass_at_1": humaneval.score(results, ks=(1,))[1]}


def weighting_verdict(samples: dict[str, int], valid_tokens: dict[str, int]) -> str:
    """"Weight the mix by effective (valid) tokens, not by samples": the advice matters when the two
    weightings differ; holds when some task's share of samples and of valid tokens differ by more
    than 5 points, fails when they agree (every task's answers about equally long)."""
    ns, nv = sum(samples.values()), sum(valid_tokens.values())
    # share gap = |samples_t / sum samples - valid_t / sum valid|
    gap = max(abs(samples[t] / ns - valid_tokens[t] / nv) for t in samples)
    return "holds" if gap > 0.05 else "fails"
