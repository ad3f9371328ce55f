"""Text generation: ONE path, prefill + :func:`decode_step`, over any cache kind.

:func:`stream_tokens` is the only decoding loop of the package. It feeds the prompt once
(prefill), then one new token per forward (decode), and yields each sampled token:

- ``cache="static"`` (default of the cached names) or ``"dynamic"``: the keys/values of
  earlier tokens are kept, so a decode step is a forward of length 1;
- ``cache=None``: no cache; every step re-runs the whole context (cropped to the model's
  ``max_seq_len``). Obviously correct and slow on purpose: the reference the cached kinds
  are tested against, token for token. This is the default of :func:`generate_ids`.

:func:`generate_ids`, :func:`generate`, :func:`generate_ids_cached` and
:func:`generate_batch_cached` are the public shapes of that one loop; speculative decoding,
the engine, the gates and the benches call :func:`decode_step` for their own forwards.
How the next token is chosen is one :class:`~codex_lab.infer.sampling.SamplingParams`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.data.fim import sentinel_ids
from codex_lab.infer.sampling import SamplingParams, params_from, sample_next
from codex_lab.nn.kv_cache import DynamicKVCache, make_static_caches
from codex_lab.nn.model import CodexModel

CACHE_KINDS = ("static", "dynamic")


def make_caches(model: CodexModel, batch_size: int, max_len: int, kind: str = "static", *, rolling: bool = True) -> list:
    """Per-layer KV caches of ``kind`` for ``batch_size`` rows of up to ``max_len`` tokens.

    "static": preallocated (rolling buffers for window layers unless ``rolling=False``, which
    speculative decoding needs to roll back), the fast path; "dynamic": grow by
    concatenation, the reference.
    """
    if kind == "static":
        p = next(model.parameters())
        return make_static_caches(model.cfg, batch_size, max_len, rolling=rolling, device=p.device, dtype=p.dtype)
    if kind == "dynamic":
        return [DynamicKVCache() for _ in range(model.cfg.n_layer)]
    raise ValueError(f"cache kind {kind!r}; choose one of {CACHE_KINDS}")


def cached_logits(
    model: Callable[..., Any], tokens: Tensor, positions: Tensor | None, caches: Sequence[Any] | None, *, last_only: bool = True
) -> Tensor:
    """The one forward of generation: ``tokens`` (B, T) at ``positions`` (B, T), appending
    their keys/values to ``caches``. Returns logits (B, 1, V), or (B, T, V) with
    ``last_only=False`` (speculative decoding checks every guess at once).

    ``caches=None`` with ``positions=None`` is the plain causal forward of the whole context.
    """
    return model(tokens, positions=positions, caches=caches, last_only=last_only).logits


def decode_step(
    model: Callable[..., Any], tokens: Tensor, positions: Tensor | None, caches: Sequence[Any] | None
) -> Tensor:
    """One cached forward: feed ``tokens`` (B, T) at ``positions`` (B, T), append their
    keys/values to ``caches``, return the logits of the last position (B, V).

    Prefill is a decode step with the whole prompt (T = prompt length); each later step
    feeds one token (T = 1). ``model`` may be a compiled forward of the model. Without a
    cache (``caches=None``, ``positions=None``) ``tokens`` must be the whole context.
    """
    return cached_logits(model, tokens, positions, caches)[:, -1]  # (B, V)


def compiled_forward(model: CodexModel) -> Callable[..., object]:
    """``torch.compile`` of the model's forward (opt-in; first call compiles for seconds)."""
    return torch.compile(model, dynamic=True)


def _check_prompt(prompts: Tensor, max_new_tokens: int) -> None:
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if prompts.dim() != 2 or prompts.shape[1] == 0:
        raise ValueError(f"prompts must be (B, T) with T >= 1, got shape {tuple(prompts.shape)}; give at least one token")


