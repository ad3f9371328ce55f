"""Choosing the next token from logits: penalties, greedy, temperature, min-p, top-k and top-p
(nucleus), and the log-probabilities a client may ask for.

:class:`SamplingParams` is the one description of how a request is decoded, shared by
:func:`codex_lab.generate`, the engine and the server protocol. The order of one step
(:meth:`SamplingParams.penalize`, then :func:`sample_next`), as vLLM's sampler:

1. ``logit_bias`` is added;
2. :func:`apply_repetition_penalty` over the prompt and the output so far (vLLM's
   ``repetition_penalty``: positive logits divided by it, negative ones multiplied);
3. :func:`apply_penalties` (OpenAI's presence / frequency, over the output so far);
4. ``min_tokens``: end-of-text, ``stop_token_ids`` and the other ending ids get -inf while
   fewer than ``min_tokens`` tokens were generated;
5. :func:`min_p_filter` on the temperature-scaled distribution (vLLM V1's order: before top-k / top-p);
6. greedy, or temperature + top-k + top-p sampling (:func:`sample_next`).

:func:`token_logprobs` reports the model's own distribution (log-softmax of the raw logits,
before penalties and temperature), as vLLM and the OpenAI API do: logprobs keep the raw
tokens, special ones included, whatever the text shows.

Special tokens and the text (``skip_special_tokens``, default true as in vLLM): the FIM
sentinels, task tags, ``<|answer|>``, pad and end-of-text are left out of the text of an
answer (server, :func:`codex_lab.generate` and ``codex-lab generate`` alike); the token ids
and logprobs keep them. Outside fill-in-the-middle (a request without ``suffix`` whose prompt
holds no sentinel) a generated FIM sentinel **ends the answer** like end-of-text
(``finish_reason="stop"``; :data:`FIM_SENTINELS`): plain training documents never contain
one, so a sampled sentinel means the model has left plain continuation for a FIM layout
whose next part is not a continuation of the prompt. Ending rather than masking keeps the
common request on the engine's batched sampling path (a mask would be a per-step logits
edit on every row); ``min_tokens`` holds the sentinels back like end-of-text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import torch
from torch import Tensor

from codex_lab.data.fim import SENTINELS

# temperatures below this are greedy: logits / 1e-38 overflow float32 to inf and softmax gives NaN
GREEDY_BELOW = 1e-6

# the tokens that end an answer outside fill-in-the-middle (see the module's docstring): the data
# layer's FIM sentinels, the one definition the exporters' stop tokens read too
FIM_SENTINELS = SENTINELS

# repetition_penalty's range: vLLM asks only > 0; below 1e-4 a logit of ~10 divided by it
# nears float32's range once a temperature of 1e-6 divides it again, so the floor is here
REPETITION_PENALTY_RANGE = (1e-4, 100.0)


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits per row, set the rest to -inf. logits: (B, V)."""
    if k <= 0 or k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep the smallest set of tokens whose probability mass reaches p (nucleus sampling).

    The most likely token is always kept. logits: (B, V).
    """
    if p >= 1.0:
        return logits
    if p <= 0.0:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    # drop token i when the mass strictly before it already reaches p: cumsum_i - p_i >= p
    drop = probs.cumsum(dim=-1) - probs >= p  # (B, V)
    drop[..., 0] = False  # the most likely token stays even when p rounds to 0 in float32 (p = 5e-324)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick one token per row. logits (B, V) -> ids (B,).

    temperature below ``GREEDY_BELOW`` (1e-6, 0 included) means greedy (argmax); otherwise
    softmax(logits / temperature) after the top-k and top-p filters, sampled with
    ``generator`` (same seed, same tokens).
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature < GREEDY_BELOW:
        return logits.argmax(dim=-1)
    logits = top_p_filter(top_k_filter(logits.float() / temperature, top_k), top_p)
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    if generator is not None and generator.device != probs.device:
        probs = probs.cpu()
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)


def min_p_filter(logits: Tensor, min_p: float, temperature: float = 1.0) -> Tensor:
    """Keep the tokens whose probability is at least ``min_p`` times the most likely one's
    (vLLM's ``min_p``), set the others to -inf. logits (B, V) or (V,).

    The probabilities are those sampled: ``softmax(logits / temperature)``. ``min_p`` 0 (or a
    greedy temperature) changes nothing; the most likely token is always kept.
    """
    if min_p <= 0.0 or temperature < GREEDY_BELOW:
        return logits
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (..., V)
    # keep t when p_t >= min_p * max_t' p_t'
    drop = probs < min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(drop, float("-inf"))


def apply_repetition_penalty(logits: Tensor, seen: Sequence[int], penalty: float) -> Tensor:
    """vLLM's (and CTRL's) repetition penalty over the tokens in ``seen`` (prompt + output so far).

    For every token t that occurs in ``seen``: ``logit[t] / penalty`` when ``logit[t] > 0``, else
    ``logit[t] * penalty`` (> 1 discourages repeats, < 1 encourages them; once per token, however
    often it occurs). logits (B, V) or (V,); returns new logits.
    """
    if penalty == 1.0 or not seen:
        return logits
    ids = torch.as_tensor(sorted(set(int(t) for t in seen)), dtype=torch.long, device=logits.device)
    x = logits.float()
    picked = x.index_select(-1, ids)  # (..., n)
    picked = torch.where(picked > 0, picked / penalty, picked * penalty)
    return x.index_copy(-1, ids, picked)


def apply_penalties(logits: Tensor, generated: Sequence[int], presence: float, frequency: float) -> Tensor:
    """OpenAI's presence and frequency penalties over the tokens generated so far (not the prompt).

    logits (B, V) or (V,), float; ``generated``: token ids sampled so far for this row (the same
    list for every row). Returns new logits (the input is not modified); unchanged when both
    penalties are 0 or nothing was generated yet.
    """
    if (presence == 0.0 and frequency == 0.0) or not generated:
        return logits
    ids = torch.as_tensor(list(generated), dtype=torch.long, device=logits.device)
    count = torch.bincount(ids, minlength=logits.size(-1)).to(torch.float32)  # (V,) occurrences so far
    # logit[t] -= count[t] * frequency_penalty + (count[t] > 0) * presence_penalty
    penalty = count * frequency + (count > 0).to(torch.float32) * presence  # (V,)
    return logits.float() - penalty


class TokenLogprob(NamedTuple):
    """One generated (or echoed) token's log-probability and the ``k`` most likely alternatives.

    ``logprob``: ln p(token) under log-softmax of the raw logits (nats, <= 0);
    ``top``: up to k (token id, logprob) pairs, most likely first.
    """

    token: int
    logprob: float
    top: list[tuple[int, float]]


def token_logprobs(logits: Tensor, token: int, k: int) -> TokenLogprob:
    """ln p(``token``) and the ``k`` most likely tokens from one row of raw logits (1, V) or (V,)."""
    # log p = logits - logsumexp(logits), in float32 whatever the model's dtype
    logp = torch.log_softmax(logits.reshape(-1).float(), dim=-1)  # (V,)
    top: list[tuple[int, float]] = []
    if k > 0:
        vals, idx = torch.topk(logp, min(k, logp.numel()))
        top = list(zip(idx.tolist(), vals.tolist()))
    return TokenLogprob(int(token), float(logp[token]), top)


# top-p looks at this many most likely tokens first (batched_probs); a full sort only when they hold less than p
NUCLEUS_CANDIDATES = 64

# most alternatives per token a request may ask for (OpenAI's limit for completions is 5; vLLM's 20)
MAX_LOGPROBS = 20


@dataclass
class SamplingParams:
    """How one request is decoded.

    Args:
        max_tokens: most tokens to generate (>= 1).
        temperature: 0 = greedy; otherwise softmax(logits / temperature) is sampled.
        top_k: keep the k most likely tokens (0 = all).
        top_p: keep the smallest set with probability mass >= top_p (1 = all).
        stop: strings that end the generation; the text is cut before the first one.
        seed: per-request random seed (same seed, same output); None = global RNG.
        ignore_eos: keep generating past end-of-text and past the FIM sentinels that otherwise end
            an answer (benchmarks: exactly max_tokens tokens, unless a stop string or
            ``stop_token_ids`` ends it).
        presence_penalty: subtracted once from the logit of every token already generated
            (-2..2, OpenAI's range; positive = talk about new things).
        frequency_penalty: subtracted from a token's logit once per time it was generated (-2..2).
        logit_bias: token id -> value added to its logit at every step (-100..100).
        logprobs: None = none recorded; k >= 0 = record each generated token's log-probability
            and its k most likely alternatives (:func:`token_logprobs`, at most ``MAX_LOGPROBS``).
        min_p: keep only tokens with probability >= min_p x the most likely one's (0..1; 0 = off).
        repetition_penalty: vLLM's: a token already in the prompt or the output has its logit
            divided by it when positive, multiplied when negative (1 = off; > 1 = fewer repeats).
        min_tokens: end-of-text, ``stop_token_ids`` and the ending ids cannot be sampled before
            this many tokens were generated (stop strings do not end the answer before either).
        stop_token_ids: token ids that end the answer (``finish_reason="stop"``); their text is
            not in the answer unless ``include_stop_str_in_output``.
        include_stop_str_in_output: keep the stop string (or stop token's text) that ended the answer.
        skip_special_tokens: leave special tokens (FIM sentinels, task tags, end-of-text, pad)
            out of the text (ids and logprobs keep them); True as in vLLM.
        spaces_between_special_tokens: with ``skip_special_tokens=False``, put one space between a
            special token and the text beside it (vLLM's default True; False = plain concatenation).
        context_ids: the prompt's ids, for ``repetition_penalty`` where the caller passes only the
            output to :meth:`penalize` (the engine); set per prompt by :meth:`for_prompt`.
        end_ids: ids besides ``stop_token_ids`` that end the answer (end-of-text, and the FIM
            sentinels outside fill-in-the-middle): what ``min_tokens`` holds back; set by :meth:`for_prompt`.
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    context_ids: tuple[int, ...] = ()
    end_ids: tuple[int, ...] = ()

    @property
    def penalized(self) -> bool:
        """True when :meth:`penalize` may change the logits: a logit bias, a presence, frequency
        or repetition penalty, ``min_tokens`` or ``min_p`` (when sampling)."""
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or bool(self.logit_bias)
                or self.repetition_penalty != 1.0 or self.min_tokens > 0
                or (self.min_p > 0.0 and self.temperature >= GREEDY_BELOW))

    def for_prompt(self, prompt_ids: Sequence[int], *, eos_id: int | None = None,
                   end_ids: Sequence[int] = ()) -> "SamplingParams":
        """A copy for one prompt: ``context_ids`` (for ``repetition_penalty``) and ``end_ids``
        (``eos_id`` and ``end_ids``, none with ``ignore_eos``: what ``min_tokens`` holds back)."""
        from dataclasses import replace

        ends = [] if self.ignore_eos else ([] if eos_id is None else [int(eos_id)]) + [int(t) for t in end_ids]
        ctx = tuple(int(t) for t in prompt_ids) if self.repetition_penalty != 1.0 else ()
        return replace(self, context_ids=ctx, end_ids=tuple(dict.fromkeys(ends)))

    def penalize(self, logits: Tensor, generated: Sequence[int], context: Sequence[int] | None = None) -> Tensor:
        """``logits`` (B, V) after steps 1-5 of the module's docstring: logit bias, repetition
        penalty over ``context`` (default ``context_ids``: the prompt) + ``generated``, presence
        and frequency penalties over ``generated``, ``min_tokens`` and ``min_p``."""
        if self.logit_bias:
            ids = torch.tensor(list(self.logit_bias), dtype=torch.long, device=logits.device)
            bias = torch.tensor(list(self.logit_bias.values()), dtype=torch.float32, device=logits.device)
            # logit[t] += logit_bias[t] (OpenAI: -100 bans a token, +100 forces it)
            logits = logits.float().index_add(-1, ids, bias.expand(*logits.shape[:-1], -1))
        if self.repetition_penalty != 1.0:
            seen = list(self.context_ids if context is None else context) + list(generated)
            logits = apply_repetition_penalty(logits, seen, self.repetition_penalty)
        logits = apply_penalties(logits, generated, self.presence_penalty, self.frequency_penalty)
        if self.min_tokens > 0 and len(generated) < self.min_tokens:
            held = sorted({t for t in (*self.end_ids, *self.stop_token_ids) if 0 <= t < logits.size(-1)})
            if held:  # not yet: nothing that would end the answer may be sampled
                logits = logits.float().index_fill(-1, torch.tensor(held, dtype=torch.long, device=logits.device),
                                                   float("-inf"))
        return min_p_filter(logits, self.min_p, self.temperature)

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = no limit), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not -2.0 <= v <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {v}")
        bad = {t: b for t, b in self.logit_bias.items() if t < 0 or not -100.0 <= b <= 100.0}
        if bad:
            raise ValueError(f"logit_bias needs token ids >= 0 and biases in [-100, 100], got {bad}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in 0..{MAX_LOGPROBS} (alternatives per token), got {self.logprobs}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        lo, hi = REPETITION_PENALTY_RANGE
        if not lo <= self.repetition_penalty <= hi:
            raise ValueError(f"repetition_penalty must be in [{lo:g}, {hi:g}] (1 = off), got {self.repetition_penalty}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be in 0..max_tokens ({self.max_tokens}), got {self.min_tokens}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be token ids >= 0, got {self.stop_token_ids}")


def params_from(
    params: SamplingParams | None,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
) -> SamplingParams:
    """``params`` itself, or the :class:`SamplingParams` the keyword arguments describe.

    Lets a generator take one ``SamplingParams`` while the older keyword form keeps working
    (``max_new_tokens`` is the keyword name of ``max_tokens``). Given both, ``params`` wins.
    """
    if params is not None:
        return params
    return SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                          stop=list(stop), seed=seed)


def batched_probs(logits: Tensor, temperature: Sequence[float], top_k: Sequence[int], top_p: Sequence[float]) -> Tensor:
    """The sampling distribution of several rows at once, each with its own parameters.

    logits (B, V) -> probs (B, V): row b is ``softmax(top_p(top_k(logits_b / T_b)))``, what
    :func:`sample_next` samples from for that row alone (the reference path; tests hold the
    two equal). One sort for the whole batch instead of one per row: in the engine's decode
    step the per-row sorts of top-p were a third of the step (8 rows, 4k vocabulary).
    Every temperature must be >= ``GREEDY_BELOW`` (greedy rows take the argmax instead).
    """
    B, V = logits.shape
    temps = torch.tensor(list(temperature), dtype=torch.float32, device=logits.device)[:, None]  # (B, 1)
    if bool((temps < GREEDY_BELOW).any()):
        raise ValueError("batched_probs takes sampled rows only; greedy rows (temperature < 1e-6) take the argmax")
    # z = logits / T, per row
    z = logits.float() / temps  # (B, V)
    ks = torch.tensor([k if 0 < k < V else V for k in top_k], dtype=torch.long, device=logits.device)  # (B,)
    if bool((ks < V).any()):
        kmax = int(ks.max())
        top = torch.topk(z, kmax, dim=-1).values  # (B, kmax), descending
        kth = top.gather(-1, (ks.clamp(max=kmax) - 1)[:, None])  # (B, 1): each row's k-th largest
        z = torch.where((ks < V)[:, None] & (z < kth), torch.full_like(z, float("-inf")), z)
    ps = torch.tensor(list(top_p), dtype=torch.float32, device=logits.device)[:, None]  # (B, 1)
    if bool((ps < 1.0).any()):
        # most nuclei are small: the NUCLEUS_CANDIDATES most likely tokens usually hold mass p,
        # and then nothing past them can be kept (their mass before is already >= p): a top-k
        # instead of a full sort of the vocabulary; the full sort where they do not
        kc = min(V, NUCLEUS_CANDIDATES)
        vals, idx = torch.topk(z, kc, dim=-1)  # (B, kc), descending
        # p_i = exp(z_i - logsumexp(z)) for the candidates, and their running mass
        cand = torch.exp(vals - torch.logsumexp(z, dim=-1, keepdim=True))  # (B, kc)
        if bool(((cand.sum(dim=-1, keepdim=True) >= ps) | (ps >= 1.0)).all()) and kc < V:
            drop = (cand.cumsum(dim=-1) - cand >= ps) & (ps < 1.0)  # (B, kc)
            drop[:, 0] = False
            keep = torch.full_like(z, float("-inf")).scatter(-1, idx, vals.masked_fill(drop, float("-inf")))
            z = torch.where(ps < 1.0, keep, z)
            return torch.softmax(z, dim=-1)  # (B, V)
        sorted_z, order = torch.sort(z, dim=-1, descending=True)  # (B, V)
        probs = torch.softmax(sorted_z, dim=-1)
        # drop token i when the mass strictly before it already reaches p: cumsum_i - p_i >= p
        drop = (probs.cumsum(dim=-1) - probs >= ps) & (ps < 1.0)  # (B, V)
        drop[:, 0] = False  # the most likely token always stays
        z = torch.full_like(z, float("-inf")).scatter(-1, order, sorted_z.masked_fill(drop, float("-inf")))
    return torch.softmax(z, dim=-1)  # (B, V)
