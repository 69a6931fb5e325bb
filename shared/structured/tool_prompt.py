"""Tools and tool turns as chat-template text, for templates that know nothing of tools
(SmolLM2's prints only role and content): the Hermes format Qwen2.5's template writes.

The tools go into the system turn inside <tools></tools>; an assistant's earlier calls become
<tool_call> blocks in its content; `role: tool` results become <tool_response> blocks in a
user turn (consecutive results share one turn), since such templates know no tool role.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from shared.errors import InvalidRequest
from shared.structured.tools import Tool

TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def render_tools_system_prompt(tools: Sequence[Tool]) -> str:
    lines = "\n".join(json.dumps(tool.to_openai(), ensure_ascii=False) for tool in tools)
    return TOOLS_PROMPT.format(tools=lines)


def messages_for_template(messages: list[dict], tools: Sequence[Tool] = ()) -> list[dict]:
    """OpenAI messages (assistant `tool_calls`, `role: tool`, null content) as plain
    role/content turns, with the tools' system prompt when `tools` is not empty."""
    turns: list[dict] = []
    previous_role = None
    for message in messages:
        if not isinstance(message, dict):
            raise InvalidRequest("messages must be a list of objects with a role and content")
        role = message.get("role")
        if role == "tool" and previous_role == "tool":  # one turn holds consecutive results
            turns[-1] = {**turns[-1], "content": f"{turns[-1]['content']}\n{_response(message)}"}
        elif role == "tool":
            turns.append({"role": "user", "content": _response(message)})
        else:
            turns.append(_plain_turn(message))
        previous_role = role
    return _with_tools_prompt(turns, tools) if tools else turns


def format_tool_call(name: str, arguments: Any) -> str:
    call = {"name": name, "arguments": arguments}
    return f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"


def _plain_turn(message: dict) -> dict:
    calls = message.get("tool_calls") or []
    if not calls:
        return {**message, "content": _text(message.get("content"))}
    blocks = [_call_text(call) for call in calls]
    text = "\n".join([_text(message.get("content")), *blocks]).lstrip("\n")
    rest = {key: value for key, value in message.items() if key != "tool_calls"}
    return {**rest, "content": text}


def _call_text(call: Any) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidRequest("an assistant message's tool_calls need function names")
    arguments = function.get("arguments", "{}")
    try:  # OpenAI sends arguments as JSON text; the model saw (and writes) a JSON object
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        pass
    return format_tool_call(function["name"], arguments)


def _response(message: dict) -> str:
    return f"<tool_response>\n{_text(message.get('content'))}\n</tool_response>"


def _with_tools_prompt(turns: list[dict], tools: Sequence[Tool]) -> list[dict]:
    prompt = render_tools_system_prompt(tools)
    if turns and turns[0].get("role") == "system":
        first = turns[0]
        return [{**first, "content": f"{first['content']}\n\n{prompt}"}, *turns[1:]]
    return [{"role": "system", "content": prompt}, *turns]


def _text(content: Any) -> str:
    """Message content as text: null is empty; a list of parts is its text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise InvalidRequest("message content must be a string, a list of parts or null")
