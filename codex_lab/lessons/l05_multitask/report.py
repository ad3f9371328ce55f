"""Report section for lesson 05: code tasks from the corpus, valid-token shares, and the
article's claim tested on codebench 2 per split: single-task specialists vs naive vs balanced
(CoBa) multi-task training at equal compute, every arm's training state from its held-out
curves, pass@1 per family with intervals over seeds and problems, the near-duplicate audit
beside every score, and the shipped model's own codebench 2 scores."""

from __future__ import annotations

import statistics
from typing import Any

from codex_lab.stats import FAILS, HOLDS

TITLE = "05 Multi-task fine-tuning with balanced losses"
ORDER = 5

TASK3 = ("completion", "bugfix", "testgen")


def _tasks_table(ctx: Any, tok: Any) -> list[str]:
    from codex_lab.data.task_batches import encode_tasks
    from codex_lab.data.tasks import TASKS, build_tasks, task_files

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
    ck = ctx.checkpoint()
    tok = ck.tokenizer
    lines = _tasks_table(ctx, tok)
    lines += plateau_lines(ctx)
    if ctx.mode == "full":
        lines += equal_budget_lines(ctx)
    lines += reference_lines(ctx.mode)
    lines += _shipped_lines(ctx, ck)
    he = _humaneval_pass_at_1(ctx)
    lines += [f"HumanEval with the shipped model (greedy, {he['problems']} of 164 problems, the course's engine "
              f"and sandbox; `codex-lab eval humaneval` runs all of them): pass@1 = {he['pass_at_1']:.3f} "
              f"({he['passed']} passed): a model this size is at the floor there, so the claim is tested on "
              "codebench 2."]
    return "\n".join(lines)


def plateau_lines(ctx: Any) -> list[str]:
    """The claims as the article states them (:mod:`codex_lab.lessons.l05_multitask.pretrained`):
    one pretrained base fine-tuned per arm to its plateau. The live run's sizes follow the mode;
    when the reference run is shipped (``scripts/reference_l05_plateau.py``), its verdicts are the
    claims' verdicts, labelled with their provenance, and the report says whether the live run
    agrees."""
    from codex_lab.lessons.l05_multitask import pretrained as pt
    from codex_lab.lessons.l05_multitask import finetune_setup as fs
    from codex_lab.reference import describe_provenance, load_reference
    from codex_lab.training_state import states_text

    setup = fs.setup_for("fast" if ctx.mode == "fast" else ("full" if ctx.mode == "full" else "standard"))
    mde = pt.detectable_effect(setup)
    out = ["### The claims as stated: one pretrained model, fine-tuned per arm to its plateau", "",
           f"Design ({ctx.mode} mode): {setup.describe()}.", "",
           f"Before the run: the smallest pass@1 difference this design detects (two-sided 5%, 80% power, paired by "
           f"seed, no shared noise assumed: an upper bound) is {mde['absolute']:.3f}, {mde['relative']:.0%} relative at "
           f"pass@1 {mde['p']:g}; the claim is +{fs.STATED[0]:.0%} to +{fs.STATED[1]:.0%}.", ""]
    res = pt.run_protocol(setup)
    size, gain, size_v = res.size_claim()
    small = res.small_claim()
    out += ["Pass@1 per family, per arm (this run):", "", *res.family_table(), "",
            "Each arm's compute to its plateau (steps per seed, examples, CPU), and the budget-extension check:", "",
            "```", *res.compute_lines(), "```", "", "Training states at the stopping points:", "", "```",
            *[s.describe() for s in res.states().values()], "```", "",
            f"- \"+8-15%\": {size.describe()}; relative gain {_pct(gain)} ({pt.size_position(gain)}) -> {size_v}",
            f"- \"the small tasks\": {small.describe()}", ""]
    ref = load_reference(f"l05_plateau_{setup.split}")
    live = {"size": size_v, "small": small.verdict}
    if ref is not None:
        d = ref["data"]
        claim = {"size": d["size"]["verdict"], "small": d["small"]["verdict"]}
        src = "The shipped " + describe_provenance(ref)
        agree = {k: "agrees" if live[k] == claim[k] else f"differs ({live[k]})" for k in claim}
        out += ["#### The shipped reference run (the claims' verdicts)", "", f"{src}. Geometry: {d['setup']}.", "",
                "```", *d["compute"], *d["states"].values(), "```", "", "Pass@1 per family, per arm:", "",
                *reference_results(d).family_table(), "",
                f"- \"+8-15%\": {d['size']['describe']}; relative gain {_pct(d['size']['gain'])} "
                f"({d['size']['position']}) -> **{d['size']['verdict']}**",
                f"- \"the small tasks\": {d['small']['describe']} -> **{d['small']['verdict']}**",
                f"- this {ctx.mode}-mode run: \"+8-15%\" {agree['size']}; \"small tasks\" {agree['small']}", ""]
        size_text = (f"reference run: {d['size']['diff']:+.3f} pass@1 [{d['size']['lo']:+.3f}, {d['size']['hi']:+.3f}], "
                     f"relative {_pct(d['size']['gain'])} ({d['size']['position']}); live {ctx.mode} run {agree['size']}")
        small_text = (f"reference run: {d['small']['diff']:+.3f} [{d['small']['lo']:+.3f}, {d['small']['hi']:+.3f}]; "
                      f"live {ctx.mode} run {agree['small']}")
        rres = reference_results(d)
        states = states_text(rres.states())
        primary, shown = d["primary_arm"], rres.setup  # the claims' verdicts are the reference's: name its arm and sizes
    else:
        primary, shown = res.primary, setup
        claim = live
        size_text = (f"this run: {size.diff:+.3f} pass@1 [{size.lo:+.3f}, {size.hi:+.3f}], relative {_pct(gain)} "
                     f"({pt.size_position(gain)}); no reference run shipped")
        small_text = f"this run: {small.diff:+.3f} [{small.lo:+.3f}, {small.hi:+.3f}]"
        states = states_text(res.states())
    out += plateau_split_lines(setup.split)
    ctx.claim("Balanced multi-task models score ~8-15% higher than single-task models (HumanEval-style benchmark)",
              f"one pretrained base fine-tuned per arm to its plateau, codebench 2 {shown.split}, {primary} vs "
              f"single-task, pass@1 over all families: {size_text}", claim["size"], lesson="05", states=states)
    ctx.claim("Equal-weight summed losses let the big task dominate; balancing rescues the small tasks",
              f"the small families' pass@1 ({', '.join(shown.small)}; {shown.large} {shown.large_n} programs, the others "
              f"{shown.small_n}), {primary} vs naive: {small_text}", claim["small"], lesson="05", states=states)
    return out


