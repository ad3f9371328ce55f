"""Exercise checks of lessons 00-04 against plausible wrong answers.

One test per exercise: every wrong variant must fail, and its feedback must name the bug
(a keyword of the message). A check weakened so that a variant passes, or that blames the
wrong mistake, fails here. Also: the checks' own references equal the package (the
oracles), lesson notebooks graded as submissions earn nothing, and no exercise answer
stands verbatim in a lesson notebook.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from codex_lab.course.checks import load_all
from codex_lab.course.exercises import BEGIN, END
from codex_lab.course.outcome import FAILED, PARTIAL, PASSED, run_check
from codex_lab.course.grading import grade_file

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ("00", "01", "02", "03", "04")


def _run(lesson: str, name: str, fn: Callable[..., Any]):
    return run_check(load_all()[(lesson, name)], fn)


def _assert_fails(lesson: str, name: str, variants: dict[str, tuple[Callable[..., Any], str]]) -> None:
    for label, (fn, keyword) in variants.items():
        r = _run(lesson, name, fn)
        # a wrong answer may keep the points of the check's cases it gets right, never all of them
        assert r.status in (FAILED, PARTIAL) and r.points < r.max_points, f"{name}: wrong variant '{label}' got {r.status}: {r.message}"
        assert re.search(keyword, r.message, re.I), f"{name}: wrong variant '{label}': feedback {r.message!r} does not name the bug ({keyword!r})"


# ---------------------------------------------------------------- lesson 00


def test_chars_per_token_wrong_answers():
    enc = lambda tok, t: len(tok.encode(t))  # noqa: E731
    _assert_fails("00", "chars_per_token", {
        "inverted": (lambda tok, texts: sum(enc(tok, t) for t in texts) / sum(map(len, texts)), "tokens per character"),
        "mean of ratios": (lambda tok, texts: sum(len(t) / enc(tok, t) for t in texts) / len(texts), "mean of the per-text"),
        "floor division": (lambda tok, texts: sum(map(len, texts)) // sum(enc(tok, t) for t in texts), "floor division"),
        "first text only": (lambda tok, texts: len(texts[0]) / enc(tok, texts[0]), "first text"),
        "words": (lambda tok, texts: sum(map(len, texts)) / sum(len(t.split()) for t in texts), "words"),
        "bytes": (lambda tok, texts: sum(len(t.encode()) for t in texts) / sum(enc(tok, t) for t in texts), "bytes"),
    })
    right = lambda tok, texts: sum(map(len, texts)) / sum(enc(tok, t) for t in texts)  # noqa: E731
    assert _run("00", "chars_per_token", right).status == PASSED


def _cut(completion, *, keep_stop=False, blank_ends=False, test_first=False, spaces_only=False):
    """Variants of the lesson's cut rule, each with one plausible mistake switched on."""
    first, nl, rest = completion.partition("\n")
    out = "" if test_first else first + nl
    lines = completion.splitlines(keepends=True) if test_first else rest.splitlines(keepends=True)
    for line in lines:
        indented = line.startswith(" ") if spaces_only else line[:1].isspace()
        if (blank_ends and not line.strip()) or (line.strip() and not indented):
            if keep_stop:
                out += line
            break
        out += line
    return out


def test_cut_at_function_end_wrong_answers():
    _assert_fails("00", "cut_at_function_end", {
        "keeps the top-level line": (lambda c: _cut(c, keep_stop=True), "starts the next statement"),
        "a blank line ends it": (lambda c: _cut(c, blank_ends=True), "blank line does not end"),
        "tests the first line too": (lambda c: _cut(c, test_first=True), "continues the prompt"),
        "tabs are not indentation": (lambda c: _cut(c, spaces_only=True), "tab"),
        "drops the final newline": (lambda c: _cut(c).rstrip("\n"), "keep the newlines"),
    })
    assert _run("00", "cut_at_function_end", lambda c: _cut(c)).status == PASSED


# ---------------------------------------------------------------- lesson 01


def _probs(q, k, *, scale=None, fill=float("-inf"), dim=-1, mask="tril", zero_after=False, diag=0):
    T, D = q.shape[-2], q.shape[-1]
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(D) if scale is None else scale)
    keep = torch.ones(T, T, dtype=torch.bool).tril(diag)
    if mask == "triu":
        keep = keep.T
    if zero_after:
        return torch.softmax(s, dim) * keep
    return torch.softmax(s.masked_fill(~keep, fill), dim)


