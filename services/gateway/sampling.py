"""A request's sampling fields -> `SamplingParams`: the output budget, stop strings and
ids, logprobs, penalties, biases and seed, each checked with a 400 that names it."""

from __future__ import annotations

from services.gateway.errors import invalid_request
from services.gateway.fields import BOOL, INT, INT_LIST, NUMBER, OBJECT, STOP, read
from services.gateway.limits import (
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_TOKEN_IDS,
    MAX_TEMPERATURE,
    SEED_RANGE,
    GatewayLimits,
)
from services.gateway.prompts import checked_ids
from shared.errors import InvalidRequest
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams

# SamplingParams' messages start with the field at fault; these are request fields too.
SAMPLING_FIELDS = frozenset(
    {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop",
        "logprobs",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "min_tokens",
    }
)


def chat_max_tokens(body: dict) -> tuple[int | None, str]:
    newer = read(body, "max_completion_tokens", INT)
    if newer is not None:
        return newer, "max_completion_tokens"
    return read(body, "max_tokens", INT), "max_tokens"


def output_budget(
    requested: int | None,
    param: str,
    default: int | None,
    prompt: tuple[int, str],
    limits: GatewayLimits,
) -> int:
    """The output budget. A requested one must fit beside the prompt (`prompt`: its length
    and its field) in the context, as in vLLM; the default is cut to what fits."""
    num_prompt_tokens, prompt_param = prompt
    room, cap = limits.max_model_len - num_prompt_tokens, limits.output_limit
    if requested is None:
        return min(room, cap, default or cap)
    if not 1 <= requested <= cap:
        raise invalid_request(
            f"{param} must be between 1 and {cap}, got {requested}.",
            param=param,
        )
    if requested > room:
        raise invalid_request(
            f"This model's maximum context length is {limits.max_model_len} tokens; you "
            f"requested {num_prompt_tokens + requested} tokens ({num_prompt_tokens} in the "
            f"{prompt_param}, {requested} in the completion). Reduce the {prompt_param} or "
            f"{param}.",
            param=param,
            code="context_length_exceeded",
        )
    return requested


def chat_logprobs(body: dict) -> int | None:
    wanted = read(body, "logprobs", BOOL)
    top = read(body, "top_logprobs", INT)
    if top and not wanted:
        raise invalid_request("top_logprobs needs logprobs set to true.", param="top_logprobs")
    return (top or 0) if wanted else None


def sampling_params(
    body: dict,
    tokenizer: Tokenizer | None,
    limits: GatewayLimits,
    max_tokens: int,
    logprobs: int | None,
    logprobs_param: str,
) -> SamplingParams:
    settings = dict(
        max_tokens=max_tokens,
        stop=_stop_strings(body, tokenizer),
        logprobs=logprobs,
        stop_token_ids=_stop_token_ids(body, tokenizer, limits),
        temperature=_temperature(body),
        top_p=read(body, "top_p", NUMBER),
        top_k=read(body, "top_k", INT),
        min_p=read(body, "min_p", NUMBER),
        seed=_seed(body),
        ignore_eos=read(body, "ignore_eos", BOOL),
        skip_special_tokens=read(body, "skip_special_tokens", BOOL),
        presence_penalty=read(body, "presence_penalty", NUMBER),
        frequency_penalty=read(body, "frequency_penalty", NUMBER),
        repetition_penalty=read(body, "repetition_penalty", NUMBER),
        logit_bias=_logit_bias(body, tokenizer, limits),
        min_tokens=read(body, "min_tokens", INT),
    )
    given = {name: value for name, value in settings.items() if value is not None}
    if given.get("min_tokens", 0) > max_tokens:
        raise invalid_request(
            f"min_tokens must be at most max_tokens ({max_tokens}), got {given['min_tokens']}.",
            param="min_tokens",
        )
    try:
        return SamplingParams(**given)
    except InvalidRequest as exc:
        raise invalid_request(str(exc), param=_blamed_param(str(exc), logprobs_param)) from None


def _blamed_param(message: str, logprobs_param: str) -> str | None:
    field_name = message.split(" ", 1)[0]
    if field_name not in SAMPLING_FIELDS:
        return None
    return logprobs_param if field_name == "logprobs" else field_name


def _stop_strings(body: dict, tokenizer: Tokenizer | None) -> tuple[str, ...]:
    stop = read(body, "stop", STOP)
    stop = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if stop and tokenizer is None:
        raise invalid_request(
            "Stop strings need a tokenizer, and this model has none.", param="stop"
        )
    longest = max(map(len, stop), default=0)
    if longest > MAX_STOP_STRING_CHARS:
        raise invalid_request(
            f"stop strings may have at most {MAX_STOP_STRING_CHARS} "
            f"characters each, got {longest}.",
            param="stop",
        )
    return stop


def _stop_token_ids(
    body: dict, tokenizer: Tokenizer | None, limits: GatewayLimits
) -> tuple[int, ...]:
    ids = read(body, "stop_token_ids", INT_LIST) or []
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise invalid_request(
            f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, got {len(ids)}.",
            param="stop_token_ids",
        )
    return checked_ids(ids, tokenizer, limits, "stop_token_ids")


def _logit_bias(
    body: dict, tokenizer: Tokenizer | None, limits: GatewayLimits
) -> tuple[tuple[int, float], ...] | None:
    """OpenAI's {"token id": bias}: ids as decimal strings, biases numbers."""
    bias = read(body, "logit_bias", OBJECT)
    if not bias:
        return None
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise invalid_request(
            f"logit_bias may hold at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got {len(bias)}.",
            param="logit_bias",
        )
    if not all(key.isdecimal() and NUMBER.accepts(value) for key, value in bias.items()):
        raise invalid_request(
            'logit_bias must map token ids to numbers, as {"1234": -100}.', param="logit_bias"
        )
    ids = checked_ids([int(key) for key in bias], tokenizer, limits, "logit_bias")
    return tuple(sorted(zip(ids, map(float, bias.values()))))


def _temperature(body: dict) -> float | None:
    temperature = read(body, "temperature", NUMBER)
    if temperature is not None and not 0 <= temperature <= MAX_TEMPERATURE:
        raise invalid_request(
            f"temperature must be between 0 and {MAX_TEMPERATURE:g} "
            f"(OpenAI's documented range), got {temperature}.",
            param="temperature",
        )
    return temperature


def _seed(body: dict) -> int | None:
    seed = read(body, "seed", INT)
    if seed is not None and seed not in SEED_RANGE:
        raise invalid_request(
            f"seed must be between {SEED_RANGE.start} and {SEED_RANGE.stop - 1}.", param="seed"
        )
    return seed
