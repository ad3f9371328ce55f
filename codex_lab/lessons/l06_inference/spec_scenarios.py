"""Speculative decoding with the distilled draft (``codex-lab bench inference --scenarios speculative``).

Prompts of four kinds, cut from held-out corpus files (:func:`typed_prompts`): the model
continues

- ``mid_function``: inside a function body (the prompt ends at a line end in its middle);
- ``docstring``: a function's docstring (the prompt ends just after the opening quotes);
- ``imports``: a module's import block (the prompt ends after its first import line);
- ``fim``: the middle of a function, given the code before and after it (fill-in-the-middle
  prompt in the checkpoint's format; the shipped model is FIM-trained).

:func:`bench_speculative` measures, all with the same greedy tokens asserted:

1. the per-guess acceptance ``alpha`` of each kind (and prompt lookup's on the same prompts);
2. the forwards' costs in alternating rounds: ``c`` = draft step / target step, ``v(gamma)``
   = target forward over gamma + 1 tokens / target step (the eager cached path);
3. gamma chosen where ``expected_speedup(alpha, gamma, c, v)`` is largest;
4. whole generations in interleaved rounds: plain eager decoding, speculative decoding at
   that gamma (eager draft and target), and the compiled :class:`FastDecoder` (plain, batch
   1): speculative decoding here cannot use the compiled decoder (its fixed-shape step
   returns the last position's logits only, and verifying needs all gamma + 1), so it is
   compared to both plain paths; the compiled draft and target steps are timed against each
   other (``c_compiled``) to predict what a compiled speculative loop could reach at best
   (verify as cheap as one step, v = 1).
"""

from __future__ import annotations

import ast
import math
import time
from typing import Any, Callable

import numpy as np
import torch

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.infer.generate import generate_ids_cached
from codex_lab.infer.prompt_lookup import prompt_lookup_generate
from codex_lab.infer.speculative import expected_speedup, expected_tokens_per_round, speculative_generate
from codex_lab.nn.kv_cache import make_static_caches
from codex_lab.nn.model import CodexModel
from codex_lab.runtime import interleaved_times
from codex_lab.stats import timing_ratio

PROMPT_TYPES = ("mid_function", "docstring", "imports", "fim")


def _functions(texts: list[str]) -> list[tuple[str, ast.FunctionDef]]:
    out = []
    for text in texts:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        out += [(text, n) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.end_lineno
                and n.end_lineno - n.lineno >= 6]
    return out


def typed_prompts(tok: CodeTokenizer, n_per_type: int, *, max_prompt: int = 192, seed: int = 0,
                  fim_format: str = "psm", max_files: int = 200) -> dict[str, list[list[int]]]:
    """``n_per_type`` prompts of each of :data:`PROMPT_TYPES` from held-out files (at most
    ``max_prompt`` tokens: the prompt's last tokens; a FIM prompt's prefix and suffix are cut
    to ~3 characters per token each). Deterministic for a ``seed``."""
    from codex_lab.data.corpus import load_corpus
    from codex_lab.data.fim import fim_prompt_ids

    texts = load_corpus(max_files=max_files).texts("val")
    rng = np.random.default_rng(seed)
    funcs = _functions(texts)
    order = rng.permutation(len(funcs)).tolist()
    out: dict[str, list[list[int]]] = {k: [] for k in PROMPT_TYPES}

    def add(kind: str, ids: list[int]) -> None:
        if len(out[kind]) < n_per_type and len(ids) >= 16:
            out[kind].append(ids[-max_prompt:])

    for i in order:
        text, fn = funcs[i]
        lines = text.splitlines(keepends=True)
        body = fn.body[0]
        # mid-function: cut at the end of a line between the body's first statement and the end
        lo, hi = body.lineno + 1, fn.end_lineno - 2  # type: ignore[operator]
        if hi > lo:
            cut = int(rng.integers(lo, hi + 1))
            add("mid_function", tok.encode("".join(lines[:cut])))
        # docstring: the def line(s) and the opening quotes
        if isinstance(body, ast.Expr) and isinstance(getattr(body, "value", None), ast.Constant) \
                and isinstance(body.value.value, str):
            head = "".join(lines[: body.lineno - 1])
            first = lines[body.lineno - 1]
            q = first.find('"""') if '"""' in first else first.find("'''")
            if q >= 0:
                add("docstring", tok.encode(head + first[: q + 3]))
        # FIM: the middle 1-3 lines of the body, the code around it given
        if hi > lo:
            a = int(rng.integers(lo, hi + 1))
            b = min(a + int(rng.integers(1, 4)), fn.end_lineno)  # type: ignore[arg-type]
            prefix, suffix = "".join(lines[:a]), "".join(lines[b:])
            cap = 3 * max_prompt // 2
            ids = fim_prompt_ids(tok, prefix[-cap:], suffix[:cap], fim_format)  # type: ignore[arg-type]
            if len(ids) <= max_prompt and len(out["fim"]) < n_per_type:
                out["fim"].append(ids)
        if all(len(v) >= n_per_type for k, v in out.items() if k != "imports"):
            break
    for j in rng.permutation(len(texts)).tolist():  # imports: the file's head up to its first import line
        lines = texts[j].splitlines(keepends=True)
        first = next((k for k, ln in enumerate(lines) if ln.startswith(("import ", "from "))), None)
        if first is not None and first + 2 < len(lines) and lines[first + 1].startswith(("import ", "from ")):
            add("imports", tok.encode("".join(lines[: first + 1])))
        if len(out["imports"]) >= n_per_type:
            break
    short = {k: len(v) for k, v in out.items() if len(v) < n_per_type}
    if short:
        raise ValueError(f"the held-out files gave too few prompts of kinds {short}; read more files (max_files)")
    return out


