"""The long-range recall task (codex_lab.data.longrange): the answer is only in the far binding,
distances are what they claim, nothing leaks, and the receptive-field arithmetic is exact."""

from __future__ import annotations

import math
import pytest
import torch

from codex_lab.data.longrange import (RecallTask, binding_line, candidates, filler_lines, make_recall_batch, query_line,
                                      reach, recall_vocab, window_baseline, window_reach)
from codex_lab.nn.patterns import parse_pattern


@pytest.fixture(scope="module")
def setup(small_corpus):
    from codex_lab.training.checkpoint import load_pretrained

    tok = load_pretrained().tokenizer  # the course tokenizer: the task's tokens are checked against it
    vocab = recall_vocab(tok)
    lines = filler_lines(tok, small_corpus.texts("train"), vocab)
    return tok, vocab, lines


@pytest.fixture(scope="module")
def big_batch(setup):
    _, vocab, lines = setup
    return make_recall_batch(lines, vocab, RecallTask(), 48, torch.Generator().manual_seed(3))


def test_vocab_tokens_are_single_and_round_trip(setup):
    tok, vocab, _ = setup
    assert len(set(vocab.keys)) == len(vocab.keys) == len(vocab.pools)
    flat = vocab.values
    assert len(set(flat)) == len(flat), "pools must be disjoint"
    assert not set(flat) & set(vocab.keys)
    for key, pool in zip(vocab.keys, vocab.pools):
        for v in pool[:2]:
            for ids in (binding_line(vocab, key, v), query_line(vocab, key, v)):
                assert tok.encode(tok.decode(ids)) == ids  # the task is real text, tokenized as written


def test_filler_has_no_key_or_value_tokens(setup):
    _, vocab, lines = setup
    banned = set(vocab.keys) | set(vocab.values)
    tok = setup[0]
    assert all(not banned.intersection(line) for line in lines)
    assert all(tok.decode(line).endswith("\n") and len(line) <= 24 for line in lines)


def test_positions_and_distances_are_exact(setup, big_batch):
    _, vocab, _ = setup
    b, task = big_batch, RecallTask()
    B, T = b.tokens.shape
    assert T == task.seq_len and b.query_pos.shape == (B, len(task.distances) * task.per_distance)
    assert torch.equal(b.distance, b.query_pos - b.source_pos)
    for row in b.distance.tolist():
        assert sorted(row) == sorted(d for d in task.distances for _ in range(task.per_distance))
    tok_at = lambda pos: b.tokens.gather(1, pos)  # noqa: E731
    assert torch.equal(tok_at(b.source_pos), b.answer)  # the binding's value token
    assert torch.equal(tok_at(b.source_pos - 2), b.key)  # KEY = value
    assert torch.equal(tok_at(b.query_pos - 1), b.key)  # ...(KEY, value)
    assert torch.equal(tok_at(b.query_pos + 1), b.answer)  # the next token is the answer
    assert (tok_at(b.query_pos) == vocab.comma).all()
    # targets: the answer at query positions, -100 everywhere else
    assert int((b.targets != -100).sum()) == b.query_pos.numel()
    assert torch.equal(b.targets.gather(1, b.query_pos), b.answer)


def test_no_leakage(setup, big_batch):
    """Each key is asked once, and the answer appears nowhere between its binding and its query:
    the only copy of the answer a query can use is the binding itself."""
    _, vocab, _ = setup
    b = big_batch
    for r in range(b.tokens.shape[0]):
        assert len(set(b.key[r].tolist())) == b.key.shape[1]
        row = b.tokens[r].tolist()
        for s, q, a, k in zip(b.source_pos[r].tolist(), b.query_pos[r].tolist(), b.answer[r].tolist(), b.key[r].tolist()):
            assert a not in row[s + 1 : q + 1]
            assert row.count(a) == 2 and row.count(k) == 2  # the binding and the query only: no decoy, no copy
    # every value is drawn from its key's pool
    cand = candidates(vocab, b.key)
    assert (cand == b.answer[..., None]).sum(-1).eq(1).all()


def test_window_reader_is_at_chance_beyond_its_window(setup):
    """A reader of the last w tokens that copies a visible binding is perfect inside w and at
    chance (1 / pool size) beyond it: the far answer is not predictable without the far context."""
    _, vocab, lines = setup
    task = RecallTask()
    b = make_recall_batch(lines, vocab, task, 160, torch.Generator().manual_seed(5))
    w = 100
    hit = (window_baseline(b, vocab, w) == b.answer).float()
    near, far = b.distance < w - 1, b.distance > w
    assert hit[near].mean() == 1.0
    p = 1 / len(vocab.pools[0])
    n = int(far.sum())
    # binomial: 4 standard deviations (a false failure ~1 in 16,000 runs; the seed is fixed anyway)
    assert abs(float(hit[far].mean()) - p) < 4 * math.sqrt(p * (1 - p) / n), (float(hit[far].mean()), p, n)


def test_batches_are_deterministic(setup):
    _, vocab, lines = setup
    a = make_recall_batch(lines, vocab, RecallTask(), 2, torch.Generator().manual_seed(1))
    b = make_recall_batch(lines, vocab, RecallTask(), 2, torch.Generator().manual_seed(1))
    assert torch.equal(a.tokens, b.tokens)


