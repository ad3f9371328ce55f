"""The OpenAI completions wire format: request validation and error bodies.

Kept apart from the server so that every rule about bad input is in one small, testable
place. Each rejection is an :class:`ApiError` whose body has the OpenAI error shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}

Hostile input (deep nesting, 5,000-digit integers, lone surrogates, numbers too large for a
float, seeds outside 64 bits) is refused here with a 400, never crashes the server.

The error type, the limits and the checks of one field are :mod:`codex_lab.serve.api_errors`;
the text a completion may send and its finish reason, :mod:`codex_lab.serve.output_text`. This
module validates the completions request itself and re-exports their names.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from codex_lab.data.tokenizer import CodeTokenizer
from codex_lab.infer.sampling import MAX_LOGPROBS, REPETITION_PENALTY_RANGE, SamplingParams
from codex_lab.serve.api_errors import NO_TOKEN_CAP, ApiError, Limits, _brief, _number, _typed, check_fields, valid_text

# the body fields of POST /v1/completions: OpenAI's, then vLLM's sampling extensions served here
COMPLETION_FIELDS = (
    "model", "prompt", "suffix", "max_tokens", "temperature", "top_p", "n", "best_of", "stream", "stream_options",
    "logprobs", "echo", "stop", "presence_penalty", "frequency_penalty", "logit_bias", "seed", "user",
    "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
    "include_stop_str_in_output", "prompt_logprobs", "skip_special_tokens", "spaces_between_special_tokens",
)
TOKENIZE_FIELDS = ("model", "prompt", "add_special_tokens", "return_token_strs")
MAX_STOP_TOKEN_IDS = 64


@dataclass
class CompletionRequest:
    """A validated ``POST /v1/completions`` body.

    ``prompts``: every prompt of the batch as token ids (``prompt_ids`` is the one an engine
    request decodes: :meth:`for_prompt` makes one per prompt). ``n`` choices are returned per
    prompt, the best ``n`` of ``best_of`` samples by cumulative logprob. ``max_tokens`` may be
    0 only with ``echo`` (score the prompt, generate nothing).
    """

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    stream: bool = False
    version: str | None = None  # pinned with model="name@version"
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    prompts: list[list[int]] = field(default_factory=list)
    n: int = 1
    best_of: int = 1
    logprobs: int | None = None  # alternatives per token (0..MAX_LOGPROBS); None = no logprobs
    echo: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    fim: bool = False  # the prompt was built from prompt + suffix (fill-in-the-middle)
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    prompt_logprobs: int | None = None  # vLLM's: each prompt token's logprob and this many alternatives
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    max_tokens_auto: bool = False  # max_tokens not given: each prompt gets what the context leaves (max_tokens_cap at most)
    max_tokens_cap: int = NO_TOKEN_CAP
    context_len: int = 1024
    prompt_lp: list | None = field(default=None, repr=False, compare=False)  # prompt_logprobs once computed

    def __post_init__(self) -> None:
        if not self.prompts:
            self.prompts = [list(self.prompt_ids)]

    def for_prompt(self, i: int) -> "CompletionRequest":
        """The same request for prompt ``i`` alone (what one engine request decodes)."""
        return replace(self, prompt_ids=list(self.prompts[i]), prompts=[list(self.prompts[i])])

    def sampling_params(self, sample: int = 0) -> SamplingParams:
        """The engine's :class:`~codex_lab.infer.sampling.SamplingParams` for sample ``sample`` of a
        prompt (0..best_of-1): a seeded request gives sample j the seed ``seed + j`` (wrapped into
        64 bits), so the samples differ and the answer is reproducible. Logprobs are recorded
        when asked for, and for ranking when ``best_of > n``."""
        seed = None if self.seed is None else (self.seed + sample - SEED_MIN) % 2**64 + SEED_MIN
        lp = self.logprobs if self.logprobs is not None else (0 if self.best_of > self.n else None)
        return SamplingParams(max_tokens=max(self.max_tokens, 1), temperature=self.temperature, top_k=self.top_k,
                              top_p=self.top_p, stop=list(self.stop), seed=seed, logprobs=lp,
                              presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                              logit_bias=dict(self.logit_bias), min_p=self.min_p,
                              repetition_penalty=self.repetition_penalty, min_tokens=self.min_tokens,
                              ignore_eos=self.ignore_eos, stop_token_ids=list(self.stop_token_ids),
                              include_stop_str_in_output=self.include_stop_str_in_output,
                              skip_special_tokens=self.skip_special_tokens,
                              spaces_between_special_tokens=self.spaces_between_special_tokens)

    def own_max_tokens(self) -> int:
        """``max_tokens`` of this request's (first) prompt: the one given, or what the context leaves."""
        if not self.max_tokens_auto:
            return self.max_tokens
        return min(self.max_tokens_cap, self.context_len - len(self.prompt_ids))

    def engine_params(self, params: SamplingParams, eos_id: int, end_ids: list[int]) -> SamplingParams:
        """``params`` as the engine runs them for this one-prompt request (:meth:`for_prompt`):
        its own ``max_tokens``, its prompt as the repetition penalty's context, ``eos_id`` and
        ``end_ids`` held back by ``min_tokens``, and no stop strings: the server finds those
        in the text it sends (which skips special tokens), and ``min_tokens`` delays them."""
        out = params.for_prompt(self.prompt_ids, eos_id=eos_id, end_ids=end_ids)
        return replace(out, max_tokens=max(self.own_max_tokens(), 1), stop=[])


