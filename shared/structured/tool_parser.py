"""Tool calls read from a whole output: the streamed deltas of ToolCallStream, merged, so a
streamed answer and a complete one always agree."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from shared.structured.tool_stream import Delta, ToolCallStream, new_call_id


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def to_openai(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


def parse_tool_calls(
    text: str, make_id: Callable[[], str] = new_call_id
) -> tuple[str | None, list[ToolCall]]:
    """(content, tool calls) of a complete output; content is None when empty."""
    stream = ToolCallStream(make_id)
    return merge_deltas([*stream.feed(text), *stream.finish()])


def merge_deltas(deltas: Iterable[Delta]) -> tuple[str | None, list[ToolCall]]:
    """What a client assembles from streamed deltas: the content and the calls."""
    content: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    for delta in deltas:
        content.append(delta.get("content", ""))
        for piece in delta.get("tool_calls", []):
            call = calls.setdefault(piece["index"], {"id": "", "name": "", "arguments": ""})
            call["id"] = piece.get("id", call["id"])
            call["name"] += piece["function"].get("name", "")
            call["arguments"] += piece["function"].get("arguments", "")
    merged = [ToolCall(**calls[index]) for index in sorted(calls)]
    return "".join(content) or None, merged
