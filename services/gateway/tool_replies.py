"""A chat reply read for tool calls (when the request offers tools): Hermes `<tool_call>`
blocks become OpenAI's `tool_calls`, whole or streamed as deltas, and a reply that called
a tool finishes with `tool_calls`."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.structured.tool_parser import parse_tool_calls
from shared.structured.tool_stream import Delta, ToolCallStream


def whole_reply(text: str, finish_reason: str) -> tuple[dict, str]:
    """(the message's content and tool_calls, the finish reason) of a complete reply."""
    content, calls = parse_tool_calls(text)
    if not calls:
        return {"content": text}, finish_reason
    message = {"content": content, "tool_calls": [call.to_openai() for call in calls]}
    return message, _finish(finish_reason)


@dataclass
class StreamedReply:
    """One choice's streamed text, as deltas."""

    stream: ToolCallStream = field(default_factory=ToolCallStream)
    called: bool = False

    def deltas(self, text: str, finished: bool) -> list[Delta]:
        out = self.stream.feed(text)
        if finished:
            out += self.stream.finish()
        self.called = self.called or any("tool_calls" in delta for delta in out)
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        return _finish(reason) if reason is not None and self.called else reason


def _finish(reason: str) -> str:
    # NOTE: OpenAI's `tool_calls` replaces `stop`; a reply cut at max_tokens stays `length`.
    return "tool_calls" if reason == "stop" else reason
