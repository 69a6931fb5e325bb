"""OpenAI request bodies -> `GenerateRequest`: the checks and defaults of the public API.

Pure functions, no I/O. Every client mistake becomes an `ApiError` (400, or 404 for an
unknown model, 413 for an oversized body); nothing else escapes. Unknown fields are ignored,
as vLLM does, but a known field of the wrong type is a 400 that names it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from services.gateway.errors import body_too_large, internal_error, invalid_request, model_not_found
from shared.engine.sampling_params import SamplingParams
from shared.errors import InvalidRequest, KvstackError
from shared.model.tokenizer import Tokenizer
from shared.structured.request import grammar_from_request
from shared.structured.spec import GrammarSpec
from shared.structured.tool_grammar import tool_call_grammar
from shared.structured.tool_prompt import messages_for_template
from shared.structured.tools import ToolChoice, tools_from_request

Endpoint = Literal["completions", "chat"]
MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_STOP_STRING_CHARS = 1000  # each; held back while streaming, matched at every token
MAX_STOP_TOKEN_IDS = 64
MAX_TEMPERATURE = 2.0  # OpenAI's documented range is [0, 2]
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # OpenAI's, less "function"
SEED_RANGE = range(-(2**63), 2**64)  # what torch.Generator.manual_seed accepts
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
MAX_CHOICES = 16  # n and best_of: each choice is a request of its own on the workers
MAX_LOGIT_BIAS_ENTRIES = 1024
# Fields of OpenAI's or vLLM's API that kvstack does not implement: a 400 that names
# the field, never a 200 that silently ignored it.
_NOT_IN_KVSTACK = (  # vLLM's, on both endpoints
    "prompt_logprobs",
    "use_beam_search",
    "allowed_token_ids",
    "bad_words",
    "guided_decoding_backend",
)
UNSUPPORTED = {
    "completions": ("suffix", *_NOT_IN_KVSTACK),
    "chat": (
        "functions",
        "function_call",
        "audio",
        "modalities",
        "prediction",
        "web_search_options",
        "echo",
        "best_of",
        *_NOT_IN_KVSTACK,
    ),
}


@dataclass(frozen=True)
class FieldKind:
    """A JSON type a request field must have (bool is not an int here, unlike in Python)."""

    accepts: Callable[[Any], bool]
    expected: str


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_short_str_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= MAX_STOP_STRINGS
        and all(isinstance(item, str) for item in value)
    )


BOOL = FieldKind(lambda value: isinstance(value, bool), "a boolean")
INT = FieldKind(_is_int, "an integer")
NUMBER = FieldKind(lambda value: isinstance(value, float) or _is_int(value), "a number")
STRING = FieldKind(lambda value: isinstance(value, str), "a string")
OBJECT = FieldKind(lambda value: isinstance(value, dict), "an object")
INT_LIST = FieldKind(
    lambda value: isinstance(value, list) and all(map(_is_int, value)), "a list of integers"
)
STOP = FieldKind(
    lambda value: isinstance(value, str) or _is_short_str_list(value),
    f"a string or a list of up to {MAX_STOP_STRINGS} strings",
)


@dataclass(frozen=True)
class GatewayLimits:
    max_model_len: int  # context limit: prompt + output tokens
    max_tokens_limit: int | None = None  # cap on a requested max_tokens; None: max_model_len
    default_max_tokens: int = 16  # completions without max_tokens (OpenAI's default)
    max_body_bytes: int = 4 * 1024 * 1024
    vocab_size: int | None = None  # checks token ids when there is no tokenizer

    def __post_init__(self) -> None:
        if self.max_tokens_limit is None:
            object.__setattr__(self, "max_tokens_limit", self.max_model_len)
        if min(self.max_model_len, self.output_limit, self.default_max_tokens) < 1:
            raise ValueError(f"gateway limits must be positive: {self}")

    @property
    def output_limit(self) -> int:
        """The cap on a requested max_tokens (max_tokens_limit, resolved)."""
        return self.max_model_len if self.max_tokens_limit is None else self.max_tokens_limit


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    endpoint: Endpoint
    model: str  # the served name, whichever alias the client used
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    stream: bool
    include_usage: bool  # stream a final usage chunk (stream_options)
    logprobs: int | None  # top alternatives per token; None: no logprobs
    slo_ttft: float = 0.0  # seconds (kvstack extension); 0: the conductor's
    slo_tbt: float = 0.0
    n: int = 1  # choices returned
    best_of: int = 1  # choices generated, the n likeliest returned (completions)
    echo: str | None = None  # the prompt's text, put before the reply (completions)
    tools: ToolChoice | None = None  # tools the prompt offers: the reply is read for calls
    grammar_field: str | None = None  # the field that asked for params.grammar (for a 400)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def response_id(self) -> str:
        prefix = "chatcmpl" if self.endpoint == "chat" else "cmpl"
        return f"{prefix}-{self.request_id}"

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def decode_body(raw: bytes, limits: GatewayLimits) -> dict:
    """The request body as a JSON object (413 when too large, 400 when not an object)."""
    if len(raw) > limits.max_body_bytes:
        raise body_too_large(limits.max_body_bytes)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}") from None
    return _object(body)


def parse_completion(
    body: Any,
    tokenizer: Tokenizer | None,
    limits: GatewayLimits,
    served_model: str,
    request_id: str,
    aliases: Collection[str] = (),
) -> GenerateRequest:
    """POST /v1/completions. `aliases`: other names the served model answers to."""
    body = _object(body)
    model = _model(body, served_model, aliases)
    _check_supported(body, "completions")
    prompt_ids = _completion_prompt(body.get("prompt"), tokenizer, limits)
    _check_prompt_length(len(prompt_ids), limits, "prompt")
    max_tokens = _max_tokens(
        _read(body, "max_tokens", INT),
        "max_tokens",
        limits.default_max_tokens,
        (len(prompt_ids), "prompt"),
        limits,
    )
    logprobs = _read(body, "logprobs", INT)
    params = _sampling_params(body, tokenizer, limits, max_tokens, logprobs, "logprobs")
    spec, field_name = _grammar(body, None)
    params = dataclasses.replace(params, grammar=spec)
    request = _request(body, request_id, "completions", model, prompt_ids, params)
    request = dataclasses.replace(request, grammar_field=field_name)
    return _with_choices(body, request, _echo(body, logprobs, tokenizer, prompt_ids))


def parse_chat(
    body: Any,
    tokenizer: Tokenizer | None,
    limits: GatewayLimits,
    served_model: str,
    request_id: str,
    aliases: Collection[str] = (),
) -> GenerateRequest:
    """POST /v1/chat/completions. `aliases`: other names the served model answers to."""
    body = _object(body)
    model = _model(body, served_model, aliases)
    _check_supported(body, "chat")
    tools = _tools(body)
    prompt_ids = _chat_prompt(body.get("messages"), tokenizer, tools)
    _check_prompt_length(len(prompt_ids), limits, "messages")
    requested, param = _chat_max_tokens(body)
    # Without a limit a chat reply may fill the context (vLLM does the same).
    max_tokens = _max_tokens(requested, param, None, (len(prompt_ids), "messages"), limits)
    params = _sampling_params(
        body, tokenizer, limits, max_tokens, _chat_logprobs(body), "top_logprobs"
    )
    spec, field_name = _grammar(body, tools)
    params = dataclasses.replace(params, grammar=spec)
    request = _request(body, request_id, "chat", model, prompt_ids, params)
    offered = tools if tools is not None and tools.offered else None
    request = dataclasses.replace(request, tools=offered, grammar_field=field_name)
    return _with_choices(body, request)


def _request(
    body: dict,
    request_id: str,
    endpoint: Endpoint,
    model: str,
    prompt_ids: tuple[int, ...],
    params: SamplingParams,
) -> GenerateRequest:
    stream = bool(_read(body, "stream", BOOL))
    return GenerateRequest(
        request_id,
        endpoint,
        model,
        prompt_ids,
        params,
        stream,
        _include_usage(body, stream),
        params.logprobs,
        _slo(body, "slo_ttft"),
        _slo(body, "slo_tbt"),
    )


def _slo(body: dict, name: str) -> float:
    """A per-request SLO in seconds (kvstack extension field); 0.0 when absent."""
    value = _read(body, name, NUMBER)
    if value is not None and value <= 0:
        raise invalid_request(
            f"{name} must be a positive number of seconds, got {value}.", param=name
        )
    return float(value or 0.0)


# -- model, n, stream options ------------------------------------------------------------------


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise invalid_request("The request body must be a JSON object.")
    return body


def _model(body: dict, served_model: str, aliases: Collection[str]) -> str:
    # NOTE: a missing model means the served one (vLLM allows this; handy with curl).
    name = _read(body, "model", STRING)
    if name is not None and name != served_model and name not in aliases:
        raise model_not_found(name)
    return served_model


GRAMMAR_FIELDS = (
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
)


def _tools(body: dict) -> ToolChoice | None:
    try:
        return tools_from_request(body)
    except InvalidRequest as exc:
        param = "tool_choice" if "tool_choice" in str(exc) else "tools"
        raise invalid_request(str(exc), param=param) from None


def _grammar(body: dict, tools: ToolChoice | None) -> tuple[GrammarSpec | None, str | None]:
    """What the output must match, and the field that asked for it. Calls that tools force
    come first (the answer is then calls only)."""
    forced = tool_call_grammar(tools) if tools is not None else None
    if forced is not None:
        return forced, "tool_choice"
    given = next((name for name in GRAMMAR_FIELDS if body.get(name) is not None), None)
    try:
        return grammar_from_request(body), given
    except InvalidRequest as exc:
        raise invalid_request(str(exc), param=given) from None


def _check_supported(body: dict, endpoint: Endpoint) -> None:
    _read(body, "user", STRING)  # accepted, as OpenAI's end-user id; not used
    given = [name for name in UNSUPPORTED[endpoint] if body.get(name) is not None]
    if given:
        raise invalid_request(f"{given[0]} is not supported by kvstack.", param=given[0])


def _with_choices(body: dict, req: GenerateRequest, echo: str | None = None) -> GenerateRequest:
    """`req` with its n, best_of (completions) and echo, checked."""
    n = _count(body, "n", 1)
    best_of = _count(body, "best_of", n) if req.endpoint == "completions" else n
    if best_of < n:
        raise invalid_request(f"best_of must be at least n ({n}), got {best_of}.", param="best_of")
    if best_of > n and req.stream:
        raise invalid_request("best_of above n cannot be streamed.", param="best_of")
    return dataclasses.replace(req, n=n, best_of=best_of, echo=echo)


def _count(body: dict, name: str, default: int) -> int:
    count = _read(body, name, INT)
    if count is None:
        return default
    if not 1 <= count <= MAX_CHOICES:
        raise invalid_request(
            f"{name} must be between 1 and {MAX_CHOICES}, got {count}.", param=name
        )
    return count


def _echo(
    body: dict, logprobs: int | None, tokenizer: Tokenizer | None, prompt_ids: tuple[int, ...]
) -> str | None:
    """The prompt's text when the client asked for it back."""
    if not _read(body, "echo", BOOL):
        return None
    if logprobs is not None:
        raise invalid_request(
            "echo together with logprobs (the prompt's logprobs) is not supported.",
            param="echo",
        )
    return _tokenizer_for("echo", tokenizer).decode(list(prompt_ids), skip_special_tokens=False)


