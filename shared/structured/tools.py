"""The tools a request offers and how it lets the model use them (`tools`, `tool_choice`,
`parallel_tool_calls`), checked the way OpenAI checks them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from shared.errors import InvalidRequest

AUTO, NONE, REQUIRED, NAMED = "auto", "none", "required", "named"
FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,64}")  # OpenAI's rule, with dots as vLLM allows
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: dict(NO_PARAMETERS))

    def to_openai(self) -> dict[str, Any]:
        function = {"name": self.name, "description": self.description}
        return {"type": "function", "function": {**function, "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolChoice:
    tools: tuple[Tool, ...]
    mode: str = AUTO  # AUTO, NONE, REQUIRED or NAMED
    function: str | None = None  # the one the model must call, when NAMED
    parallel: bool = True  # more than one call in an answer

    @property
    def offered(self) -> tuple[Tool, ...]:
        """The tools the prompt shows: none when the model may not call any."""
        return () if self.mode == NONE else self.tools

    @property
    def forced(self) -> tuple[Tool, ...]:
        """The tools a call must be one of; () when the model may also answer in text."""
        if self.mode == NAMED:
            return tuple(tool for tool in self.tools if tool.name == self.function)
        return self.tools if self.mode == REQUIRED else ()


def tools_from_request(body: dict) -> ToolChoice | None:
    """The request's tools and tool choice; None when it offers no tools."""
    tools = read_tools(body.get("tools"))
    choice = body.get("tool_choice")
    if not tools:
        if choice not in (None, NONE):
            raise InvalidRequest("tool_choice needs tools: the request offers none")
        return None
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise InvalidRequest("parallel_tool_calls must be true or false")
    mode, function = read_tool_choice(AUTO if choice is None else choice, tools)
    return ToolChoice(tools, mode, function, parallel)


def read_tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidRequest("tools must be a list of function tools")
    tools = tuple(read_tool(item, f"tools[{i}]") for i, item in enumerate(value))
    names = [tool.name for tool in tools]
    if len(set(names)) < len(names):
        raise InvalidRequest("tools has two functions of the same name")
    return tools


def read_tool(value: Any, name: str) -> Tool:
    if not isinstance(value, dict) or value.get("type", "function") != "function":
        raise InvalidRequest(f"{name} must be an object of type function")
    function = value.get("function")
    if not isinstance(function, dict):
        raise InvalidRequest(f"{name}.function must be an object with a name")
    tool_name = function.get("name")
    if not isinstance(tool_name, str) or not FUNCTION_NAME.fullmatch(tool_name):
        raise InvalidRequest(f"{name}.function.name must be 1-64 of a-z, A-Z, 0-9, _ . -")
    parameters = function.get("parameters") or dict(NO_PARAMETERS)
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"{name}.function.parameters must be a JSON schema object")
    description = function.get("description") or ""
    if not isinstance(description, str):
        raise InvalidRequest(f"{name}.function.description must be a string")
    return Tool(tool_name, description, parameters)


def read_tool_choice(value: Any, tools: tuple[Tool, ...]) -> tuple[str, str | None]:
    if value in (AUTO, NONE, REQUIRED):
        return value, None
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise InvalidRequest(
            'tool_choice must be "auto", "none", "required" or '
            '{"type": "function", "function": {"name": ...}}'
        )
    if name not in {tool.name for tool in tools}:
        raise InvalidRequest(f"tool_choice names {name!r}, which is not among the tools")
    return NAMED, name