# torch.Generator.manual_seed takes a 64-bit seed: -2**63 .. 2**64 - 1
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def parse_completion(body: dict[str, Any], tokenizer: CodeTokenizer, limits: Limits,
                     model_name: str, versions: list[str], fim_format: str | None = None) -> CompletionRequest:
    """Validate an OpenAI completions body; raise :class:`ApiError` naming the field and the fix.

    ``fim_format``: the served checkpoint's FIM prompt format ("psm" / "spm") when it was
    trained for fill-in-the-middle, else None (then ``suffix`` is refused with a 400).
    """
    check_fields(body, COMPLETION_FIELDS, limits)
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, f"'model' is required and must be a string; use {model_name!r}", param="model",
                       code="missing_field" if model is None else "invalid_type")
    name, _, version = valid_text(model, "model").partition("@")
    if name != model_name or (version and version not in versions):
        known = [model_name] + [f"{model_name}@{v}" for v in versions]
        raise ApiError(404, f"the model {_brief(model)} does not exist; served: {known}", param="model",
                       code="model_not_found", kind="not_found")
    prompts = _prompts(body.get("prompt"), tokenizer)
    suffix = body.get("suffix")
    fim = suffix is not None
    if fim:
        prompts = _fim_prompts(body, prompts, suffix, tokenizer, fim_format)
    echo = _typed(body, "echo", (bool,), False, "true or false")
    max_tokens = _typed(body, "max_tokens", (int,), limits.default_max_tokens, "an integer")
    cap = min(limits.max_tokens, limits.max_seq_len)
    auto = max_tokens is None
    if auto:  # vLLM's default: what the context leaves after the (longest) prompt, within the operator's cap
        max_tokens = max(1, min(cap, limits.max_seq_len - max(len(ids) for ids in prompts)))
    lo = 0 if echo else 1
    if not lo <= max_tokens <= cap:
        hint = "" if echo else " (0 is allowed with echo=true: score the prompt only)"
        who = "the server's --max-tokens" if limits.max_tokens < limits.max_seq_len else "the model's context"
        raise ApiError(400, f"'max_tokens' must be in {lo}..{cap} ({who}){hint}, got {_brief(max_tokens)}",
                       param="max_tokens")
    for i, ids in enumerate(prompts):
        if len(ids) + max_tokens > limits.max_seq_len:
            which = f"prompt {i}" if len(prompts) > 1 else "the prompt"
            raise ApiError(400, f"{which} has {len(ids)} tokens and max_tokens is {max_tokens}: together more than "
                                f"the model's context of {limits.max_seq_len} tokens; shorten the prompt or lower "
                                "max_tokens", param="prompt", code="context_length_exceeded")
    temperature = _number(body, "temperature", 0.0)
    if not 0.0 <= temperature <= 2.0:
        raise ApiError(400, f"'temperature' must be in [0, 2], got {temperature}", param="temperature")
    top_p = _number(body, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise ApiError(400, f"'top_p' must be in (0, 1], got {top_p}", param="top_p")
    top_k = _typed(body, "top_k", (int,), 0, "an integer (0 = off)")
    if top_k < 0:
        raise ApiError(400, f"'top_k' must be >= 0, got {_brief(top_k)}", param="top_k")
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > limits.max_stop:
        raise ApiError(400, f"'stop' must be a non-empty string or a list of at most {limits.max_stop}", param="stop")
    stop = [valid_text(s, "stop") for s in stop]
    seed = _typed(body, "seed", (int,), None, "an integer")
    if seed is not None and not SEED_MIN <= seed <= SEED_MAX:
        raise ApiError(400, f"'seed' must be in [-2**63, 2**64 - 1], got {_brief(seed)}", param="seed")
    stream = _typed(body, "stream", (bool,), False, "true or false")
    options = _typed(body, "stream_options", (dict,), None, "an object such as {\"include_usage\": true}")
    include_usage = False
    if options is not None:
        if not stream:
            raise ApiError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")
        include_usage = _typed(options, "include_usage", (bool,), False, "true or false")
    n = _typed(body, "n", (int,), 1, "an integer")
    best_of = _typed(body, "best_of", (int,), n, "an integer")
    if n < 1:
        raise ApiError(400, f"'n' must be >= 1, got {_brief(n)}", param="n")
    if best_of < n:
        raise ApiError(400, f"'best_of' ({_brief(best_of)}) must be >= 'n' ({n})", param="best_of")
    if len(prompts) * best_of > limits.max_choices:
        raise ApiError(400, f"{len(prompts)} prompt(s) x best_of {best_of} = {len(prompts) * best_of} samples; the limit "
                            f"is {limits.max_choices} per request: send fewer prompts or a smaller n / best_of",
                       param="best_of" if best_of > n else "n")
    if stream and best_of > n:
        raise ApiError(400, "'best_of' must equal 'n' when streaming (the best samples are known only at the end); "
                            "drop best_of or stream=false", param="best_of")
    if max_tokens == 0 and (n > 1 or best_of > 1):
        raise ApiError(400, "max_tokens=0 (echo only) gives one choice per prompt; drop n and best_of", param="n")
    logprobs = _typed(body, "logprobs", (int,), None, f"an integer 0..{MAX_LOGPROBS}")
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise ApiError(400, f"'logprobs' must be in 0..{MAX_LOGPROBS} (alternatives per token), got {_brief(logprobs)}",
                       param="logprobs")
    if echo and fim:
        raise ApiError(400, "'echo' cannot be combined with 'suffix' (the prompt is rebuilt for fill-in-the-middle)",
                       param="echo")
    penalties = {}
    for name in ("presence_penalty", "frequency_penalty"):
        penalties[name] = _number(body, name, 0.0)
        if not -2.0 <= penalties[name] <= 2.0:
            raise ApiError(400, f"'{name}' must be in [-2, 2], got {penalties[name]}", param=name)
    bias = _typed(body, "logit_bias", (dict,), {}, 'an object of token id -> bias, e.g. {"50": -100}')
    logit_bias: dict[int, float] = {}
    for key, v in bias.items():
        try:
            t = int(key)
        except ValueError:
            t = -1
        ok_v = isinstance(v, (int, float)) and not isinstance(v, bool) and -100 <= v <= 100  # NaN fails too
        if not 0 <= t < tokenizer.vocab_size or not ok_v:
            raise ApiError(400, f"'logit_bias' maps token ids 0..{tokenizer.vocab_size - 1} to biases in [-100, 100]; "
                                f"got {_brief(key)}: {_brief(v)}", param="logit_bias")
        logit_bias[t] = float(v)
    extras = _vllm_fields(body, tokenizer, max_tokens, echo)
    return CompletionRequest(prompt_ids=prompts[0], max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                             top_k=top_k, stop=stop, seed=seed, stream=stream, version=version or None,
                             include_usage=include_usage, prompts=prompts, n=n, best_of=best_of, logprobs=logprobs,
                             echo=echo, fim=fim, logit_bias=logit_bias, max_tokens_auto=auto, max_tokens_cap=cap,
                             context_len=limits.max_seq_len, **penalties, **extras)


def _vllm_fields(body: dict[str, Any], tokenizer: CodeTokenizer, max_tokens: int, echo: bool) -> dict[str, Any]:
    """vLLM's sampling extensions, each checked against the range vLLM documents (400 naming it)."""
    out: dict[str, Any] = {}
    out["min_p"] = _number(body, "min_p", 0.0)
    if not 0.0 <= out["min_p"] <= 1.0:
        raise ApiError(400, f"'min_p' must be in [0, 1] (0 = off), got {out['min_p']}", param="min_p")
    lo, hi = REPETITION_PENALTY_RANGE
    out["repetition_penalty"] = _number(body, "repetition_penalty", 1.0)
    if not lo <= out["repetition_penalty"] <= hi:
        raise ApiError(400, f"'repetition_penalty' must be in [{lo:g}, {hi:g}] (1 = off, > 1 = fewer repeats), got "
                            f"{out['repetition_penalty']}", param="repetition_penalty")
    out["min_tokens"] = _typed(body, "min_tokens", (int,), 0, "an integer")
    if not 0 <= out["min_tokens"] <= max_tokens:
        raise ApiError(400, f"'min_tokens' must be in 0..max_tokens ({max_tokens}), got {_brief(out['min_tokens'])}",
                       param="min_tokens")
    for name, default in (("ignore_eos", False), ("include_stop_str_in_output", False),
                          ("skip_special_tokens", True), ("spaces_between_special_tokens", True)):
        out[name] = _typed(body, name, (bool,), default, "true or false")
    ids = _typed(body, "stop_token_ids", (list,), [], "a list of token ids")
    V = tokenizer.vocab_size
    if len(ids) > MAX_STOP_TOKEN_IDS or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < V
                                                for t in ids):
        raise ApiError(400, f"'stop_token_ids' must be a list of at most {MAX_STOP_TOKEN_IDS} token ids in "
                            f"0..{V - 1}, got {_brief(ids)}", param="stop_token_ids")
    out["stop_token_ids"] = list(dict.fromkeys(ids))
    plp = _typed(body, "prompt_logprobs", (int,), None, f"an integer 0..{MAX_LOGPROBS}")
    if plp is not None and not 0 <= plp <= MAX_LOGPROBS:
        raise ApiError(400, f"'prompt_logprobs' must be in 0..{MAX_LOGPROBS} (alternatives per prompt token), got "
                            f"{_brief(plp)}", param="prompt_logprobs")
    if plp is not None and max_tokens == 0:
        raise ApiError(400, "'prompt_logprobs' needs max_tokens >= 1; to score a prompt alone use echo=true with "
                            "logprobs and max_tokens=0", param="prompt_logprobs")
    out["prompt_logprobs"] = plp
    return out