def _include_usage(body: dict, stream: bool) -> bool:
    options = _read(body, "stream_options", OBJECT)
    if options is None:
        return False
    if not stream:
        raise invalid_request(
            "stream_options is only allowed when stream is true.", param="stream_options"
        )
    # NOTE: include_usage defaults to true once stream_options is present, as in vLLM.
    include = _read(options, "include_usage", BOOL, "stream_options.")
    return include is not False


# -- prompts ---------------------------------------------------------------------------------------


def _completion_prompt(
    prompt: Any, tokenizer: Tokenizer | None, limits: GatewayLimits
) -> tuple[int, ...]:
    if isinstance(prompt, list) and len(prompt) == 1 and not _is_int(prompt[0]):
        prompt = prompt[0]  # a one-element batch: ["text"] or [[ids]]
    if isinstance(prompt, str):
        return tuple(_tokenizer_for("a text prompt", tokenizer).encode(prompt))
    if INT_LIST.accepts(prompt):
        return _checked_ids(prompt, tokenizer, limits, "prompt")
    if isinstance(prompt, list) and all(isinstance(p, (str, list)) for p in prompt):
        raise invalid_request("Only one prompt per request is supported.", param="prompt")
    raise invalid_request("prompt must be a string or a list of token ids.", param="prompt")