@torch.no_grad()
def stream_tokens(
    model: CodexModel,
    prompts: Tensor,
    params: SamplingParams,
    *,
    cache: str | None = "static",
    generator: torch.Generator | None = None,
    forward: Callable[..., object] | None = None,
) -> Iterator[Tensor]:
    """Yield ``params.max_tokens`` new tokens (B,) after equal-length ``prompts`` (B, T).

    The one decoding loop: prefill, then :func:`decode_step` per token, sampling with
    ``params`` (temperature / top-k / top-p; ``generator`` seeds it). ``cache`` is a kind of
    :data:`CACHE_KINDS` or ``None`` (re-run the cropped context each step, the reference), or
    ``"aot"``: the same step compiled ahead of time over a static cache (a CPU; the first call
    for a model builds its package, tens of seconds, and later ones load it).
    A forward runs only when the next token is asked for, so a consumer that stops early
    (end-of-text) costs no extra forward. ``forward`` replaces ``model`` for the forwards
    (e.g. :func:`compiled_forward`).
    """
    n_new = params.max_tokens
    _check_prompt(prompts, n_new)
    if n_new == 0:
        return
    fwd = model if forward is None else forward
    B, T = prompts.shape
    dev = prompts.device

    generated: list[list[int]] = [[] for _ in range(B)]  # per row, for penalties and min_tokens
    context = prompts.tolist() if params.repetition_penalty != 1.0 else [None] * B  # per row: its prompt

    def pick(logits: Tensor) -> Tensor:  # (B, V) -> (B,)
        if params.penalized:
            logits = torch.stack([params.penalize(logits[b], generated[b], context[b]) for b in range(B)])  # (B, V)
        nxt = sample_next(logits, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, generator=generator)
        if params.penalized:
            for b, t in enumerate(nxt.tolist()):
                generated[b].append(t)
        return nxt

    if cache == "aot":  # the step compiled ahead of time (FastDecoder(compile="aot")): same lines, no dynamo
        yield from _stream_aot(model, prompts, n_new, pick)
        return
    if cache is None:
        idx = prompts  # (B, T)
        for i in range(n_new):
            ctx = idx[:, -model.cfg.max_seq_len :]  # (B, <= L)
            nxt = pick(decode_step(fwd, ctx, None, None))  # (B,)
            yield nxt
            if i + 1 < n_new:
                idx = torch.cat([idx, nxt[:, None]], dim=1)  # (B, T + 1)
        return
    total = T + n_new
    if total > model.cfg.max_seq_len:
        raise ValueError(f"prompt {T} + {n_new} new tokens is past max_seq_len={model.cfg.max_seq_len}")
    caches = make_caches(model, B, total, cache)
    pos = torch.arange(T, device=dev).expand(B, T)  # (B, T)
    logits = decode_step(fwd, prompts, pos, caches)  # (B, V) prefill
    for i in range(n_new):
        nxt = pick(logits)  # (B,)
        yield nxt
        if i + 1 == n_new:
            break
        p = torch.full((B, 1), T + i, device=dev)  # (B, 1) position of the token fed now
        logits = decode_step(fwd, nxt[:, None], p, caches)  # (B, V)


def _stream_aot(model: CodexModel, prompts: Tensor, n_new: int, pick: Callable[[Tensor], Tensor]) -> Iterator[Tensor]:
    """:func:`stream_tokens` through :class:`~codex_lab.infer.fast_decode.FastDecoder`'s static
    cache of the model's ``max_seq_len`` slots (one package per model and batch, kept on disk), its
    decode steps the ahead-of-time package that returns logits, so any sampling picks from them."""
    from codex_lab.infer.fast_decode import FastDecoder

    B, T = prompts.shape
    if T + n_new > model.cfg.max_seq_len:
        raise ValueError(f"prompt {T} + {n_new} new tokens is past max_seq_len={model.cfg.max_seq_len}")
    dec = FastDecoder(model, batch=B, compile="aot")
    logits = dec.prefill_logits(prompts)  # (B, V)
    for i in range(n_new):
        nxt = pick(logits)  # (B,)
        yield nxt
        if i + 1 == n_new:
            break
        logits = dec.decode_logits(nxt[:, None], torch.tensor([T + i], device=prompts.device))  # (B, V)


@dataclass
class Generation:
    """A finished generation: the new text and ids, and why it stopped
    (``"stop"``: end-of-text or a stop string; ``"length"``: max_new_tokens reached)."""

    text: str
    ids: list[int]
    finish_reason: str