def check_capacity(req: CompletionRequest, capacity: int, detail: str) -> None:
    """A 400 when the request's samples (prompts x best_of, each one engine request admitted at once)
    exceed what the server can ever hold (``capacity``): a 429 would be retried forever."""
    samples = 1 if req.max_tokens == 0 else len(req.prompts) * req.best_of
    if samples > capacity:
        raise ApiError(400, f"{len(req.prompts)} prompt(s) x best_of {req.best_of} = {samples} samples, but this server "
                            f"holds at most {capacity} requests at once ({detail}), so it could never serve this one; "
                            "send fewer prompts or a smaller n / best_of", param="best_of" if req.best_of > req.n else "n",
                       code="exceeds_capacity")


def _prompts(prompt: Any, tokenizer: CodeTokenizer) -> list[list[int]]:
    """The batch of prompts as token ids: a string, a list of strings, a list of token ids,
    or a list of token-id lists."""
    def ids_of(p: Any, where: str) -> list[int]:
        if isinstance(p, str):
            if not p:
                raise ApiError(400, f"{where} is an empty string; give at least one character", param="prompt")
            ids = tokenizer.encode(valid_text(p, "prompt"))
            if not ids:
                raise ApiError(400, f"{where} encodes to no tokens; give some text", param="prompt")
            return ids
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            bad = [t for t in p if not 0 <= t < tokenizer.vocab_size]
            if bad:
                raise ApiError(400, f"token ids {_brief(bad[:5])} in {where} are outside 0..{tokenizer.vocab_size - 1}",
                               param="prompt")
            return list(p)
        if isinstance(p, list) and not p:
            raise ApiError(400, f"{where} is an empty list; give at least one token id", param="prompt")
        raise ApiError(400, f"{where} must be a string or a list of token ids, got {_brief(p)}", param="prompt",
                       code="invalid_type")

    if prompt is None:
        raise ApiError(400, "'prompt' is required (a string, a list of strings, a list of token ids, or a list of "
                            "token-id lists)", param="prompt", code="missing_field")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                   and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
        return [ids_of(prompt, "'prompt'")]
    if isinstance(prompt, list) and prompt:
        return [ids_of(p, f"prompt {i}") for i, p in enumerate(prompt)]
    raise ApiError(400, "'prompt' must be a string, a list of strings, a non-empty list of token ids, or a list of "
                        f"token-id lists, got {_brief(prompt)}", param="prompt", code="invalid_type")


