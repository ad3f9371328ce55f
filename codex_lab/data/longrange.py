"""A long-range recall task made of real code: constants defined at the top of a file, checked
N tokens further down (lesson 02: does sparse attention keep long-range dependencies?).

The construction is associative recall (Zoology's MQAR, Arora et al. 2023) written as Python:

    KEY = 7                              <- the header: n_keys bindings, one line each
    MAX = 12
    ...
    <real code from the embedded corpus>  <- filler: whole lines of stdlib source
    self.assertEqual(MAX, 12)             <- a query, `distance` tokens after MAX's value
    <more real code>
    self.assertEqual(KEY, 7)

That is the ``"header"`` layout. Lesson 02 trains on the ``"scattered"`` one (``RecallTask(layout=
"scattered")``): each binding line sits at a random line of the file and its query exactly
``distance`` tokens later, so no position holds the answers by construction (a pattern that
makes the first tokens global would see every header binding).

Each key has its own small pool of possible values (names, disjoint between keys, as a HOST
takes host names and a MODE takes modes), and each sequence draws every key's value uniformly
from its pool, independently of everything else. The answer of a query is the value bound to
its key in this sequence's header and nothing else: a reader that sees the query (so knows
the pool) but not the binding is at chance, 1 / pool_size, whatever else it sees. Filler lines that contain a key token are dropped (no
decoy bindings), and train and evaluation sequences take their filler from different corpus
files (the corpus' stable train/val split).

The loss and the accuracy count only the query positions: the ``,`` after the key in
``self.assertEqual(KEY, v)``, whose next token is the value. ``distance`` = position of that
``,`` minus position of the binding's value token, so a query at distance d needs the
information of a token d positions back. Distances are exact: the gap before a query is filled
with whole filler lines, and the few tokens left over with blank lines.

Receptive fields (:func:`reach`): layer l lets position i read position j when its pattern
allows (i, j); stacking L layers, i can read j when a chain i -> ... -> j of allowed pairs
exists, i.e. when the boolean product of the L masks is true at (i, j). A window-only stack
(window w) reaches back L * (w - 1) tokens; window + token stride s with w >= s reaches every
earlier position in two hops.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.nn.patterns import AttentionPattern, parse_pattern

# Constants that are one token at a line start and after "(" (the same token id in both places).
KEY_NAMES = ("KEY", "NAME", "MAX", "MIN", "SIZE", "TIMEOUT", "HOST", "PORT", "DEBUG", "LEVEL", "MODE", "LIMIT",
             "FLAGS", "TEST", "DATA", "FILE", "LINE", "TYPE", "DEFAULT", "ERROR", "URL", "MSG", "LOCK", "PIPE",
             "TIME", "HTTP", "SSL", "SMTP", "ASCII", "PROTOCOL", "SOCK", "CERT", "DIR", "MOD", "STR", "INT")
QUERY_PREFIX = "self.assertEqual("


@dataclass(frozen=True)
class RecallVocab:
    """Token ids the task is written in (from the course tokenizer).

    ``pools[i]`` are the values key ``keys[i]`` may take (disjoint between keys, as a HOST takes
    host names and a MODE takes modes): a reader that sees the query knows the pool, and only the
    binding says which member this file chose.
    """

    keys: tuple[int, ...]
    pools: tuple[tuple[int, ...], ...]
    assign: int  # " ="
    newline: int  # "\n"
    prefix: tuple[int, ...]  # "self", ".", "assertEqual", "("
    comma: int  # ","
    close: int  # ")"

    @property
    def values(self) -> tuple[int, ...]:
        """Every value token of every pool."""
        return tuple(v for pool in self.pools for v in pool)


def recall_vocab(tok: CodeTokenizer, n_keys_pool: int = 16, pool_size: int = 8) -> RecallVocab:
    """Pick key and value tokens, keeping only those that are one token where the task writes them.

    Keys: upper-case constant names (``KEY_NAMES``). Values: names written with a leading space
    (`` split``, `` color``, ...), taken from the end of the vocabulary (the rarest merges),
    ``pool_size`` per key. Raises ValueError when the tokenizer has too few.
    """
    if pool_size < 2:
        raise ValueError(f"pool_size must be >= 2 (chance = 1/pool_size), got {pool_size}")

    def one(text: str) -> int:
        ids = tok.encode(text)
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens for this tokenizer; the recall task needs one")
        return ids[0]

    assign, newline, comma, close = one(" ="), one("\n"), one(","), one(")")
    prefix = tuple(tok.encode(QUERY_PREFIX))
    keys = []
    for name in KEY_NAMES:
        line, query = tok.encode(f"{name} = x\n"), tok.encode(f"{QUERY_PREFIX}{name}, x)\n")
        if len(line) == 4 and len(query) == len(prefix) + 5 and line[0] == query[len(prefix)]:
            keys.append(line[0])
    if len(keys) < n_keys_pool:
        raise ValueError(f"only {len(keys)} key names are single tokens here; ask for n_keys_pool <= {len(keys)}")
    keys = keys[:n_keys_pool]
    values: list[int] = []
    for i in range(tok.vocab_size - 1, -1, -1):
        text = tok.decode([i])
        if len(text) >= 5 and text[0] == " " and text[1:].isalpha() and text[1:].islower() and text[1:].isascii():
            if (tok.encode(f"{KEY_NAMES[0]} ={text}\n")[1:] == [assign, i, newline]
                    and tok.encode(f"{QUERY_PREFIX}{KEY_NAMES[0]},{text})\n")[-3:] == [i, close, newline]):
                values.append(i)
        if len(values) == n_keys_pool * pool_size:
            break
    if len(values) < n_keys_pool * pool_size:
        raise ValueError(f"only {len(values)} value names are single tokens here; need {n_keys_pool * pool_size}")
    pools = tuple(tuple(values[j * pool_size : (j + 1) * pool_size]) for j in range(n_keys_pool))
    return RecallVocab(tuple(keys), pools, assign, newline, prefix, comma, close)


def binding_line(vocab: RecallVocab, key: int, value: int) -> list[int]:
    """``KEY = v\\n``: the value sits at index 2."""
    return [key, vocab.assign, value, vocab.newline]


def query_line(vocab: RecallVocab, key: int, value: int) -> list[int]:
    """``self.assertEqual(KEY, v)\\n``: the ``,`` that predicts the value sits at index len(prefix) + 1."""
    return [*vocab.prefix, key, vocab.comma, value, vocab.close, vocab.newline]


def filler_lines(tok: CodeTokenizer, texts: Sequence[str], vocab: RecallVocab, max_line: int = 24) -> list[list[int]]:
    """Whole lines of real code (token ids, each ending in a newline token), without key tokens.

    Lines longer than ``max_line`` tokens and lines holding any key or value token are dropped,
    so the filler never contains a decoy binding or a stray candidate answer.
    """
    banned = set(vocab.keys) | set(vocab.values)
    out: list[list[int]] = []
    for text in texts:
        for line in text.splitlines():
            ids = tok.encode(line + "\n") if line.strip() else []
            if ids and len(ids) <= max_line and not banned.intersection(ids):
                out.append(ids)
    if len(out) < 100:
        raise ValueError(f"only {len(out)} usable filler lines; give more corpus texts")
    return out


@dataclass(frozen=True)
class RecallTask:
    """Shape of the task: sequence length, bindings, distances queried, where the bindings sit.

    ``distances`` are the exact query distances (tokens from the binding's value to the query's
    ``,``); each sequence asks every distance ``per_distance`` times, with random keys.

    ``layout``:

    - ``"header"``: the ``n_keys`` bindings form the file's first ``4 n_keys`` tokens (the
      module's picture). Positions of bindings are then fixed, so a pattern that makes the
      first tokens global (``global:4n``) sees every binding by construction.
    - ``"scattered"``: each binding line sits at a random line start anywhere in the file
      (constants defined where they are first needed), its query exactly ``distance`` tokens
      later; ``n_keys`` bindings, the queried ones plus unqueried distractors. No position is
      special, so no fixed pattern sees the bindings by construction.
    """

    seq_len: int = 1024
    n_keys: int = 16
    distances: tuple[int, ...] = (24, 48, 96, 160, 320, 640, 896)
    per_distance: int = 2
    layout: str = "header"

    def __post_init__(self) -> None:
        if self.layout not in ("header", "scattered"):
            raise ValueError(f"layout must be 'header' or 'scattered', got {self.layout!r}")
        if min(self.distances) < 1:
            raise ValueError("distances must be >= 1")
        if self.n_keys < len(self.distances) * self.per_distance:
            raise ValueError(f"{len(self.distances) * self.per_distance} queries need as many keys (each key is asked "
                             f"once); use more keys (n_keys={self.n_keys}) or fewer queries per distance")
        header = 4 * self.n_keys if self.layout == "header" else 4
        if max(self.distances) + header + 8 > self.seq_len:
            raise ValueError(f"distance {max(self.distances)} does not fit in seq_len={self.seq_len} after a "
                             f"{header}-token binding; use a longer sequence or shorter distances")

    @property
    def n_queries(self) -> int:
        """Queries per sequence: every distance ``per_distance`` times."""
        return len(self.distances) * self.per_distance


@dataclass
class RecallBatch:
    """A batch of recall sequences.

    tokens (B, T) int64; targets (B, T) int64, -100 except at query positions; query_pos,
    source_pos, distance, answer, key (B, Q) int64: the position of each query's ``,``, of its
    binding's value token, their difference, the value token id, and the key token id.
    """

    tokens: Tensor
    targets: Tensor
    query_pos: Tensor
    source_pos: Tensor
    distance: Tensor
    answer: Tensor
    key: Tensor


def _place_queries(task: RecallTask, qlen: int, comma: int, gen: torch.Generator) -> list[tuple[int, int, int]]:
    """Header layout: (line start, key index, distance) of each query: non-overlapping, after the
    header, and each key asked at most once (a second query could copy the value from the first
    one's line)."""
    header = 4 * task.n_keys
    wanted = sorted(d for d in task.distances for _ in range(task.per_distance))  # most constrained first
    for _ in range(100):
        taken: list[tuple[int, int]] = []
        used: set[int] = set()
        out = []
        for d in wanted:
            # value of key k sits at 4k + 2; its query's "," at 4k + 2 + d; the line starts `comma` earlier
            keys = [k for k in range(task.n_keys) if k not in used and 4 * k + 2 + d - comma >= header
                    and 4 * k + 2 + d - comma + qlen < task.seq_len]
            for k in torch.tensor(keys, dtype=torch.long)[torch.randperm(len(keys), generator=gen)].tolist():
                start = 4 * k + 2 + d - comma
                if all(start + qlen < a or start > b for a, b in taken):  # at least one filler token between
                    taken.append((start, start + qlen)); used.add(k); out.append((start, k, d))
                    break
            else:
                break
        if len(out) == len(wanted):
            return sorted(out)
    raise ValueError(f"cannot place {len(wanted)} queries at distances {task.distances} with {task.n_keys} keys in "
                     f"{task.seq_len} tokens; use more keys, fewer queries per distance or a longer sequence")


def _place_scattered(task: RecallTask, qlen: int, comma: int,
                     rng: random.Random) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    """Scattered layout: ([(binding line start, key index)], [(query line start, key index, distance)]).

    Queried keys first, longest distance first (the most constrained): the binding's value
    position b is drawn uniformly among the free ones whose query line, at ``b + distance``,
    also fits; then the distractor bindings anywhere free. Lines never touch (at least one
    filler token between). ``rng``: a Python generator seeded from the batch's torch generator.
    """
    T = task.seq_len
    wanted = sorted((d for d in task.distances for _ in range(task.per_distance)), reverse=True)

    for _ in range(100):
        busy = bytearray(T)  # 1 where a task line sits

        def free(a: int, z: int) -> bool:  # [a, z] and one token either side unused
            return 0 <= a and z < T and busy.find(1, max(0, a - 1), z + 2) < 0

        binds: list[tuple[int, int]] = []
        queries: list[tuple[int, int, int]] = []
        for k in range(task.n_keys):
            d = wanted[k] if k < len(wanted) else None
            if d is None:  # a distractor: bound, never asked
                opts = [b for b in range(2, T - 1) if free(b - 2, b + 1)]
            else:
                # binding line [b - 2, b + 1] (value at b); query line [q0, q0 + qlen - 1], q0 = b + d - comma > b + 2
                opts = [b for b in range(2, T - qlen - d + comma + 1)
                        if d - comma > 2 and free(b - 2, b + 1) and free(b + d - comma, b + d - comma + qlen - 1)]
            if not opts:
                break
            b = opts[rng.randrange(len(opts))]
            busy[b - 2 : b + 2] = b"\x01" * 4
            binds.append((b - 2, k))
            if d is not None:
                q0 = b + d - comma
                busy[q0 : q0 + qlen] = b"\x01" * qlen
                queries.append((q0, k, d))
        if len(binds) == task.n_keys:
            return sorted(binds), sorted(queries)
    raise ValueError(f"cannot scatter {task.n_keys} bindings and {len(wanted)} queries at distances {task.distances} "
                     f"in {task.seq_len} tokens; use fewer keys, fewer queries per distance or a longer sequence")


def make_recall_batch(lines: Sequence[list[int]], vocab: RecallVocab, task: RecallTask, batch_size: int,
                      gen: torch.Generator) -> RecallBatch:
    """``batch_size`` sequences: bindings (a header, or scattered), filler lines, queries at exact distances.

    ``lines`` are filler lines in file order (:func:`filler_lines`); each sequence reads them
    consecutively from a random start, so the filler is a contiguous stretch of real code.
    """
    T, qlen, comma = task.seq_len, len(vocab.prefix) + 5, len(vocab.prefix) + 1
    rows, qpos, spos, ans, keys = [], [], [], [], []
    for _ in range(batch_size):
        chosen = torch.randperm(len(vocab.keys), generator=gen)[: task.n_keys].tolist()
        key_ids = [vocab.keys[i] for i in chosen]
        # each value uniform over its key's pool, independent -> without the binding, chance is 1/pool_size
        vals = [vocab.pools[i][int(torch.randint(len(vocab.pools[i]), (1,), generator=gen))] for i in chosen]
        # events: (line start, tokens, query key index or -1)
        events: list[tuple[int, list[int], int]] = []
        if task.layout == "header":
            for k, (kid, v) in enumerate(zip(key_ids, vals)):
                events.append((4 * k, binding_line(vocab, kid, v), -1))
            queries = _place_queries(task, qlen, comma, gen)
        else:
            binds, queries = _place_scattered(task, qlen, comma, random.Random(int(torch.randint(1 << 62, (1,), generator=gen))))
            events += [(start, binding_line(vocab, key_ids[k], vals[k]), -1) for start, k in binds]
        events += [(start, query_line(vocab, key_ids[k], vals[k]), k) for start, k, _ in queries]
        source = {k: (4 * k if task.layout == "header" else dict((kk, st) for st, kk in binds)[k]) + 2
                  for _, k, _ in queries}
        seq: list[int] = []
        nxt = int(torch.randint(len(lines), (1,), generator=gen))
        qp, sp, an, ky = [], [], [], []
        for start, toks, k in sorted(events, key=lambda e: e[0]) + [(T, [], -2)]:
            while len(seq) < start:  # whole filler lines while they fit, then blank lines
                line = lines[nxt % len(lines)]
                if len(seq) + len(line) <= start:
                    seq += line
                    nxt += 1
                else:
                    seq.append(vocab.newline)
            seq += toks
            if k >= 0:
                qp.append(start + comma); sp.append(source[k]); an.append(vals[k]); ky.append(key_ids[k])
        assert len(seq) == T
        order = sorted(range(len(qp)), key=lambda i: qp[i])
        rows.append(seq); qpos.append([qp[i] for i in order]); spos.append([sp[i] for i in order])
        ans.append([an[i] for i in order]); keys.append([ky[i] for i in order])
    qp_t, sp_t, ans_t = torch.tensor(qpos), torch.tensor(spos), torch.tensor(ans)  # (B, Q) each
    targets = torch.full((batch_size, T), -100, dtype=torch.long)  # (B, T)
    targets.scatter_(1, qp_t, ans_t)
    return RecallBatch(torch.tensor(rows), targets, qp_t, sp_t, qp_t - sp_t, ans_t, torch.tensor(keys))


def window_baseline(batch: RecallBatch, vocab: RecallVocab, window: int) -> Tensor:
    """The best a reader of the last ``window`` tokens can do: (B, Q) predicted value ids.

    If ``KEY = v`` lies wholly inside the window before the query's ``,``, copy v; otherwise
    guess the first value of the key's pool (any guess is at chance: values are independent of
    everything but their binding).
    """
    first = {k: pool[0] for k, pool in zip(vocab.keys, vocab.pools)}
    out = batch.key.clone().apply_(lambda k: first[k])  # (B, Q)
    for b in range(batch.tokens.shape[0]):
        row = batch.tokens[b].tolist()
        for j, (q, key) in enumerate(zip(batch.query_pos[b].tolist(), batch.key[b].tolist())):
            lo = max(0, q - window + 1)  # the window holds positions q - w + 1 .. q
            for i in range(q - 2, lo - 1, -1):
                if row[i] == key and row[i + 1] == vocab.assign and i + 2 <= q:
                    out[b, j] = row[i + 2]
                    break
    return out


def reach(patterns: Sequence[str | AttentionPattern], n: int) -> Tensor:
    """(n, n) bool: can position i read position j through the stacked layers' patterns?

    Layer masks M_1..M_L (causal, the diagonal always allowed); reach = M_L @ ... @ M_1 > 0
    (the residual stream keeps what a position already holds, which the diagonal encodes).
    """
    r = torch.eye(n)  # (n, n)
    for p in patterns:
        m = parse_pattern(p).mask(n).float()  # (n, n)
        # R_l = (M_l R_{l-1} > 0): i reads j if it reads some k that already read j
        r = ((m @ r) > 0).float()
    return r.bool()


def reach_at(r: Tensor, src: Tensor, dist: Tensor) -> Tensor:
    """Reachability of each query from its source: r[src + dist, src] for (..) int tensors."""
    return r[src + dist, src]


def window_reach(n_layers: int, window: int) -> int:
    """Furthest distance a window-only stack reaches: L hops of at most w - 1 tokens."""
    # reach = L * (w - 1)
    return n_layers * (window - 1)


def candidates(vocab: RecallVocab, keys: Tensor) -> Tensor:
    """(..., pool_size) value ids each query chooses among: the pool of its key (..) int64."""
    pools = torch.tensor(vocab.pools)  # (n_keys_pool, P)
    index = {k: i for i, k in enumerate(vocab.keys)}
    return pools[keys.clone().apply_(lambda k: index[k])]  # (..., P)