def test_causal_attention_probs_wrong_answers():
    _assert_fails("01", "causal_attention_probs", {
        "no scale": (lambda q, k: _probs(q, k, scale=1.0), "not scaled"),
        "divide by D": (lambda q, k: _probs(q, k, scale=1 / q.shape[-1]), "divided by D"),
        "reversed mask": (lambda q, k: _probs(q, k, mask="triu"), "reversed"),
        "fill 0": (lambda q, k: _probs(q, k, fill=0.0), "-inf"),
        "softmax over queries": (lambda q, k: _probs(q, k, dim=-2), "over the queries"),
        "mask after softmax": (lambda q, k: _probs(q, k, zero_after=True), "sum to 1"),
        "no self": (lambda q, k: _probs(q, k, diag=-1), "itself"),
    })


def _diag(p, d):
    return torch.diagonal(p, offset=d)


def test_distance_profile_wrong_answers():
    T = lambda p: p.shape[-1]  # noqa: E731
    _assert_fails("01", "distance_profile", {
        "sum": (lambda p: torch.stack([_diag(p, -d).sum() for d in range(T(p))]), "mean"),
        "divide by T": (lambda p: torch.stack([_diag(p, -d).sum() / T(p) for d in range(T(p))]), "T - d"),
        "future diagonal": (lambda p: torch.stack([_diag(p, d).mean() for d in range(T(p))]), r"i \+ d"),
        "key position": (lambda p: p.mean(0), "position"),
    })


def _share(p, window, min_query, *, le=False, start=None, by_index=False):
    T = p.shape[-1]
    i = torch.arange(T)
    gap = i[:, None] - i[None, :]
    near = (gap >= 0) & ((gap <= window) if le else (gap < window))
    if by_index:
        near = (gap >= 0) & (i[None, :] < window)
    return float((p * near).sum(-1)[min_query if start is None else start:].mean())


def test_window_share_wrong_answers():
    _assert_fails("01", "window_share", {
        "off by one": (lambda p, w, mq: _share(p, w, mq, le=True), "window - 1|counts .* keys"),
        "all queries": (lambda p, w, mq: _share(p, w, mq, start=0), "min_query"),
        "one query late": (lambda p, w, mq: _share(p, w, mq, start=mq + 1), "itself"),
        "key index": (lambda p, w, mq: _share(p, w, mq, by_index=True), "measured back from each query"),
        "sum over queries": (lambda p, w, mq: float(_share(p, w, mq) * (p.shape[0] - mq)), "mean over queries"),
        "tensor": (lambda p, w, mq: torch.tensor(_share(p, w, mq)), "float"),
    })


# ---------------------------------------------------------------- lesson 02


def _ws(q, k, w, s, *, le=False, both=False, causal=True, key_stride=False):
    d = q - k
    near = (d <= w) if le else (d < w)
    on = (k % s == 0) if key_stride else (d % s == 0)
    hit = (near & on) if both else (near | on)
    return ((d >= 0) & hit) if causal else hit


def test_window_strided_allowed_wrong_answers():
    _assert_fails("02", "window_strided_allowed", {
        "<= window": (lambda q, k, w, s: _ws(q, k, w, s, le=True), "not <="),
        "and": (lambda q, k, w, s: _ws(q, k, w, s, both=True), r"OR"),
        "not causal": (lambda q, k, w, s: _ws(q, k, w, s, causal=False), "future"),
        "stride on key index": (lambda q, k, w, s: _ws(q, k, w, s, key_stride=True), "counts back from the query"),
        "indices not positions": (lambda q, k, w, s: _ws(torch.arange(q.numel()).view(q.shape), torch.arange(k.numel()).view(k.shape), w, s),
                                  "differences"),
    })


def _pairs(n, w, s, **kw):
    pos = torch.arange(n)
    return int(_ws(pos[:, None], pos[None, :], w, s, **kw).sum())


