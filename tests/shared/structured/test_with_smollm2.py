"""The real SmolLM2-135M, driven by the engine with a grammar in its sampling params: its
output parses and validates; and a request moved mid-answer goes on under the same grammar."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.sampling_params import SamplingParams
from shared.structured.request import grammar_from_request
from shared.structured.spec import GrammarSpec
from shared.structured.tool_grammar import tool_call_grammar
from shared.structured.tool_parser import parse_tool_calls
from shared.structured.tool_prompt import messages_for_template
from shared.structured.tools import tools_from_request

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 30},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(
        EngineConfig(model="SmolLM2-135M-Instruct", dtype="float32", kv_cache_bytes=64 << 20)
    )


def generate(engine, messages, spec, params) -> str:
    prompt = engine.info.tokenizer.encode_chat(messages)
    (result,) = engine.generate([prompt], dataclasses.replace(params, grammar=spec))
    assert result.finish_reason == "stop", result.text
    return result.text


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_schema_answer_parses_and_validates(engine, temperature) -> None:
    body = {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}
    messages = [{"role": "user", "content": "Describe a person as JSON."}]
    params = SamplingParams(max_tokens=120, temperature=temperature, seed=3)
    text = generate(engine, messages, grammar_from_request(body), params)
    jsonschema.validate(json.loads(text), PERSON)


def test_a_choice_answer_is_one_of_the_choices(engine) -> None:
    choices = ["Paris", "London", "Rome"]
    spec = grammar_from_request({"guided_choice": choices})
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = generate(engine, messages, spec, SamplingParams(max_tokens=8, temperature=0))
    assert text in choices


def test_a_required_tool_call_parses_and_validates(engine) -> None:
    body = {"tools": [WEATHER_TOOL], "tool_choice": "required", "parallel_tool_calls": False}
    choice = tools_from_request(body)
    assert choice is not None
    messages = messages_for_template(
        [{"role": "user", "content": "What's the weather in Paris?"}], choice.offered
    )
    params = SamplingParams(max_tokens=60, temperature=0)
    text = generate(engine, messages, tool_call_grammar(choice), params)
    content, (call,) = parse_tool_calls(text)
    assert content is None and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_TOOL["function"]["parameters"])


def test_a_moved_request_continues_under_its_grammar(engine) -> None:
    """Prefill samples the first tokens, decode goes on from prompt + those (counted as
    output): the answer is the one an unmoved request gives."""
    body = {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}
    spec = grammar_from_request(body)
    prompt = engine.info.tokenizer.encode_chat(
        [{"role": "user", "content": "Describe a person as JSON."}]
    )
    params = SamplingParams(max_tokens=120, temperature=0, grammar=spec)
    (whole,) = engine.generate([prompt], params)
    moved = dataclasses.replace(params, max_tokens=120 - 4, prior_output_tokens=4)
    (rest,) = engine.generate([prompt + whole.token_ids[:4]], moved)
    assert whole.token_ids[:4] + rest.token_ids == whole.token_ids
    jsonschema.validate(json.loads(whole.text), PERSON)


def test_a_grammar_the_vocabulary_cannot_write_ends_with_a_clear_error(engine) -> None:
    """SmolLM2 has no token for the byte 0xF1 that starts this character's UTF-8: the
    request ends with an error the client can act on (a 400), not a worker fault."""
    from shared.engine.output import UNSATISFIABLE_ERROR
    from shared.worker.core import error_code

    prompt = engine.info.tokenizer.encode("Write it:")
    params = SamplingParams(max_tokens=8, grammar=GrammarSpec("regex", "\U0005b58b"))
    request_id = "unsatisfiable"
    engine.add_request(request_id, prompt, params)
    outputs = []
    while engine.has_unfinished:
        outputs += [out for out in engine.step() if out.request_id == request_id]
    last = outputs[-1]
    assert last.finish_reason == "error" and last.error_kind == UNSATISFIABLE_ERROR
    assert "cannot be met" in str(last.stop_reason) and error_code(last.error_kind) == 400