@torch.no_grad()
def generate_ids(
    model: CodexModel,
    prompt_ids: Sequence[int],
    params: SamplingParams | None = None,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_id: int | None = None,
    cache: str | None = None,
) -> tuple[list[int], str]:
    """New token ids after ``prompt_ids`` and the finish reason ("stop" at ``eos_id`` or one of
    ``params.stop_token_ids``, else "length"); the ending token is not among the ids.

    Sampling is ``params`` (or the keyword arguments when it is None); ``seed`` /
    ``params.seed`` seeds a private generator (same seed, same tokens). ``cache=None``
    (default) re-runs the context each step and crops it to the last ``max_seq_len``
    tokens; with a cache kind, prompt + new tokens must fit ``max_seq_len``. ``min_tokens``
    holds back ``eos_id`` and the stop ids before that many tokens.
    """
    ids, reason, _ = _generate_ids(model, prompt_ids, params_from(
        params, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
        eos_id=eos_id, cache=cache)
    return ids, reason


def _generate_ids(model: CodexModel, prompt_ids: Sequence[int], sp: SamplingParams, *, eos_id: int | None,
                  cache: str | None, end_ids: Sequence[int] = ()) -> tuple[list[int], str, int | None]:
    """:func:`generate_ids` that also ends at ``end_ids`` and returns the token that ended it (or None)."""
    if not prompt_ids:
        raise ValueError("the prompt is empty; give at least one token")
    if sp.ignore_eos:
        eos_id = None
    sp = sp.for_prompt(prompt_ids, eos_id=eos_id, end_ids=end_ids)
    ends = set(sp.end_ids) | set(sp.stop_token_ids)
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(sp.seed) if sp.seed is not None else None
    idx = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)  # (1, T)
    out: list[int] = []
    for nxt in stream_tokens(model, idx, sp, cache=cache, generator=gen):
        tok = int(nxt.item())
        if tok in ends:
            return out, "stop", tok
        out.append(tok)
    return out, "length", None


def special_ids(tokenizer: CodeTokenizer) -> set[int]:
    """Ids of the tokenizer's special tokens (end-of-text, pad, FIM sentinels, task tags, ...)."""
    got = getattr(tokenizer, "_special_ids", None)
    if got is None:
        got = {i for i, t in tokenizer.tok.get_added_tokens_decoder().items() if t.special}
        try:
            tokenizer._special_ids = got  # type: ignore[attr-defined]  (asked per request: computed once)
        except AttributeError:
            pass
    return got


def fim_sentinel_ids(tokenizer: CodeTokenizer) -> list[int]:
    """Ids of the FIM sentinels the tokenizer has (:func:`codex_lab.data.fim.sentinel_ids`, the
    one definition the exporters' stop tokens also read)."""
    return sentinel_ids(tokenizer)


def answer_end_ids(tokenizer: CodeTokenizer, prompt_ids: Sequence[int], fim: bool = False) -> list[int]:
    """The FIM sentinels when they end an answer: outside fill-in-the-middle (``fim`` False and no
    sentinel in the prompt), else none (see :mod:`codex_lab.infer.sampling`)."""
    sentinels = fim_sentinel_ids(tokenizer)
    if fim or any(t in sentinels for t in prompt_ids):
        return []
    return sentinels


def output_text(tokenizer: CodeTokenizer, ids: Sequence[int], skip_special_tokens: bool = True,
                spaces_between_special_tokens: bool = True) -> str:
    """The text of generated ``ids`` as an answer shows it (vLLM's conventions).

    ``skip_special_tokens``: special tokens leave no text. Otherwise each special token is
    its own piece, and with ``spaces_between_special_tokens`` the pieces (special tokens and
    the runs of text between them) are joined with one space, as vLLM joins them.
    """
    ids = list(ids)
    if skip_special_tokens:
        return tokenizer.decode(ids, skip_special_tokens=True)
    special = special_ids(tokenizer)
    if not spaces_between_special_tokens or not any(t in special for t in ids):
        return tokenizer.decode(ids)
    pieces, run = [], []  # type: ignore[var-annotated]
    for t in ids:
        if t in special:
            if run:
                pieces.append(tokenizer.decode(run))
                run = []
            pieces.append(tokenizer.decode([t]))
        else:
            run.append(t)
    if run:
        pieces.append(tokenizer.decode(run))
    return " ".join(pieces)