def test_pairs_and_density_wrong_answers():
    def double(n, w, s):
        pos = torch.arange(n)
        d = pos[:, None] - pos[None, :]
        p = int(((d >= 0) & (d < w)).sum()) + int(((d >= 0) & (d % s == 0)).sum())
        return p, p / (n * (n + 1) / 2)

    _assert_fails("02", "pairs_and_density", {
        "density over n*n": (lambda n, w, s: (_pairs(n, w, s), _pairs(n, w, s) / (n * n)), r"n\*n"),
        "density over n(n-1)/2": (lambda n, w, s: (_pairs(n, w, s), _pairs(n, w, s) / max(1, n * (n - 1) / 2)), "diagonal"),
        "double count": (double, "counted twice"),
        "not causal": (lambda n, w, s: (_pairs(n, w, s, causal=False), 0.5), "after the query"),
        "<= window": (lambda n, w, s: (_pairs(n, w, s, le=True), 0.5), "window holds"),
    })


def _tiles(mask, b, *, floor=False, all_=False, transpose=False, every_causal=False):
    n = mask.shape[0]
    nb = n // b if floor else -(-n // b)
    out = []
    for i in range(nb):
        for j in range(nb):
            t = mask[i * b : (i + 1) * b, j * b : (j + 1) * b]
            hit = (j <= i) if every_causal else bool(t.all() if all_ else t.any())
            if hit:
                out.append((j, i) if transpose else (i, j))
    return sorted(out)


def test_touched_tiles_wrong_answers():
    _assert_fails("02", "touched_tiles", {
        "floor blocks": (lambda m, b: _tiles(m, b, floor=True), "partial"),
        "all not any": (lambda m, b: _tiles(m, b, all_=True), r"\.any\(\)"),
        "transposed": (lambda m, b: _tiles(m, b, transpose=True), "transposed"),
        "every causal tile": (lambda m, b: _tiles(m, b, every_causal=True), "no allowed pair"),
        "unsorted": (lambda m, b: _tiles(m, b)[::-1], "sorted"),
    })


# ---------------------------------------------------------------- lesson 03


def _decode(q, k, v, lengths, *, tile=False, pad=False, off=False, scale=None):
    B, H, D = q.shape
    g = H // k.shape[1]
    kk = k.repeat(1, g, 1, 1) if tile else k.repeat_interleave(g, 1)
    vv = v.repeat(1, g, 1, 1) if tile else v.repeat_interleave(g, 1)
    s = torch.einsum("bhd,bhsd->bhs", q, kk) * (1 / math.sqrt(D) if scale is None else scale)
    pos = torch.arange(k.shape[2])
    valid = (pos[None] <= lengths[:, None]) if off else (pos[None] < lengths[:, None])
    if not pad:
        s = s.masked_fill(~valid[:, None], float("-inf"))
    return torch.einsum("bhs,bhsd->bhd", s.softmax(-1), vv)


def test_grouped_decode_attention_wrong_answers():
    _assert_fails("03", "grouped_decode_attention", {
        "tiled heads": (lambda q, k, v, n: _decode(q, k, v, n, tile=True), r"h % H_kv"),
        "reads padding": (lambda q, k, v, n: _decode(q, k, v, n, pad=True), "padding"),
        "off by one": (lambda q, k, v, n: _decode(q, k, v, n, off=True), r"s < lengths\[b\]"),
        "no scale": (lambda q, k, v, n: _decode(q, k, v, n, scale=1.0), "sqrt"),
    })
    right = lambda q, k, v, n: _decode(q, k, v, n)  # noqa: E731
    assert _run("03", "grouped_decode_attention", right).status == PASSED


def test_kv_cache_bytes_wrong_answers():
    _assert_fails("03", "kv_cache_bytes", {
        "no factor 2": (lambda L, h, d, s, b, nb: L * h * d * s * b * nb, "keys \\*and\\* values"),
        "elements": (lambda L, h, d, s, b, nb: 2 * L * h * d * s * b, "bytes_per_elem"),
        "one layer": (lambda L, h, d, s, b, nb: 2 * h * d * s * b * nb, "layers"),
        "one sequence": (lambda L, h, d, s, b, nb: 2 * L * h * d * s * nb, "batch"),
        "float": (lambda L, h, d, s, b, nb: 2.0 * L * h * d * s * b * nb, "int"),
    })


