"""Tools read from requests, rendered into SmolLM2's chat template (which knows no tools),
and forced by the grammar: outputs sampled under it parse into calls whose arguments validate
against the function's parameters."""

from __future__ import annotations

import json

import jsonschema
import pytest

from shared.errors import InvalidRequest
from shared.structured.tool_grammar import tool_call_grammar
from shared.structured.tool_parser import parse_tool_calls
from shared.structured.tool_prompt import messages_for_template, render_tools_system_prompt
from shared.structured.tools import NAMED, REQUIRED, ToolChoice, tools_from_request
from tests.shared.structured.conftest import sample_masked

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
    "required": ["zone"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Now", "parameters": TIME},
    },
    {"type": "function", "function": {"name": "ping"}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME, "ping": {"type": "object"}}
NAMED_TIME = {"type": "function", "function": {"name": "get_time"}}


def test_the_request_gives_the_tools_and_the_choice() -> None:
    assert tools_from_request({}) is None
    assert tools_from_request({"tool_choice": "none"}) is None
    choice = tools_from_request({"tools": TOOLS})
    assert choice is not None and choice.mode == "auto" and choice.forced == ()
    assert [t.name for t in choice.offered] == ["get_weather", "get_time", "ping"]
    assert choice.tools[2].parameters == {"type": "object", "properties": {}}
    named = tools_from_request({"tools": TOOLS, "tool_choice": NAMED_TIME})
    assert (
        named is not None and named.mode == NAMED and [t.name for t in named.forced] == ["get_time"]
    )
    none = tools_from_request({"tools": TOOLS, "tool_choice": "none"})
    assert none is not None and none.offered == () and tool_call_grammar(none) is None


@pytest.mark.parametrize(
    "body, message",
    [
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        ({"tools": {"a": 1}}, "tools must be a list"),
        ({"tools": [{"type": "retrieval"}]}, r"tools\[0\] must be an object of type function"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, r"tools\[0\]\.function"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "same name"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice must be"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "not among the tools",
        ),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_bad_tools_are_invalid_requests(body, message) -> None:
    with pytest.raises(InvalidRequest, match=message):
        tools_from_request(body)


def test_tools_and_tool_turns_render_through_smollm2s_template(tokenizer) -> None:
    choice = tools_from_request({"tools": TOOLS})
    assert choice is not None
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
    ]
    turns = messages_for_template(messages, choice.offered)
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user"]
    assert turns[2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert turns[3]["content"] == (
        '<tool_response>\n{"temp": 21}\n</tool_response>\n<tool_response>\nsunny\n</tool_response>'
    )
    prompt = tokenizer.apply_chat_template(turns)
    assert prompt.startswith("<|im_start|>system\n# Tools\n")
    assert json.dumps(choice.tools[0].to_openai()) in prompt
    assert prompt.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.encode_chat(turns)  # the template takes them


def test_the_tools_prompt_joins_an_existing_system_turn() -> None:
    choice = tools_from_request({"tools": TOOLS[:1]})
    assert choice is not None
    turns = messages_for_template([{"role": "system", "content": "Be brief."}], choice.offered)
    assert turns == [
        {"role": "system", "content": "Be brief.\n\n" + render_tools_system_prompt(choice.tools)}
    ]


@pytest.mark.parametrize(
    "tool_choice, parallel, names",
    [
        ("required", True, set(SCHEMAS)),
        ("required", False, set(SCHEMAS)),
        (NAMED_TIME, True, {"get_time"}),
    ],
)
@pytest.mark.parametrize("seed", range(3))
def test_forced_calls_parse_and_validate(
    compiler, tokenizer, random_logits, tool_choice, parallel, names, seed
) -> None:
    body = {"tools": TOOLS, "tool_choice": tool_choice, "parallel_tool_calls": parallel}
    choice = tools_from_request(body)
    assert isinstance(choice, ToolChoice) and choice.mode in (REQUIRED, NAMED)
    spec = tool_call_grammar(choice)
    assert spec is not None
    matcher = compiler.matcher(spec)
    ids = sample_masked(matcher, random_logits(seed), tokenizer.eos_token_id, seed=seed)
    assert ids[-1] == tokenizer.eos_token_id, tokenizer.decode(ids)
    content, calls = parse_tool_calls(tokenizer.decode(ids))
    assert content is None and calls
    assert len(calls) == 1 or (parallel and tool_choice == "required")
    for call in calls:
        assert call.name in names
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