def generate_ids_cached(
    model: CodexModel, prompt_ids: Sequence[int], params: SamplingParams | None = None, *, cache: str = "static", **kw: Any
) -> tuple[list[int], str]:
    """:func:`generate_ids` with a KV cache (``cache``: "static" or "dynamic"); same tokens."""
    return generate_ids(model, prompt_ids, params, cache=cache, **kw)


@torch.no_grad()
def generate_batch_cached(
    model: CodexModel,
    prompts: Tensor,
    params: SamplingParams | None = None,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    cache: str | None = "static",
    forward: Callable[..., object] | None = None,
) -> Tensor:
    """New tokens (B, max_new_tokens) after equal-length ``prompts`` (B, T).

    No early stop: every row gets ``max_new_tokens`` tokens (static batching).
    ``forward`` replaces ``model`` for the forward passes (e.g. :func:`compiled_forward`).
    """
    sp = params_from(params, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p)
    _check_prompt(prompts, sp.max_tokens)
    out = torch.empty(prompts.shape[0], sp.max_tokens, dtype=torch.long, device=prompts.device)  # (B, N)
    for i, nxt in enumerate(stream_tokens(model, prompts, sp, cache=cache, generator=generator, forward=forward)):
        out[:, i] = nxt
    return out


def generate(
    model: CodexModel,
    tokenizer: CodeTokenizer,
    prompt: str,
    params: SamplingParams | None = None,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
    cache: str | None = "static",
) -> Generation:
    """Continue ``prompt``; greedy when temperature is 0, seeded sampling otherwise.

    ``cache``: the KV cache kind (default ``"static"``: one forward per new token; ``None``
    re-runs the whole context every token, the reference loop, ~2.5x slower at 128 tokens on
    the shipped model). Greedy text is the same either way (``tests/test_kv_cache.py``); for
    the compiled fixed-shape decoder, see :class:`codex_lab.infer.fast_decode.FastDecoder`.

    Generation ends at end-of-text, at a ``stop_token_ids`` id, at a FIM sentinel when the
    prompt holds none (:mod:`codex_lab.infer.sampling`), at the first of the stop strings
    (cut from the text, unless ``include_stop_str_in_output``; not before ``min_tokens``
    tokens), or after ``max_new_tokens`` (``params.max_tokens``). ``ids`` are the raw tokens
    before the ending one; ``text`` follows ``skip_special_tokens`` (default: no special token
    in it) and ``spaces_between_special_tokens``.
    """
    sp = params_from(params, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop)
    was_training = model.training
    prompt_ids = tokenizer.encode(prompt)
    model.eval()
    try:
        ids, reason, end = _generate_ids(model, prompt_ids, sp, eos_id=tokenizer.eot_id, cache=cache,
                                         end_ids=answer_end_ids(tokenizer, prompt_ids))
    finally:
        model.train(was_training)
    shown = ids + [end] if end is not None and sp.include_stop_str_in_output else ids
    text = output_text(tokenizer, shown, sp.skip_special_tokens, sp.spaces_between_special_tokens)
    # stop strings count from the text of token min_tokens on (before it they do not end the answer)
    floor = len(output_text(tokenizer, ids[: sp.min_tokens - 1], sp.skip_special_tokens,
                            sp.spaces_between_special_tokens)) if sp.min_tokens > 1 else 0
    cut, s = find_stop(text, sp.stop, floor)
    if cut >= 0:
        text, reason = text[: cut + (len(s) if sp.include_stop_str_in_output else 0)], "stop"
    return Generation(text=text, ids=ids, finish_reason=reason)


def find_stop(text: str, stop: Sequence[str], floor: int = 0) -> tuple[int, str]:
    """Where the first stop string of ``text`` starts and which it is ((-1, "") when none); a
    match must end after character ``floor`` (``min_tokens``: text before it cannot stop)."""
    best, which = -1, ""
    for s in stop:
        if not s:
            continue
        at = text.find(s, max(0, floor - len(s) + 1))
        if at >= 0 and (best < 0 or at < best):
            best, which = at, s
    return best, which
