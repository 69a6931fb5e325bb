"""What a request's output must match, as plain data: a cache key and a message field.

A spec is the request's own words (a schema, a regex, a list of choices, a grammar), never the
engine's compiled form, so it travels between services as two strings and every worker compiles
it with its own tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shared.errors import InvalidRequest

JSON_OBJECT = "json_object"  # any JSON object
JSON_SCHEMA = "json_schema"  # text: the schema, compact JSON in the request's key order
REGEX = "regex"  # text: the pattern; the whole output must match it
CHOICE = "choice"  # text: a JSON list of strings; the output is exactly one of them
GRAMMAR = "grammar"  # text: a Lark grammar (llguidance's dialect) or a GBNF one
KINDS = (JSON_OBJECT, JSON_SCHEMA, REGEX, CHOICE, GRAMMAR)


@dataclass(frozen=True)
class GrammarSpec:
    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidRequest(f"unknown grammar kind {self.kind!r}; expected one of {KINDS}")

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> GrammarSpec:
        # NOTE: key order is kept, not sorted: the output's properties follow the schema's order.
        return cls(JSON_SCHEMA, json.dumps(schema, separators=(",", ":"), ensure_ascii=False))

    @classmethod
    def choice(cls, choices: list[str]) -> GrammarSpec:
        return cls(CHOICE, json.dumps(choices, ensure_ascii=False))

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}

    @classmethod
    def from_dict(cls, data: dict[str, str]) -> GrammarSpec:
        return cls(data["kind"], data.get("text", ""))
