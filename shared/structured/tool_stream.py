"""Hermes `<tool_call>` blocks picked out of streamed text, as OpenAI's streamed deltas.

Content outside the blocks comes out as `{"content": ...}` deltas; each call as a first delta
with its index, id, type and name, then `{"arguments": ...}` pieces that concatenate to its
arguments' JSON text. Arguments stream as the model writes them when the call's JSON starts
`{"name": ..., "arguments": {` (the order tool_grammar imposes); other shapes come out whole
when the block closes. Text that may be the start of `<tool_call>` waits until it is clear,
and whitespace next to calls is dropped.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from typing import Any

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
# A call's JSON up to its arguments' value: `{"name": "f", "arguments": `
NAME_FIRST = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
HEAD, ARGUMENTS, TAIL, WHOLE = "head", "arguments", "tail", "whole"  # where an open call is

Delta = dict[str, Any]


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


class ToolCallStream:
    def __init__(self, make_id: Callable[[], str] = new_call_id) -> None:
        self._make_id = make_id
        self._text = ""  # unread content, or the open call's text after <tool_call>
        self._state: str | None = None  # where the open call is; None: in content
        self._num_calls = 0
        self._space = ""  # whitespace held: dropped next to a call, kept before content
        self._arguments = _ValueScanner()
        self._out: list[Delta] = []

    def feed(self, text: str) -> list[Delta]:
        self._text += text
        while self._step_call() if self._state else self._step_content():
            pass
        return self._take()

    def finish(self) -> list[Delta]:
        """The deltas still held back, once the output is complete: an unclosed call that
        parses counts as a call, anything else as content."""
        if self._state in (HEAD, WHOLE):
            self._close(self._text)
        elif self._state is None:
            self._content(self._text)
            if not self._num_calls and self._space:
                self._out.append({"content": self._space})
        self._text, self._state = "", None
        return self._take()

    def _step_content(self) -> bool:
        start = self._text.find(TOOL_CALL_START)
        if start < 0:
            held = _partial_tag_length(self._text)
            self._content(self._text[: len(self._text) - held])
            self._text = self._text[len(self._text) - held :]
            return False
        self._content(self._text[:start])
        self._space = ""
        self._text = self._text[start + len(TOOL_CALL_START) :]
        self._state = HEAD
        return True

    def _step_call(self) -> bool:
        if self._state == ARGUMENTS:
            return self._stream_arguments()
        if self._state == HEAD and self._name_first():
            return True
        end = self._text.find(TOOL_CALL_END)
        if end < 0:
            return False
        if self._state in (HEAD, WHOLE):
            self._close(self._text[:end])
        self._text, self._state = self._text[end + len(TOOL_CALL_END) :], None
        return True

    def _name_first(self) -> bool:
        """Open the call as soon as its name is known and its arguments have begun."""
        head = NAME_FIRST.match(self._text)
        if head is None or head.end() == len(self._text):
            return False
        self._open(json.loads(head.group(1)))
        self._text = self._text[head.end() :]
        self._arguments = _ValueScanner()
        self._state = ARGUMENTS if self._text[0] in "{[" else WHOLE
        return True

    def _stream_arguments(self) -> bool:
        done = self._arguments.scan(self._text)
        piece, self._text = self._text[:done], self._text[done:]
        if piece:
            self._add_arguments(piece)
        if self._arguments.complete:
            self._state = TAIL
        return self._arguments.complete

    def _close(self, body: str) -> None:
        """A call read whole: `body` is the text between its tags."""
        if self._state == WHOLE:  # named already; its arguments were no object
            self._add_arguments(_arguments_text(body.strip().removesuffix("}").strip()))
            return
        call = _parse_call(body)
        if call is None:
            self._content(f"{TOOL_CALL_START}{body}{TOOL_CALL_END}")
            return
        name, arguments = call
        self._open(name)
        if arguments:
            self._add_arguments(arguments)

    def _open(self, name: str) -> None:
        function = {"name": name, "arguments": ""}
        call = {"index": self._num_calls, "id": self._make_id(), "type": "function"}
        self._out.append({"tool_calls": [{**call, "function": function}]})
        self._num_calls += 1

    def _add_arguments(self, text: str) -> None:
        call = {"index": self._num_calls - 1, "function": {"arguments": text}}
        self._out.append({"tool_calls": [call]})

    def _content(self, text: str) -> None:
        text = self._space + text
        kept = text.rstrip()
        self._space = text[len(kept) :]
        if kept:
            self._out.append({"content": kept})

    def _take(self) -> list[Delta]:
        out, self._out = self._out, []
        return out


class _ValueScanner:
    """Finds where a JSON object or array ends, a character at a time, across pieces."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.complete = False

    def scan(self, text: str) -> int:
        """How many characters of `text` belong to the value (all, unless it ends inside)."""
        for i, char in enumerate(text):
            if self.in_string:
                self._read_string(char)
                continue
            if char == "<":  # never in JSON outside strings: the value broke off at a tag
                self.complete = True
                return i
            self.in_string = char == '"'
            self.depth += (char in "{[") - (char in "}]")
            if self.depth == 0:
                self.complete = True
                return i + 1
        return len(text)

    def _read_string(self, char: str) -> None:
        if self.escaped:
            self.escaped = False
        elif char == "\\":
            self.escaped = True
        elif char == '"':
            self.in_string = False


def _parse_call(body: str) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a whole call's JSON, or None if it is no call."""
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    return call["name"], _arguments_json(arguments)


def _arguments_text(text: str) -> str:
    """Arguments written as something other than an object: a JSON string holding the
    object's text is unwrapped, as some models write it."""
    try:
        return _arguments_json(json.loads(text))
    except ValueError:
        return text


def _arguments_json(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def _partial_tag_length(text: str) -> int:
    """The length of the longest end of `text` that could begin `<tool_call>`."""
    for length in range(min(len(TOOL_CALL_START) - 1, len(text)), 0, -1):
        if TOOL_CALL_START.startswith(text[-length:]):
            return length
    return 0