def test_mean_pool_kv_wrong_answers():
    def pool(w, H, G, how):
        g, hd = H // G, w.shape[0] // H
        heads = w.reshape(H, hd, -1)
        if how == "strided":
            return heads.reshape(g, G, hd, -1).mean(0).reshape(G * hd, -1)
        grouped = heads.reshape(G, g, hd, -1)
        return {"sum": grouped.sum(1), "first": grouped[:, 0]}[how].reshape(G * hd, -1)

    _assert_fails("03", "mean_pool_kv", {
        "strided groups": (lambda w, H, G: pool(w, H, G, "strided"), "consecutive"),
        "sum": (lambda w, H, G: pool(w, H, G, "sum"), "divide by g"),
        "first head": (lambda w, H, G: pool(w, H, G, "first"), "first head"),
        "pool columns": (lambda w, H, G: w.reshape(w.shape[0], G, -1).mean(-1) if w.shape[1] % G == 0 else w[:, :G], "shape"),
    })


# ---------------------------------------------------------------- lesson 04


def _route(logits, k, *, renorm=True, dtype=torch.long, largest=True, misalign=False):
    p = logits.float().softmax(-1)
    vals, idx = p.topk(k, -1, largest=largest)
    w = vals / vals.sum(-1, keepdim=True) if renorm else vals
    if misalign:
        w = w.flip(-1)
    return idx.to(dtype), w


def test_top_k_route_wrong_answers():
    _assert_fails("04", "top_k_route", {
        "int32 indices": (lambda l, k: _route(l, k, dtype=torch.int32), "int64"),
        "no renormalisation": (lambda l, k: _route(l, k, renorm=False), "raw probabilities"),
        "smallest": (lambda l, k: _route(l, k, largest=False), "least"),
        "softmax over tokens": (lambda l, k: (lambda p: (p.topk(k, -1).indices, p.topk(k, -1).values / p.topk(k, -1).values.sum(-1, keepdim=True)))(l.softmax(0)), "dim=0"),
        "misaligned weights": (lambda l, k: _route(l, k, misalign=True), "wrong columns"),
        "transposed": (lambda l, k: tuple(t.T for t in _route(l, k)), r"\(N, k\)"),
    })


def _lb(probs, idx, *, per_token=False, times_e=True, f_probs=False, detach=False, p_sum=False):
    N, E = probs.shape
    f = torch.bincount(idx.reshape(-1), minlength=E).to(probs.dtype) / (N if per_token else idx.numel())
    P = probs.sum(0) if p_sum else probs.mean(0)
    if f_probs:
        f = P
    if detach:
        P = P.detach()
    return (E if times_e else 1) * (f * P).sum()


def test_balancing_loss_wrong_answers():
    _assert_fails("04", "balancing_loss", {
        "f over N": (lambda p, i: _lb(p, i, per_token=True), r"N\*k"),
        "no E": (lambda p, i: _lb(p, i, times_e=False), "multiply by E"),
        "f from probs": (lambda p, i: _lb(p, i, f_probs=True), "bincount"),
        "no gradient": (lambda p, i: _lb(p, i, detach=True), "graph"),
        "P summed": (lambda p, i: _lb(p, i, p_sum=True), r"\*mean\*"),
        "first choices only": (lambda p, i: _lb(p, i[:, :1]), "first choices"),
    })


def _cap(idx, E, C, *, le=False, token_major=False, global_count=False, latest=False):
    N, k = idx.shape
    used = [0] * E
    total = 0
    keep = torch.zeros(N, k, dtype=torch.bool)
    toks = list(range(N))[::-1] if latest else list(range(N))
    order = [(n, j) for n in toks for j in range(k)] if token_major else [(n, j) for j in range(k) for n in toks]
    for n, j in order:
        e = int(idx[n, j])
        full = (total >= C) if global_count else ((used[e] > C) if le else (used[e] >= C))
        if not full:
            used[e] += 1
            total += 1
            keep[n, j] = True
    return keep


def test_capacity_mask_wrong_answers():
    _assert_fails("04", "capacity_mask", {
        "<= capacity": (lambda i, E, C: _cap(i, E, C, le=True), "off by one"),
        "token-major": (lambda i, E, C: _cap(i, E, C, token_major=True), "slot by slot"),
        "one counter": (lambda i, E, C: _cap(i, E, C, global_count=True), "each expert"),
        "latest first": (lambda i, E, C: _cap(i, E, C, latest=True), "earlier tokens"),
        "int mask": (lambda i, E, C: _cap(i, E, C).int(), "bool"),
    })


# ---------------------------------------------------------------- oracles and integrity


