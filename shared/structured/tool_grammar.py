"""The grammar that makes a model call tools (tool_choice `required` or a named function):
Hermes-style `<tool_call>` blocks whose JSON names one of the tools and whose arguments are
valid for that function's parameters schema."""

from __future__ import annotations

import json
from typing import Any

from shared.structured.spec import GRAMMAR, GrammarSpec
from shared.structured.tools import Tool, ToolChoice

CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"
CALL_SEPARATOR = "\n"


def tool_call_grammar(choice: ToolChoice) -> GrammarSpec | None:
    """A Lark grammar (llguidance's dialect, with the call's JSON schema embedded by %json)
    for the calls `choice` forces; None when the model may answer in text."""
    forced = choice.forced
    if not forced:
        return None
    # NOTE: a named function is called once, as OpenAI does; `required` may call several.
    many = choice.parallel and choice.function is None
    start = f"start: call ({_lark(CALL_SEPARATOR)} call)*" if many else "start: call"
    body = json.dumps(call_schema(forced), ensure_ascii=False)
    call = f"call: {_lark(CALL_OPEN)} %json {body} {_lark(CALL_CLOSE)}"
    return GrammarSpec(GRAMMAR, f"{start}\n{call}\n")


def call_schema(tools: tuple[Tool, ...]) -> dict[str, Any]:
    """One call's JSON: the name first (so a streamed call is named before its arguments),
    then arguments valid for that tool; compact, as the model's whitespace would never end."""
    branches = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return {"x-guidance": {"whitespace_flexible": False}, "anyOf": branches}


def _lark(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON's escapes are Lark's