def _chat_prompt(
    messages: Any, tokenizer: Tokenizer | None, tools: ToolChoice | None = None
) -> tuple[int, ...]:
    if not isinstance(messages, list) or not messages:
        raise invalid_request(
            "messages must be a non-empty list of {role, content} objects.", param="messages"
        )
    turns = [_chat_message(message, index) for index, message in enumerate(messages)]
    tokenizer = _tokenizer_for("chat", tokenizer)
    try:
        # Tool calls and results as text, and the tools offered in the system turn, for
        # templates that know no tools (docs/structured-output.md).
        turns = messages_for_template(turns, tools.offered if tools else ())
        return tuple(tokenizer.encode_chat(turns, add_generation_prompt=True))
    except InvalidRequest as exc:
        raise invalid_request(str(exc), param="messages") from None
    except KvstackError as exc:  # the model's template is broken: our problem, not the client's
        raise internal_error(str(exc)) from None


def _chat_message(message: Any, index: int) -> dict:
    if not isinstance(message, dict) or not STRING.accepts(message.get("role")):
        raise invalid_request(
            "Each message must be an object with a string role.", param=f"messages[{index}].role"
        )
    if message["role"] not in CHAT_ROLES:
        raise invalid_request(
            f"Unknown role {message['role']!r}; the roles are {', '.join(CHAT_ROLES)}.",
            param=f"messages[{index}].role",
        )
    calls = message.get("tool_calls") if message["role"] == "assistant" else None
    if calls is not None and not isinstance(calls, list):
        raise invalid_request("tool_calls must be a list.", param=f"messages[{index}].tool_calls")
    if calls and message.get("content") is None:  # a turn of calls only
        return {"role": "assistant", "content": "", "tool_calls": calls}
    turn = {"role": message["role"], "content": _chat_content(message.get("content"), index)}
    return {**turn, "tool_calls": calls} if calls else turn


