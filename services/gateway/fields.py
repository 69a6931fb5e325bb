"""Reading a request body's fields: JSON types as OpenAI means them (a bool is not an
integer), a 400 naming the field at fault, and the fields kvstack refuses rather than
ignores."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from services.gateway.errors import body_too_large, invalid_request, model_not_found
from services.gateway.limits import MAX_STOP_STRINGS, GatewayLimits

Endpoint = Literal["completions", "chat"]
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


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_short_str_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= MAX_STOP_STRINGS
        and all(isinstance(item, str) for item in value)
    )


BOOL = FieldKind(lambda value: isinstance(value, bool), "a boolean")
INT = FieldKind(is_int, "an integer")
NUMBER = FieldKind(lambda value: isinstance(value, float) or is_int(value), "a number")
STRING = FieldKind(lambda value: isinstance(value, str), "a string")
OBJECT = FieldKind(lambda value: isinstance(value, dict), "an object")
INT_LIST = FieldKind(
    lambda value: isinstance(value, list) and all(map(is_int, value)), "a list of integers"
)
STOP = FieldKind(
    lambda value: isinstance(value, str) or _is_short_str_list(value),
    f"a string or a list of up to {MAX_STOP_STRINGS} strings",
)


def read(body: dict, name: str, kind: FieldKind, prefix: str = "") -> Any:
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


def decode_body(raw: bytes, limits: GatewayLimits) -> dict:
    """The request body as a JSON object (413 when too large, 400 when not an object)."""
    if len(raw) > limits.max_body_bytes:
        raise body_too_large(limits.max_body_bytes)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}") from None
    return json_object(body)


def json_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise invalid_request("The request body must be a JSON object.")
    return body


def checked_model(body: dict, served_model: str, aliases: Collection[str]) -> str:
    # NOTE: a missing model means the served one (vLLM allows this; handy with curl).
    name = read(body, "model", STRING)
    if name is not None and name != served_model and name not in aliases:
        raise model_not_found(name)
    return served_model


def check_supported(body: dict, endpoint: Endpoint) -> None:
    read(body, "user", STRING)  # accepted, as OpenAI's end-user id; not used
    given = [name for name in UNSUPPORTED[endpoint] if body.get(name) is not None]
    if given:
        raise invalid_request(f"{given[0]} is not supported by kvstack.", param=given[0])