def step_costs(target: CodexModel, draft: CodexModel, context: list[int], gammas: tuple[int, ...],
               repeats: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Costs in target decode steps, timed in alternating rounds after ``context``: ``c`` (one
    draft step) and ``v{g}`` (the target over g + 1 tokens) as medians of per-round ratios of
    the process's CPU time (one math thread: equal to wall time on a quiet machine, and not
    inflated by the waits for a core on a shared one, which hit millisecond steps unevenly);
    also the raw per-round wall milliseconds."""
    T0 = len(context)
    ctx = torch.tensor([context])  # (1, T0)
    extra = torch.tensor([context[: max(gammas) + 1]])  # (1, gamma_max + 1) stand-in tokens

    def step_fn(m: CodexModel, n: int) -> Callable[[], object]:
        caches = make_static_caches(m.cfg, 1, T0 + n, rolling=False)
        m(ctx, positions=torch.arange(T0)[None], caches=caches)

        def one() -> object:
            for c in caches:
                c.truncate(T0)  # rewind: every call is the step right after the context
            return m(extra[:, :n], positions=torch.arange(T0, T0 + n)[None], caches=caches, last_only=n == 1)
        return one

    fns = {"target": step_fn(target, 1), "draft": step_fn(draft, 1)}
    fns.update({f"v{g}": step_fn(target, g + 1) for g in gammas})
    for f in fns.values():
        f()  # warm-up
    wall, cpu = interleaved_times(fns, repeats)
    # cost = median over rounds of (this forward's CPU time / the target step's in the same round)
    costs = {("c" if k == "draft" else k): timing_ratio(cpu[k], cpu["target"]).speedup for k in fns if k != "target"}
    return costs, wall


def acceptance(stats: list[Any]) -> float:
    """Pooled per-guess acceptance of several generations' :class:`SpecStats`: accepted / judged."""
    judged = sum(s.accepted + s.rejections for s in stats)
    return sum(s.accepted for s in stats) / judged if judged else 0.0


