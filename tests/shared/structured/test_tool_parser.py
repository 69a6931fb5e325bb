"""Hermes <tool_call> parsing: whole outputs round trip, streamed deltas (in any split)
concatenate to the same calls, partial tags wait, broken calls stay content."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from shared.structured.tool_parser import ToolCall, merge_deltas, parse_tool_calls
from shared.structured.tool_prompt import format_tool_call
from shared.structured.tool_stream import ToolCallStream

OUTPUTS = [
    "Just text, no calls.",
    format_tool_call("get_weather", {"city": "Paris", "unit": "celsius"}),
    "Let me check.\n" + format_tool_call("f", {"s": 'a "quoted" <tool_call> {x}', "n": [1, {}]}),
    format_tool_call("a", {}) + "\n" + format_tool_call("b", {"x": [[], {"y": None}]}),
    '<tool_call>\n{"arguments": {"a": 1}, "name": "args_first"}\n</tool_call>',
    '<tool_call>\n{"name": "stringly", "arguments": "{\\"a\\": 1}"}\n</tool_call>',
    '<tool_call>{"name":"compact","arguments":{"k":"v"}}</tool_call>',
    format_tool_call("g", {"q": "ünïcode ✓"}) + "\nAnd some text after.",
    "1 < 2 but <tool is not a tag",
]


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def streamed(text: str, pieces: list[int]) -> list[dict]:
    stream, deltas, at = ToolCallStream(ids()), [], 0
    for size in pieces:
        deltas += stream.feed(text[at : at + size])
        at += size
    return deltas + stream.feed(text[at:]) + stream.finish()


def test_whole_outputs_parse_into_content_and_calls() -> None:
    assert parse_tool_calls(OUTPUTS[0], ids()) == ("Just text, no calls.", [])
    assert parse_tool_calls(OUTPUTS[2], ids()) == (
        "Let me check.",
        [ToolCall("call_0", "f", json.dumps({"s": 'a "quoted" <tool_call> {x}', "n": [1, {}]}))],
    )
    content, calls = parse_tool_calls(OUTPUTS[3], ids())
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("a", {}),
        ("b", {"x": [[], {"y": None}]}),
    ]


@pytest.mark.parametrize("text", OUTPUTS[4:7])
def test_other_call_shapes_are_read(text) -> None:
    content, (call,) = parse_tool_calls(text, ids())
    assert content is None and json.loads(call.arguments) in ({"a": 1}, {"k": "v"})


@pytest.mark.parametrize("text", OUTPUTS)
@pytest.mark.parametrize("seed", range(5))
def test_streamed_deltas_concatenate_to_the_whole_parse(text, seed) -> None:
    rng = random.Random(seed)
    pieces = [rng.randint(1, 6) for _ in range(len(text))]
    assert merge_deltas(streamed(text, pieces)) == parse_tool_calls(text, ids())
    assert merge_deltas(streamed(text, [1] * len(text))) == parse_tool_calls(text, ids())


def test_a_streamed_call_is_named_first_then_its_arguments_arrive_in_pieces() -> None:
    text = format_tool_call("get_weather", {"city": "Paris"})
    deltas = streamed(text, [1] * len(text))
    (first,) = deltas[0]["tool_calls"]
    assert first == {
        "index": 0,
        "id": "call_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    pieces = [d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:]]
    assert len(pieces) > 5 and "".join(pieces) == '{"city": "Paris"}'
    assert all("content" not in d for d in deltas)


def test_a_partial_tag_is_held_back_until_it_is_clear() -> None:
    stream = ToolCallStream(ids())
    assert stream.feed("Hello <tool") == [{"content": "Hello"}]
    assert stream.feed("_c") == []
    assert stream.feed("hat") == [{"content": " <tool_chat"}]
    assert stream.feed("<") == [] and stream.finish() == [{"content": "<"}]


def test_whitespace_next_to_calls_is_dropped() -> None:
    text = "\n\n" + format_tool_call("a", {}) + "\n\n" + format_tool_call("b", {}) + "\n"
    content, calls = parse_tool_calls(text, ids())
    assert content is None and [c.name for c in calls] == ["a", "b"]


def test_a_broken_call_stays_content() -> None:
    text = "<tool_call>\nnot json at all\n</tool_call>"
    assert parse_tool_calls(text, ids()) == (text, [])


def test_an_unclosed_call_that_parses_still_counts() -> None:
    content, (call,) = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"x": 1}}', ids())
    assert content is None and call.name == "f" and json.loads(call.arguments) == {"x": 1}


def test_a_call_converts_to_openais_shape() -> None:
    assert ToolCall("call_1", "f", "{}").to_openai() == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": "{}"},
    }
