"""OpenAI request bodies -> `GenerateRequest`: the checks and defaults of the public API.

Pure functions, no I/O. Every client mistake becomes an `ApiError` (400, or 404 for an
unknown model, 413 for an oversized body); nothing else escapes. Unknown fields are ignored,
as vLLM does, but a known field of the wrong type is a 400 that names it. The parts live
beside it: fields (typed reading), limits, prompts, sampling.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from services.gateway.errors import invalid_request
from services.gateway.fields import (
    BOOL,
    INT,
    NUMBER,
    OBJECT,
    Endpoint,
    check_supported,
    checked_model,
    json_object,
    read,
)
from services.gateway.limits import MAX_CHOICES, GatewayLimits
from services.gateway.prompts import (
    chat_prompt,
    check_prompt_length,
    completion_prompt,
    tokenizer_for,
)
from services.gateway.sampling import chat_logprobs, chat_max_tokens, output_budget, sampling_params
from shared.errors import InvalidRequest
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams
from shared.structured.request import grammar_from_request
from shared.structured.spec import GrammarSpec
from shared.structured.tool_grammar import tool_call_grammar
from shared.structured.tools import ToolChoice, tools_from_request


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


def parse_completion(
    body: Any,
    tokenizer: Tokenizer | None,
    limits: GatewayLimits,
    served_model: str,
    request_id: str,
    aliases: Collection[str] = (),
) -> GenerateRequest:
    """POST /v1/completions. `aliases`: other names the served model answers to."""
    body = json_object(body)
    model = checked_model(body, served_model, aliases)
    check_supported(body, "completions")
    prompt_ids = completion_prompt(body.get("prompt"), tokenizer, limits)
    check_prompt_length(len(prompt_ids), limits, "prompt")
    max_tokens = output_budget(
        read(body, "max_tokens", INT),
        "max_tokens",
        limits.default_max_tokens,
        (len(prompt_ids), "prompt"),
        limits,
    )
    logprobs = read(body, "logprobs", INT)
    params = sampling_params(body, tokenizer, limits, max_tokens, logprobs, "logprobs")
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
    body = json_object(body)
    model = checked_model(body, served_model, aliases)
    check_supported(body, "chat")
    tools = _tools(body)
    prompt_ids = chat_prompt(body.get("messages"), tokenizer, tools)
    check_prompt_length(len(prompt_ids), limits, "messages")
    requested, param = chat_max_tokens(body)
    # Without a limit a chat reply may fill the context (vLLM does the same).
    max_tokens = output_budget(requested, param, None, (len(prompt_ids), "messages"), limits)
    params = sampling_params(
        body, tokenizer, limits, max_tokens, chat_logprobs(body), "top_logprobs"
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
    stream = bool(read(body, "stream", BOOL))
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
    value = read(body, name, NUMBER)
    if value is not None and value <= 0:
        raise invalid_request(
            f"{name} must be a positive number of seconds, got {value}.", param=name
        )
    return float(value or 0.0)


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
    count = read(body, name, INT)
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
    if not read(body, "echo", BOOL):
        return None
    if logprobs is not None:
        raise invalid_request(
            "echo together with logprobs (the prompt's logprobs) is not supported.",
            param="echo",
        )
    return tokenizer_for("echo", tokenizer).decode(list(prompt_ids), skip_special_tokens=False)


def _include_usage(body: dict, stream: bool) -> bool:
    options = read(body, "stream_options", OBJECT)
    if options is None:
        return False
    if not stream:
        raise invalid_request(
            "stream_options is only allowed when stream is true.", param="stream_options"
        )
    # NOTE: include_usage defaults to true once stream_options is present, as in vLLM.
    include = read(options, "include_usage", BOOL, "stream_options.")
    return include is not False