def plateau_split_lines(live_split: str) -> list[str]:
    """The shipped plateau references of the other codebench 2 splits (length, compose: does the
    answer hold out of distribution?), one table row each with both claims' verdicts, intervals and
    the arms' states, labelled as shipped runs; nothing when none is shipped."""
    from codex_lab.reference import describe_provenance, load_reference

    refs = {sp: r for sp in ("iid", "length", "compose")
            if sp != live_split and (r := load_reference(f"l05_plateau_{sp}")) is not None}
    if not refs:
        return []
    out = ["#### The same claims on the other splits (shipped reference runs, not this run)", "",
           "| split | \"+8-15%\": primary balanced arm minus single-task, pass@1 (relative) | \"the small tasks\": "
           "balanced minus naive | arms the rule calls trained |", "|---|---|---|---|"]
    for sp, ref in refs.items():
        d = ref["data"]
        sz, sm = d["size"], d["small"]
        trained = sum(v.split(": ", 1)[-1].startswith("trained") for v in d["states"].values())
        out.append(f"| {sp} | {d['primary_arm']}: {sz['diff']:+.3f} [{sz['lo']:+.3f}, {sz['hi']:+.3f}] ({_pct(sz['gain'])}, "
                   f"{sz['position']}): {sz['verdict']} | {sm['diff']:+.3f} [{sm['lo']:+.3f}, {sm['hi']:+.3f}]: "
                   f"{sm['verdict']} | {trained} of {len(d['states'])} |")
    out.append("")
    out += [f"- `{sp}`: {describe_provenance(ref)}" for sp, ref in refs.items()]
    return out + [""]


def reference_results(d: dict[str, Any]) -> Any:
    """The shipped plateau reference's arms as :class:`~codex_lab.lessons.l05_multitask.pretrained.PlateauResults`
    (its states re-judged by today's rule), at the reference sizes it states."""
    from codex_lab.lessons.l05_multitask import pretrained as pt
    from codex_lab.lessons.l05_multitask import finetune_setup as fs

    for mode in ("reference", "reference-corpus"):  # the shipped base's sizes, or the first run's corpus base
        setup = fs.setup_for(mode, d["split"])
        if setup.describe() == d["setup"]:
            return pt.PlateauResults(setup, d["arms"])
    raise ValueError(f"the shipped l05_plateau_{d['split']} reference was run at other sizes ({d['setup']}); "
                     "rerun scripts/reference_l05_plateau.py")


def _pct(gain: dict[str, float]) -> str:
    """A relative gain and its interval in percent: ``+11% [+3%, +19%]`` (``n/a`` when undefined)."""
    import math

    if not all(math.isfinite(gain[k]) for k in ("mean", "lo", "hi")):
        return "n/a"
    return f"{gain['mean']:+.0%} [{gain['lo']:+.0%}, {gain['hi']:+.0%}]"


def equal_budget_lines(ctx: Any) -> list[str]:
    """The secondary, at equal budget: models trained from scratch, every arm the same steps
    (the specialists a fifth each), per split (:mod:`codex_lab.lessons.l05_multitask.experiments`).
    Full mode only; the shipped references of this design follow in :func:`reference_lines`."""
    from codex_lab.lessons.l05_multitask import experiments as ex

    splits = ex.protocol_splits(ctx.mode)
    lines = ["### At equal budget, from scratch (secondary)", "",
             "codebench 2 holds out program *structure* (docs/CODEBENCH2.md): `iid`, `length` (train on 1-2 "
             "operations, test on 3-4), `compose` (pairs of operations never adjacent in training). Every arm gets the "
             "same steps; the specialists share one arm's budget.", ""]
    for split in splits:
        setup = ex.protocol_setup(ctx.mode, split)
        res = ex.run_experiment(setup)
        lines += [f"#### Split `{split}`", "", f"{setup.describe()}. Primary balanced arm: {res.primary}. CPU "
                  f"{res.cpu_s:.0f} s.", "", "```", res.table(), res.audit_line(), *[s.describe() for s in
                  res.states().values()], "primary: " + res.primary_comparison().describe(),
                  *["secondary: " + c.describe() for c in res.secondary()], "```", ""]
    return lines


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
    out = ["### At equal budget, from scratch: reference runs per split (shipped, not this run; secondary)", "",
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


# The shipped model fine-tuned on codebench 2 iid: a recorded run (too slow
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
                     f"{len(t['families'])} families (the course asks for >= 3). The run keeps no held-out curve, so its "
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
    return HOLDS if gap > 0.05 else FAILS