def test_check_references_equal_the_package():
    """The checks compute their answers with plain code; hold that code to codex_lab."""
    from codex_lab.lessons.l01_attention_patterns.analysis import mass_by_distance, share_within
    from codex_lab.lessons.l02_sparse_attention import checks as c02
    from codex_lab.lessons.l04_moe import checks as c04
    from codex_lab.nn.moe import capacity_keep_mask, load_balancing_loss, route
    from codex_lab.nn.patterns import parse_pattern

    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(16, 16, generator=gen).masked_fill(~torch.ones(16, 16, dtype=torch.bool).tril(), float("-inf")), -1)
    maps = p[None, None]
    prof = torch.stack([torch.diagonal(p, offset=-d).mean() for d in range(16)])
    assert torch.allclose(prof, mass_by_distance(maps)[0, 0], atol=1e-6)
    assert abs(_share(p, 4, 8) - float(share_within(maps, 4, 8)[0, 0])) < 1e-6
    for n, w, s in c02._CASES:
        pos = torch.arange(n)
        assert torch.equal(c02._ws(pos[:, None], pos[None, :], w, s), parse_pattern(f"window:{w}+strided:{s}").mask(n))
    for spec, mask in [("window:4+blockstride:4:3", c02._mask("window+blockstride", 24, 4, 3)), ("window:5", c02._mask("window", 21, 5)),
                       ("strided:8", c02._mask("strided", 32, 8)), ("fixed:6:2", c02._mask("fixed", 30, 6, 2))]:
        assert torch.equal(mask, parse_pattern(spec).mask(mask.shape[0])), spec
        for bs in (4, 6, 8):
            want = [tuple(t) for t in parse_pattern(spec).tiles(mask.shape[0], bs).nonzero().tolist()]
            assert c02._tiles(mask, bs) == want, (spec, bs)
    logits = torch.randn(10, 6, generator=gen)
    r = route(logits, 2)
    mine_idx, mine_w = _route(logits, 2)
    assert torch.equal(mine_idx, r.expert_idx) and torch.allclose(mine_w, r.weights)
    assert torch.allclose(c04._switch(r.probs, r.expert_idx), load_balancing_loss(r.probs, r.expert_idx))
    for cap in (1, 2, 4):
        idx = torch.stack([torch.randperm(6, generator=gen)[:2] for _ in range(12)])
        assert torch.equal(c04._keep(idx, 6, cap), capacity_keep_mask(idx, 6, cap))


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_notebook_earns_nothing_as_a_submission(lesson):
    (nb,) = sorted((ROOT / "notebooks").glob(f"{lesson}_*.py"))
    results = grade_file(nb)
    assert results and not any(r.status == PASSED for r in results), [(r.name, r.status) for r in results]


def _answer_lines(src: str) -> list[str]:
    lines, inside = [], False
    for line in src.splitlines():
        if line.strip() == BEGIN:
            inside = True
        elif line.strip() == END:
            inside = False
        elif inside:
            code = line.split("#")[0].strip()
            if len(code) >= 20:  # short lines (`return keep`) say nothing about copying
                lines.append(code)
    return lines


@pytest.mark.parametrize("lesson", LESSONS)
def test_no_answer_stands_verbatim_in_the_lesson(lesson):
    (sol,) = sorted((ROOT / "solutions").glob(f"{lesson}_*.py"))
    (nb,) = sorted((ROOT / "notebooks").glob(f"{lesson}_*.py"))
    lesson_code = {line.split("#")[0].strip() for line in nb.read_text().splitlines()}
    copied = [line for line in _answer_lines(sol.read_text()) if line in lesson_code]
    assert not copied, f"{sol.name}: answer lines stand verbatim in {nb.name}: {copied}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_exercise_files_do_not_import_the_answers(lesson):
    (ex,) = sorted((ROOT / "exercises").glob(f"{lesson}_*.py"))
    text = ex.read_text()
    forbidden = {"00": ["tokenizer_summary", "cut_function"], "01": ["mass_by_distance", "share_within", "attention_entropy"],
                 "02": ["parse_pattern", "LocalWindow", "Strided", "tiles_computed"],
                 "03": ["mean_pool_heads", "mha_to_gqa", "kv_cache_bytes(cfg", "attention_reference", "attention_sdpa"],
                 "04": ["route(", "load_balancing_loss", "capacity_keep_mask", "MoEFeedForward"]}[lesson]
    imports = "\n".join(line for line in text.splitlines() if line.startswith(("import ", "from ")))
    assert not [n for n in forbidden if n.rstrip("(") in imports], imports


