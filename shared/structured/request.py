"""The output constraint an OpenAI- or vLLM-style request asks for, as a GrammarSpec.

Read: OpenAI's `response_format`, vLLM's older `guided_json` / `guided_regex` /
`guided_choice` / `guided_grammar`, and its newer `structured_outputs` object. At most one of
them may constrain a request. Only the request's shape is checked here; whether a schema or a
grammar compiles is the compiler's call (GrammarCompiler.compile), run at the gateway too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from shared.errors import InvalidRequest
from shared.structured.spec import GRAMMAR, JSON_OBJECT, REGEX, GrammarSpec

# structured_outputs options that tune vLLM's engines, not what the output must match
IGNORED_OPTIONS = frozenset(
    {
        "disable_fallback",
        "disable_any_whitespace",
        "disable_additional_properties",
        "whitespace_pattern",
    }
)


def grammar_from_request(body: dict) -> GrammarSpec | None:
    """The one constraint `body` asks for, or None for free text."""
    return _one_constraint(body, READERS)


def _one_constraint(body: dict, readers: dict[str, Reader]) -> GrammarSpec | None:
    found = [
        (name, spec)
        for name, read in readers.items()
        if body.get(name) is not None and (spec := read(body[name], name)) is not None
    ]
    if len(found) > 1:
        names = " and ".join(name for name, _ in found)
        raise InvalidRequest(f"{names} each constrain the output; send only one of them")
    return found[0][1] if found else None


def read_response_format(value: Any, name: str) -> GrammarSpec | None:
    if not isinstance(value, dict):
        raise InvalidRequest(f"{name} must be an object with a type")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec(JSON_OBJECT)
    if kind == "json_schema":
        inner = value.get("json_schema")
        if not isinstance(inner, dict):
            raise InvalidRequest(f"{name}.json_schema must be an object with a schema")
        return schema_spec(inner.get("schema"), f"{name}.json_schema.schema")
    raise InvalidRequest(f"{name}.type must be text, json_object or json_schema, got {kind!r}")


def read_structured_outputs(value: Any, name: str) -> GrammarSpec | None:
    if not isinstance(value, dict):
        raise InvalidRequest(f"{name} must be an object")
    unknown = set(value) - set(STRUCTURED_OUTPUT_READERS) - IGNORED_OPTIONS
    if unknown:
        raise InvalidRequest(f"{name} has unsupported fields: {', '.join(sorted(unknown))}")
    return _one_constraint(
        {f"{name}.{key}": field for key, field in value.items()},
        {f"{name}.{key}": read for key, read in STRUCTURED_OUTPUT_READERS.items()},
    )


def schema_spec(value: Any, name: str) -> GrammarSpec:
    """A JSON schema sent as an object or as its JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidRequest(f"{name} is not valid JSON") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"{name} must be a JSON schema object")
    return GrammarSpec.json_schema(value)


def read_regex(value: Any, name: str) -> GrammarSpec:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{name} must be a non-empty regular expression")
    return GrammarSpec(REGEX, value)


def read_choice(value: Any, name: str) -> GrammarSpec:
    if not (isinstance(value, list) and value and all(isinstance(c, str) and c for c in value)):
        raise InvalidRequest(f"{name} must be a non-empty list of non-empty strings")
    return GrammarSpec.choice(value)


def read_grammar(value: Any, name: str) -> GrammarSpec:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"{name} must be a non-empty grammar (Lark or GBNF)")
    return GrammarSpec(GRAMMAR, value)


def read_json_object(value: Any, name: str) -> GrammarSpec | None:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false")
    return GrammarSpec(JSON_OBJECT) if value else None


Reader = Callable[[Any, str], GrammarSpec | None]

STRUCTURED_OUTPUT_READERS: dict[str, Reader] = {
    "json": schema_spec,
    "regex": read_regex,
    "choice": read_choice,
    "grammar": read_grammar,
    "json_object": read_json_object,
    "structural_tag": lambda value, name: _unsupported(name),
}

READERS: dict[str, Reader] = {
    "response_format": read_response_format,
    "guided_json": schema_spec,
    "guided_regex": read_regex,
    "guided_choice": read_choice,
    "guided_grammar": read_grammar,
    "structured_outputs": read_structured_outputs,
}


def _unsupported(name: str) -> GrammarSpec:
    raise InvalidRequest(f"{name} is not supported; use json, regex, choice or grammar")