def test_bad_task_is_refused_with_a_fix(setup):
    _, vocab, lines = setup
    with pytest.raises(ValueError, match="longer sequence"):
        RecallTask(seq_len=256, distances=(24, 512))
    with pytest.raises(ValueError, match="more keys"):
        make_recall_batch(lines, vocab, RecallTask(seq_len=256, n_keys=4, distances=(24, 48, 96), per_distance=2), 1,
                          torch.Generator().manual_seed(0))


def _reach_bfs(specs, n):
    """Independent reference: breadth-first search over (layer, position) states."""
    masks = [parse_pattern(s).mask(n) for s in specs]
    out = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        front = {i}
        for m in reversed(masks):  # the last layer reads first, walking back toward the input
            front = {j for k in front for j in torch.nonzero(m[k]).flatten().tolist()}
        for j in front:
            out[i, j] = True
    return out


@pytest.mark.parametrize("specs", [["window:5"] * 3, ["window:4+strided:4"] * 2, ["window:3+global:2", "dense"],
                                   ["window:4+blockstride:2:3"] * 2, ["strided:3", "window:2"]])
def test_reach_matches_path_search(specs):
    assert torch.equal(reach(specs, 24), _reach_bfs(specs, 24))


def test_receptive_field_formulas():
    n = 96
    for L, w in ((1, 8), (2, 8), (3, 16)):
        r = reach([f"window:{w}"] * L, n)
        i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        assert torch.equal(r, (i - j >= 0) & (i - j <= window_reach(L, w)))
    # window + stride, w >= s: every earlier position in two hops, not in one
    two = reach(["window:8+strided:8"] * 2, n)
    assert torch.equal(two, torch.ones(n, n, dtype=torch.bool).tril())
    assert not torch.equal(reach(["window:8+strided:8"], n), two)


SCATTERED = RecallTask(seq_len=128, n_keys=7, distances=(10, 20, 40, 64, 88, 112), per_distance=1, layout="scattered")


@pytest.fixture(scope="module")
def scattered_batch(setup):
    _, vocab, lines = setup
    return make_recall_batch(lines, vocab, SCATTERED, 120, torch.Generator().manual_seed(4))


def test_scattered_positions_distances_and_no_leakage(setup, scattered_batch):
    """Scattered layout: every binding line at its own random place, the query exactly
    `distance` after the value, the answer nowhere else, plus one unqueried distractor binding."""
    _, vocab, _ = setup
    b = scattered_batch
    assert b.tokens.shape == (120, 128)
    for row in b.distance.tolist():
        assert sorted(row) == sorted(SCATTERED.distances)
    tok_at = lambda pos: b.tokens.gather(1, pos)  # noqa: E731
    assert torch.equal(tok_at(b.source_pos), b.answer) and torch.equal(tok_at(b.source_pos - 2), b.key)
    assert (tok_at(b.source_pos - 1) == vocab.assign).all() and (tok_at(b.query_pos) == vocab.comma).all()
    assert torch.equal(tok_at(b.query_pos + 1), b.answer) and torch.equal(b.targets.gather(1, b.query_pos), b.answer)
    assert torch.equal(b.query_pos, b.query_pos.sort(-1).values)  # queries in order of position
    for r in range(b.tokens.shape[0]):
        row = b.tokens[r].tolist()
        # bindings: "KEY =" pairs; each binding line starts a line (after a newline or at 0)
        starts = [i for i in range(len(row) - 1) if row[i] in vocab.keys and row[i + 1] == vocab.assign]
        assert len(starts) == SCATTERED.n_keys  # the queried keys and one distractor
        assert all(i == 0 or row[i - 1] == vocab.newline for i in starts)
        for s, q, a, k in zip(b.source_pos[r].tolist(), b.query_pos[r].tolist(), b.answer[r].tolist(), b.key[r].tolist()):
            assert a not in row[s + 1 : q + 1] and row.count(a) == 2 and row.count(k) == 2


def test_scattered_bindings_are_spread_over_the_file(scattered_batch):
    """No position is special: binding values fall all over the first 3/4 of the file (their
    query must still fit after them), not in a fixed header."""
    src = scattered_batch.source_pos
    assert len(set(src.flatten().tolist())) > 60
    near = scattered_batch.distance <= 20  # short distances: their bindings may sit anywhere
    assert src[near].max() - src[near].min() > 80  # from the first quarter of the file to the last


def test_scattered_window_reader_is_at_chance_beyond_its_window(setup):
    _, vocab, lines = setup
    b = make_recall_batch(lines, vocab, SCATTERED, 200, torch.Generator().manual_seed(6))
    w = 47  # the lesson's window-only reach L(w - 1) = 46
    hit = (window_baseline(b, vocab, w) == b.answer).float()
    assert hit[b.distance < w - 1].mean() == 1.0
    far = b.distance > w
    p, n = 1 / len(vocab.pools[0]), int(far.sum())
    # binomial: 4 standard deviations (the seed is fixed)
    assert abs(float(hit[far].mean()) - p) < 4 * math.sqrt(p * (1 - p) / n), (float(hit[far].mean()), p, n)


def test_scattered_task_refuses_what_does_not_fit(setup):
    _, vocab, lines = setup
    with pytest.raises(ValueError, match="layout"):
        RecallTask(layout="footer")
    with pytest.raises(ValueError, match="cannot scatter"):
        make_recall_batch(lines, vocab, RecallTask(seq_len=128, n_keys=14, distances=(10, 20, 40, 64, 88, 112, 116),
                                                   per_distance=1, layout="scattered"), 1, torch.Generator().manual_seed(0))