def _shortcuts() -> dict[tuple[str, str], Callable[..., Any]]:
    """One-line answers that call the package's own function: none may pass."""
    import codex_lab as cl
    from codex_lab.data.tokenizer import tokenizer_summary
    from codex_lab.nn.config import ModelConfig

    def kv(L, h, d, s, b, nb):
        cfg = ModelConfig(vocab_size=8, d_model=h * d, n_layer=L, n_head=h, n_kv_head=h)
        return cl.kv_cache_bytes(cfg, b, s, {1: torch.int8, 2: torch.bfloat16, 4: torch.float32}[nb])

    return {
        ("00", "chars_per_token"): lambda tok, texts: tokenizer_summary(tok, texts)["chars_per_token"],
        ("00", "cut_at_function_end"): lambda c: cl.cut_function(c),
        ("01", "causal_attention_probs"): lambda q, k: cl.attention_reference(
            q[None], k[None], torch.eye(q.shape[-2]).expand(1, q.shape[0], -1, -1), None, is_causal=True)[0],
        ("01", "distance_profile"): lambda p: cl.mass_by_distance(p[None, None])[0, 0],
        ("01", "window_share"): lambda p, w, mq: float(cl.share_within(p[None, None], w, mq)[0, 0]),
        ("02", "window_strided_allowed"): lambda q, k, w, s: cl.parse_pattern(f"window:{w}+strided:{s}").allowed(q, k),
        ("02", "pairs_and_density"): lambda n, w, s: (cl.LocalWindow(w) + cl.Strided(s)).pairs(n),
        ("02", "touched_tiles"): lambda m, b: [tuple(t) for t in cl.parse_pattern("dense").tiles(m.shape[0], b).nonzero().tolist()],
        ("03", "grouped_decode_attention"): lambda q, k, v, n: cl.attention_sdpa(
            q[:, :, None], k, v, (torch.arange(k.shape[2])[None, :] < n[:, None])[:, None, None, :])[:, :, 0],
        ("03", "kv_cache_bytes"): kv,
        ("03", "mean_pool_kv"): lambda w, h, g: cl.mean_pool_heads(w, h, g),
        ("04", "top_k_route"): lambda l, k: (lambda r: (r.expert_idx, r.weights))(cl.route(l, k)),
        ("04", "balancing_loss"): lambda p, i: cl.load_balancing_loss(p, i),
        ("04", "capacity_mask"): lambda i, e, c: cl.capacity_keep_mask(i, e, c),
        # the derivations: the package's nearest tool used on the case (a decaying reader's matrix; routings simulated)
        ("01", "decay_share_within"): lambda T, w, mq, r: float(cl.share_within(_decaying_reader(T, r)[None, None], w, mq)[0, 0]),
        ("04", "expected_drop_fraction"): lambda N, E, C: float(sum(
            (~cl.capacity_keep_mask(torch.randint(0, E, (N, 1)), E, C)).float().mean() for _ in range(200)) / 200),
    }


def _decaying_reader(T: int, r: float) -> torch.Tensor:
    """(T, T) causal rows with weight r^(i - j) on key j, normalised."""
    i = torch.arange(T)
    d = (i[:, None] - i[None, :]).clamp(min=0).double()
    w = torch.where(i[:, None] >= i[None, :], r ** d, torch.zeros((), dtype=torch.float64))
    return w / w.sum(-1, keepdim=True)


# derivations with no package function to call (nothing to block): bits per character is a formula the package
# never computes, so its shortcut is the answer itself, which the check rightly passes
NO_PACKAGE_ANSWER = {("00", "bits_per_char")}


def test_package_one_liners_do_not_pass():
    shortcuts = _shortcuts()
    assert set(shortcuts) == {k for k in load_all() if k[0] in LESSONS} - NO_PACKAGE_ANSWER, \
        "one shortcut per exercise of lessons 00-04 (or a declared derivation with no package answer)"
    for (lesson, name), fn in shortcuts.items():
        r = _run(lesson, name, fn)
        assert r.status != PASSED and r.points == 0, f"{name}: the package one-liner passed"
        assert "write this one yourself" in r.message, (name, r.status, r.message)


