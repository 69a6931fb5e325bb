"""The real SmolLM2-135M, driven by the engine, sampling under the grammar's mask (a runner
whose sample() masks, as the sampler will): its output parses and validates."""

from __future__ import annotations

import json

import jsonschema
import pytest

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.runner import ModelRunner
from shared.engine.sampling_params import SamplingParams
from shared.structured.logits import FINITE_FILL, mask_batch_
from shared.structured.matcher import GrammarMatcher
from shared.structured.request import grammar_from_request
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


class MaskingRunner(ModelRunner):
    """Masks each sampled row with its request's matcher (one request at a time here);
    finite fill, as the sampler refuses rows with -inf."""

    matcher: GrammarMatcher | None = None

    def sample(self, logits, params, generators):
        mask_batch_(logits, [self.matcher], FINITE_FILL)
        token_ids, logprobs = super().sample(logits, params, generators)
        if self.matcher is not None:
            self.matcher.accept(token_ids[0])
        return token_ids, logprobs


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    engine = LLMEngine(
        EngineConfig(model="SmolLM2-135M-Instruct", dtype="float32", kv_cache_bytes=64 << 20)
    )
    engine.use_runner(lambda runner: MaskingRunner(runner.model, runner.storage, runner.backend))
    return engine


def generate(engine, compiler, messages, spec, params) -> str:
    runner = engine._runner
    runner.matcher = compiler.matcher(spec)
    prompt = engine.info.tokenizer.encode_chat(messages)
    (result,) = engine.generate([prompt], params)
    assert result.finish_reason == "stop" and runner.matcher.is_finished, result.text
    return result.text


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_schema_answer_parses_and_validates(engine, compiler, temperature) -> None:
    body = {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}
    messages = [{"role": "user", "content": "Describe a person as JSON."}]
    params = SamplingParams(max_tokens=120, temperature=temperature, seed=3)
    text = generate(engine, compiler, messages, grammar_from_request(body), params)
    jsonschema.validate(json.loads(text), PERSON)


def test_a_choice_answer_is_one_of_the_choices(engine, compiler) -> None:
    choices = ["Paris", "London", "Rome"]
    spec = grammar_from_request({"guided_choice": choices})
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = generate(engine, compiler, messages, spec, SamplingParams(max_tokens=8, temperature=0))
    assert text in choices


def test_a_required_tool_call_parses_and_validates(engine, compiler) -> None:
    body = {"tools": [WEATHER_TOOL], "tool_choice": "required", "parallel_tool_calls": False}
    choice = tools_from_request(body)
    assert choice is not None
    messages = messages_for_template(
        [{"role": "user", "content": "What's the weather in Paris?"}], choice.offered
    )
    params = SamplingParams(max_tokens=60, temperature=0)
    text = generate(engine, compiler, messages, tool_call_grammar(choice), params)
    content, (call,) = parse_tool_calls(text)
    assert content is None and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_TOOL["function"]["parameters"])