def _fim_prompts(body: dict[str, Any], prompts: list[list[int]], suffix: Any, tokenizer: CodeTokenizer,
                 fim_format: str | None) -> list[list[int]]:
    """Fill-in-the-middle prompts (the text before the gap = ``prompt``, after it = ``suffix``)."""
    if fim_format is None:
        raise ApiError(400, "'suffix' needs a model trained for fill-in-the-middle, and this one was not (its "
                            "checkpoint's meta has no fim_rate > 0); drop 'suffix', or serve a checkpoint "
                            "pretrained with fim_rate > 0", param="suffix", code="unsupported")
    if not isinstance(suffix, str):
        raise ApiError(400, f"'suffix' must be a string, got {_brief(suffix)}", param="suffix", code="invalid_type")
    raw = body.get("prompt")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "with 'suffix' the prompt must be text (a string or a list of strings), not token ids",
                       param="prompt")
    from codex_lab.data.fim import fim_prompt_ids  # data layer; imported here to keep the server's import light

    try:
        return [fim_prompt_ids(tokenizer, t, valid_text(suffix, "suffix"), fim_format) for t in texts]  # type: ignore[arg-type]
    except ValueError as exc:  # a sentinel token inside the text would forge the prompt
        raise ApiError(400, f"'prompt' or 'suffix': {exc}", param="suffix") from None


__all__ = ["COMPLETION_FIELDS", "MAX_STOP_TOKEN_IDS", "SEED_MAX", "SEED_MIN", "TOKENIZE_FIELDS",
    "CompletionRequest", "check_capacity", "parse_completion"]