def test_less_obvious_package_shortcuts_are_blocked():
    """Package code that reaches the answer sideways (a block stride of 1 is a token stride;
    a model's pooled K/V; MoE layers call route) is blocked too."""
    import codex_lab as cl
    from codex_lab.nn.config import ModelConfig

    def ws(q, k, w, s):
        d = q - k
        return cl.BlockStrided(1, s).allowed(q, k) | ((d >= 0) & (d < w))

    def pool(w, h, g):
        cfg = ModelConfig(vocab_size=8, d_model=4 * h, n_layer=1, n_head=h, max_seq_len=8)  # even head_dim for RoPE
        model = cl.CodexModel(cfg)
        model.layers[0].attn.k_proj = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)  # the weight under test
        with torch.no_grad():
            model.layers[0].attn.k_proj.weight.copy_(w)
        return cl.mha_to_gqa(model, g).layers[0].attn.k_proj.weight.detach()

    for (lesson, name), fn in {("02", "window_strided_allowed"): ws, ("03", "mean_pool_kv"): pool}.items():
        r = _run(lesson, name, fn)
        assert r.points == 0 and "write this one yourself" in r.message, (name, r.status, r.message)


def test_expected_drop_fraction_wrong_answers():
    """Lesson 04's derivation: the expected share of tokens a capacity limit drops under uniform top-1
    routing. The right sum passes; each plausible wrong derivation fails, named (Jensen's gap first)."""
    def exact(N, E, C, *, strict=False):
        p = 1.0 / E
        lo = C if strict else C + 1
        return sum(math.comb(N, n) * p ** n * (1 - p) ** (N - n) * (n - C + (1 if strict else 0)) for n in range(lo, N + 1))

    assert _run("04", "expected_drop_fraction", lambda N, E, C: E * exact(N, E, C) / N).status == PASSED
    _assert_fails("04", "expected_drop_fraction", {
        "expectation inside the max": (lambda N, E, C: max(0.0, N / E - C) * E / N, "inside the max"),
        "one expert only": (lambda N, E, C: exact(N, E, C) / N, "multiply one expert"),
        "drops, not a share": (lambda N, E, C: E * exact(N, E, C), "share of the tokens"),
        "a full expert drops": (lambda N, E, C: E * exact(N, E, C, strict=True) / N, "exactly `capacity`"),
        "a constant": (lambda N, E, C: 0.1, "expected_drop_fraction"),
    })


def test_bits_per_char_wrong_answers():
    """Lesson 00's derivation: a loss in nats/token to bits per character. Each plausible slip is named."""
    assert _run("00", "bits_per_char", lambda lo, c: lo / c / math.log(2)).status == PASSED
    _assert_fails("00", "bits_per_char", {
        "nats per character": (lambda lo, c: lo / c, "divide by ln 2"),
        "bits per token": (lambda lo, c: lo / math.log(2), "bits per token"),
        "multiplied by chars/token": (lambda lo, c: lo * c / math.log(2), "do not multiply"),
        "log base 10": (lambda lo, c: lo / c / math.log(10), "base 10"),
        "times ln 2": (lambda lo, c: lo / c * math.log(2), "multiplies by ln 2"),
        "perplexity": (lambda lo, c: math.exp(lo) / c, "perplexity"),
        "a constant": (lambda lo, c: 1.0, "bits_per_char"),
    })


def test_decay_share_within_wrong_answers():
    """Lesson 01's derivation: the share within a window of a reader whose weight decays by r per token."""
    def ref(T, w, mq, r, *, infinite=False, last=False, wide=False):
        qs = [T - 1] if last else range(mq, T)
        vals = [(1 - r ** min(w + (1 if wide else 0), i + 1)) / (1 if infinite else (1 - r ** (i + 1))) for i in qs]
        return sum(vals) / len(vals)

    assert _run("01", "decay_share_within", ref).status == PASSED
    _assert_fails("01", "decay_share_within", {
        "infinite series": (lambda *a: ref(*a, infinite=True), "finite sum"),
        "last query only": (lambda *a: ref(*a, last=True), "every query"),
        "window + 1 keys": (lambda *a: ref(*a, wide=True), "window \\+ 1 keys"),
        "uniform reader": (lambda T, w, mq, r: ref(T, w, mq, 0.999999999), "decay_share_within"),
    })