def bench_speculative(model: CodexModel, tok: CodeTokenizer, draft: CodexModel, *, n_per_type: int = 3,
                      new_tokens: int = 48, probe_gamma: int = 4, gammas: tuple[int, ...] = (1, 2, 3, 4),
                      cost_repeats: int = 30, rounds: int = 5, fast_decoder: bool = True,
                      draft_name: str = "distilled 1-layer draft", fim_format: str = "psm") -> list[dict[str, Any]]:
    """The speculative scenario's records (see the module docstring); every generation's tokens
    are asserted equal to plain greedy decoding's."""
    prompts = typed_prompts(tok, n_per_type, fim_format=fim_format)
    every = [p for k in PROMPT_TYPES for p in prompts[k]]
    plain = {k: [generate_ids_cached(model, p, max_new_tokens=new_tokens)[0] for p in ps] for k, ps in prompts.items()}
    rows: list[dict[str, Any]] = []
    alpha_by: dict[str, float] = {}
    stats_all = []
    for kind, ps in prompts.items():
        res = [speculative_generate(model, draft, p, max_new_tokens=new_tokens, gamma=probe_gamma) for p in ps]
        assert [r[0] for r in res] == plain[kind], f"speculative != target greedy on {kind} prompts"
        look = [prompt_lookup_generate(model, p, max_new_tokens=new_tokens, num_draft=16, min_ngram=2, max_ngram=4) for p in ps]
        assert [r[0] for r in look] == plain[kind], f"prompt lookup != target greedy on {kind} prompts"
        alpha_by[kind] = acceptance([r[2] for r in res])
        stats_all += [r[2] for r in res]
        rows.append({"scenario": "speculative", "impl": "acceptance", "prompt_type": kind, "prompts": len(ps),
                     "gamma": probe_gamma, "draft": draft_name, "acceptance_rate": alpha_by[kind],
                     "tokens_per_round": sum(r[2].emitted for r in res) / max(1, sum(r[2].rounds for r in res)),
                     "lookup_acceptance_rate": acceptance([r[2] for r in look]),
                     "lookup_tokens_per_target_call": sum(map(len, plain[kind])) / sum(r[2].target_calls for r in look),
                     "same_tokens": True})
    alpha = acceptance(stats_all)  # pooled over every prompt
    costs, _ = step_costs(model, draft, every[0], gammas, cost_repeats)
    pred = {g: expected_speedup(alpha, g, costs["c"], costs[f"v{g}"]) for g in gammas}
    gamma = max(pred, key=lambda g: pred[g])
    # whole generations over every prompt, one call of each per round, rounds interleaved
    runs: dict[str, Callable[[], list[list[int]]]] = {
        "plain_eager": lambda: [generate_ids_cached(model, p, max_new_tokens=new_tokens)[0] for p in every],
        f"speculative_g{gamma}": lambda: [speculative_generate(model, draft, p, max_new_tokens=new_tokens, gamma=gamma)[0]
                                          for p in every],
    }
    compile_s, compile_error, c_compiled = math.nan, "", math.nan
    if fast_decoder:
        from codex_lab.infer.fast_decode import FastDecoder

        dec = FastDecoder(model, max_len=max(map(len, every)) + new_tokens)
        t0 = time.perf_counter()
        dec.generate(every[0], 4)
        compile_s, compile_error = time.perf_counter() - t0, dec.compile_error
        runs["plain_fast_decoder"] = lambda: [dec.generate(p, new_tokens)[0] for p in every]
        # the compiled steps' own cost ratio: what a compiled speculative loop could at best reach
        ddec = FastDecoder(draft, max_len=dec.max_len)
        ddec.generate(every[0], 4)
        tok1, pos1 = torch.tensor([[every[0][-1]]]), torch.tensor([len(every[0])])
        _, steps = interleaved_times({"target": lambda: dec.decode_step(tok1, pos1), "draft": lambda: ddec.decode_step(tok1, pos1)},
                                     cost_repeats)
        c_compiled = timing_ratio(steps["draft"], steps["target"]).speedup  # CPU time, as step_costs
    ref = runs["plain_eager"]()
    for name, fn in runs.items():
        assert fn() == ref, f"{name} tokens differ from plain greedy decoding"  # and a warm-up
    wall, cpu = interleaved_times(runs, rounds)
    n_tok = len(every) * new_tokens
    spec = f"speculative_g{gamma}"
    base = {"scenario": "speculative", "prompts": len(every), "new_tokens": new_tokens, "rounds": rounds}
    for name in runs:
        r = {**base, "impl": name, "tokens_per_s": n_tok * 1000.0 / float(np.median(wall[name])),
             "cpu_tokens_per_s": n_tok * 1000.0 / float(np.median(cpu[name])), "same_tokens": True}
        if name == spec:
            vs = timing_ratio(wall["plain_eager"], wall[spec], a="plain eager decoding", b=f"speculative (gamma {gamma})")
            vc = timing_ratio(cpu["plain_eager"], cpu[spec], a="plain eager decoding", b=f"speculative (gamma {gamma})")
            r.update(gamma=gamma, draft=draft_name, acceptance_rate=alpha, c=costs["c"], v=costs[f"v{gamma}"],
                     expected_tokens_per_round=expected_tokens_per_round(alpha, gamma), predicted_speedup=pred[gamma],
                     predicted_by_gamma={str(g): p for g, p in pred.items()}, v_by_gamma={str(g): costs[f"v{g}"] for g in gammas},
                     probe_gamma=probe_gamma, expected_tokens_per_round_probe=expected_tokens_per_round(alpha, probe_gamma),
                     tokens_per_round_probe=sum(s.emitted for s in stats_all) / max(1, sum(s.rounds for s in stats_all)),
                     speedup_vs_plain=vs.speedup, speedup_vs_plain_lo=vs.lo, speedup_vs_plain_hi=vs.hi,
                     describe_vs_plain=vs.describe(), cpu_speedup_vs_plain=vc.speedup, cpu_speedup_vs_plain_lo=vc.lo,
                     cpu_speedup_vs_plain_hi=vc.hi)
            if "plain_fast_decoder" in wall:
                # compiled: verify at best as cheap as one step (v = 1), the best gamma
                best = max(gammas, key=lambda g_: expected_speedup(alpha, g_, c_compiled, 1.0))
                r.update(c_compiled=c_compiled, gamma_compiled=best,
                         predicted_speedup_compiled=expected_speedup(alpha, best, c_compiled, 1.0))
                vf = timing_ratio(wall["plain_fast_decoder"], wall[spec], a="the compiled FastDecoder", b=f"speculative (gamma {gamma})")
                r.update(speedup_vs_fast_decoder=vf.speedup, speedup_vs_fast_decoder_lo=vf.lo, speedup_vs_fast_decoder_hi=vf.hi,
                         describe_vs_fast_decoder=vf.describe())
        if name == "plain_fast_decoder":
            r.update(compile_s=compile_s, compile_error=compile_error)
        rows.append(r)
    return rows