def _chat_content(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(map(_is_text_part, content)):
        return "\n".join(part["text"] for part in content)  # joined as vLLM joins text parts
    raise invalid_request(
        'content must be a string or a list of {"type": "text", "text": ...} parts.',
        param=f"messages[{index}].content",
    )


def _is_text_part(part: Any) -> bool:
    return (
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )


def _tokenizer_for(what: str, tokenizer: Tokenizer | None) -> Tokenizer:
    if tokenizer is None:
        raise invalid_request(
            f"This model has no tokenizer, so {what} cannot be used; "
            "send the prompt as a list of token ids.",
            param="prompt",
        )
    return tokenizer


def _checked_ids(
    ids: list, tokenizer: Tokenizer | None, limits: GatewayLimits, param: str
) -> tuple[int, ...]:
    vocab_size = tokenizer.vocab_size if tokenizer is not None else limits.vocab_size
    bad = next((i for i in ids if i < 0 or (vocab_size is not None and i >= vocab_size)), None)
    if bad is not None:
        raise invalid_request(
            f"Token id {bad} is out of vocabulary (size {vocab_size}).", param=param
        )
    return tuple(ids)


def _check_prompt_length(num_tokens: int, limits: GatewayLimits, param: str) -> None:
    if num_tokens == 0:
        raise invalid_request("The prompt is empty.", param=param)
    if num_tokens >= limits.max_model_len:
        raise invalid_request(
            f"This model's maximum context length is {limits.max_model_len} tokens; your "
            f"prompt has {num_tokens} tokens, which leaves no room for output.",
            param=param,
            code="context_length_exceeded",
        )


# -- sampling ------------------------------------------------------------------------------------


def _chat_max_tokens(body: dict) -> tuple[int | None, str]:
    newer = _read(body, "max_completion_tokens", INT)
    if newer is not None:
        return newer, "max_completion_tokens"
    return _read(body, "max_tokens", INT), "max_tokens"


def _max_tokens(
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


def _chat_logprobs(body: dict) -> int | None:
    wanted = _read(body, "logprobs", BOOL)
    top = _read(body, "top_logprobs", INT)
    if top and not wanted:
        raise invalid_request("top_logprobs needs logprobs set to true.", param="top_logprobs")
    return (top or 0) if wanted else None


def _sampling_params(
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
        top_p=_read(body, "top_p", NUMBER),
        top_k=_read(body, "top_k", INT),
        min_p=_read(body, "min_p", NUMBER),
        seed=_seed(body),
        ignore_eos=_read(body, "ignore_eos", BOOL),
        skip_special_tokens=_read(body, "skip_special_tokens", BOOL),
        presence_penalty=_read(body, "presence_penalty", NUMBER),
        frequency_penalty=_read(body, "frequency_penalty", NUMBER),
        repetition_penalty=_read(body, "repetition_penalty", NUMBER),
        logit_bias=_logit_bias(body, tokenizer, limits),
        min_tokens=_read(body, "min_tokens", INT),
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
    stop = _read(body, "stop", STOP)
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
    ids = _read(body, "stop_token_ids", INT_LIST) or []
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise invalid_request(
            f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, got {len(ids)}.",
            param="stop_token_ids",
        )
    return _checked_ids(ids, tokenizer, limits, "stop_token_ids")


def _logit_bias(
    body: dict, tokenizer: Tokenizer | None, limits: GatewayLimits
) -> tuple[tuple[int, float], ...] | None:
    """OpenAI's {"token id": bias}: ids as decimal strings, biases numbers."""
    bias = _read(body, "logit_bias", OBJECT)
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
    ids = _checked_ids([int(key) for key in bias], tokenizer, limits, "logit_bias")
    return tuple(sorted(zip(ids, map(float, bias.values()))))


def _temperature(body: dict) -> float | None:
    temperature = _read(body, "temperature", NUMBER)
    if temperature is not None and not 0 <= temperature <= MAX_TEMPERATURE:
        raise invalid_request(
            f"temperature must be between 0 and {MAX_TEMPERATURE:g} "
            f"(OpenAI's documented range), got {temperature}.",
            param="temperature",
        )
    return temperature


def _seed(body: dict) -> int | None:
    seed = _read(body, "seed", INT)
    if seed is not None and seed not in SEED_RANGE:
        raise invalid_request(
            f"seed must be between {SEED_RANGE.start} and {SEED_RANGE.stop - 1}.", param="seed"
        )
    return seed


# -- typed field reading ---------------------------------------------------------------------------


def _read(body: dict, name: str, kind: FieldKind, prefix: str = "") -> Any:
    """`body[name]`, None when absent or null; a 400 naming the field when of the wrong type."""
    value = body.get(name)
    if value is not None and not kind.accepts(value):
        raise invalid_request(
            f"{prefix}{name} must be {kind.expected}, got {_json_type(value)}.", param=prefix + name
        )
    return value


def _json_type(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    return names.get(type(value), type(value).__name__)
