"""The OpenAI parameters beyond the basics, through the live stack and the official client:
penalties, logit_bias, min_tokens, n, best_of, echo, structured output, tools; and a 400
for what kvstack lacks."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.e2e.conftest import API_KEY
from tests.e2e.test_serving import expected

MODEL = "SmolLM2-135M-Instruct"
REPEATING = "List the numbers: one, two, one, two, one, two,"


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{stack.api_url}/v1", api_key=API_KEY, max_retries=0, timeout=120
    )


def complete(client, **kwargs):
    return client.completions.create(model=MODEL, temperature=0, **kwargs)


def repeats(token_ids: list[int]) -> int:
    return len(token_ids) - len(set(token_ids))


def test_penalties_match_the_engine_and_cut_repetition(client, reference) -> None:
    prompt_ids = reference.info.tokenizer.encode(REPEATING)
    plain = expected(reference, prompt_ids, 32, ignore_eos=True)
    penalties = dict(frequency_penalty=1.5, presence_penalty=1.0)
    want = expected(reference, prompt_ids, 32, ignore_eos=True, **penalties)
    got = complete(
        client, prompt=REPEATING, max_tokens=32, extra_body={"ignore_eos": True}, **penalties
    )
    assert got.choices[0].text == want.text != plain.text
    assert repeats(want.token_ids) < repeats(plain.token_ids)
    repetition = complete(
        client,
        prompt=REPEATING,
        max_tokens=32,
        extra_body={"ignore_eos": True, "repetition_penalty": 1.5},
    )
    want = expected(reference, prompt_ids, 32, ignore_eos=True, repetition_penalty=1.5)
    assert repetition.choices[0].text == want.text != plain.text


def test_logit_bias_keeps_a_token_out(client, reference) -> None:
    tokenizer = reference.info.tokenizer
    plain = expected(reference, tokenizer.encode(REPEATING), 24, ignore_eos=True)
    banned = plain.token_ids[0]
    got = complete(
        client,
        prompt=REPEATING,
        max_tokens=24,
        logit_bias={str(banned): -100},
        logprobs=0,
        extra_body={"ignore_eos": True},
    )
    tokens = got.choices[0].logprobs.tokens
    assert tokenizer.decode([banned], skip_special_tokens=False) not in tokens
    assert len(tokens) == 24


def test_min_tokens_holds_the_end_back(client) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    kwargs = dict(model=MODEL, messages=messages, temperature=0, max_tokens=64)
    short = client.chat.completions.create(**kwargs)
    assert short.choices[0].finish_reason == "stop"  # EOS
    floor = short.usage.completion_tokens + 10
    held = client.chat.completions.create(**kwargs, extra_body={"min_tokens": floor})
    assert held.usage.completion_tokens >= floor
    cut = complete(client, prompt=REPEATING, max_tokens=32, stop=[","])  # a stop string
    assert cut.usage.completion_tokens < 10
    longer = complete(
        client, prompt=REPEATING, max_tokens=32, stop=[","], extra_body={"min_tokens": 10}
    )
    assert longer.usage.completion_tokens >= 10 and longer.choices[0].finish_reason == "stop"


def test_n_returns_distinct_choices_streamed_and_not(client) -> None:
    kwargs = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a fruit."}],
        n=3,
        temperature=1.0,
        seed=11,
        max_tokens=12,
    )
    whole = client.chat.completions.create(**kwargs)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    texts = [c.message.content for c in whole.choices]
    assert len(set(texts)) > 1  # three draws, not one copied
    assert whole.usage.completion_tokens >= 3
    streamed = ["", "", ""]
    roles = set()
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
            if c.delta.role:
                roles.add(c.index)
    assert streamed == texts  # the same seeds draw the same choices
    assert roles == {0, 1, 2}


def test_best_of_returns_the_likeliest(client) -> None:
    kwargs = dict(prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=3)
    got = client.completions.create(model=MODEL, best_of=4, n=2, logprobs=0, **kwargs)
    assert [c.index for c in got.choices] == [0, 1]
    sums = [sum(c.logprobs.token_logprobs) for c in got.choices]
    assert sums[0] >= sums[1]
    every = client.completions.create(model=MODEL, n=4, logprobs=0, **kwargs)
    best = sorted((sum(c.logprobs.token_logprobs) for c in every.choices), reverse=True)
    assert sums == pytest.approx(best[:2], abs=1e-4)  # the same four draws, ranked


def test_echo_puts_the_prompt_first(client) -> None:
    prompt = "The capital of France is"
    plain = complete(client, prompt=prompt, max_tokens=6)
    echoed = complete(client, prompt=prompt, max_tokens=6, echo=True)
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    text = "".join(
        c.text for chunk in complete(client, prompt=prompt, max_tokens=6, echo=True, stream=True)
        for c in chunk.choices
    )  # fmt: skip
    assert text == echoed.choices[0].text


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"modalities": ["audio"]}, "modalities"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
    ],
)
def test_an_unsupported_parameter_is_a_400_naming_it(client, extra, param) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
            extra_body=extra,
        )  # fmt: skip
    assert info.value.param == param
    assert param in info.value.message


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
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
PARIS = '{"city": "Paris", "unit": "celsius"}'
NOPE = {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}
ASK_WEATHER = [{"role": "user", "content": "What's the weather in Paris?"}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_schema_reply_validates(client, stream) -> None:
    kwargs = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        max_tokens=80,
        temperature=1.0,
        seed=5,
        n=2,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
    )
    if stream:
        texts = ["", ""]
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
    else:
        texts = [c.message.content for c in client.chat.completions.create(**kwargs).choices]
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)


def test_json_object_regex_and_choice(client) -> None:
    ask = 'Return a JSON object with one key "ok" set to true.'
    obj = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ask}], max_tokens=120,
        temperature=0, response_format={"type": "json_object"},
    )  # fmt: skip
    assert obj.choices[0].finish_reason == "stop", obj.choices[0].message.content
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    choices = ["Paris", "London", "Rome"]
    pick = complete(
        client, prompt="The capital of France is", max_tokens=8,
        extra_body={"guided_choice": choices},
    )  # fmt: skip
    assert pick.choices[0].text in choices and pick.choices[0].finish_reason == "stop"
    date = complete(
        client, prompt="A date:", max_tokens=16, extra_body={"guided_regex": r"\d{4}-\d{2}-\d{2}"}
    )
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date.choices[0].text)


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_forced_tool_calls_validate(client, tool_choice) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], tool_choice=tool_choice,
        max_tokens=80, temperature=0,
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(
        model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], tool_choice=tool_choice,
        max_tokens=80, temperature=0, stream=True,
    ):  # fmt: skip
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for piece in c.delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"name": "", "arguments": ""})
                call["name"] += piece.function.name or ""
                call["arguments"] += piece.function.arguments or ""
    assert finish == "tool_calls"
    streamed = [(c["name"], json.loads(c["arguments"])) for c in calls.values()]
    whole = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert streamed == whole


def test_a_tool_result_in_the_history_is_accepted(client) -> None:
    history = [
        *ASK_WEATHER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": PARIS},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]  # fmt: skip
    reply = client.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER], tool_choice="none", max_tokens=24,
        temperature=0,
    )  # fmt: skip
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.choices[0].message.content


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"response_format": NOPE}, "response_format"),
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, None),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)  # fmt: skip
def test_a_bad_constraint_is_a_400(client, extra, param) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=ASK_WEATHER, max_tokens=4, extra_body=extra
        )
    if param is not None:
        assert info.value.param == param


def test_usage_explains_the_ttft(client) -> None:
    prompt = "Tell me about the history of the city of Lyon in France. " * 4
    kwargs = dict(prompt=prompt, max_tokens=4, extra_body={"ignore_eos": True})
    complete(client, **kwargs)  # its blocks are cached from here on
    usage = None
    for chunk in complete(client, stream=True, stream_options={"include_usage": True}, **kwargs):
        usage = chunk.usage or usage
    timing = usage.model_extra["timing"]
    stages = [timing[s] for s in ("conductor", "decode_reserve", "prefix_plan", "prefill_queue",
                                  "prefill_compute", "kv_transfer", "network")]  # fmt: skip
    assert all(s >= 0 for s in stages) and sum(stages) == pytest.approx(timing["ttft"], abs=2e-3)
    assert timing["prefill_compute"] > 0 and timing["conductor"] > 0
    assert timing["decode_first_token"] > 0  # the decode worker sent the second token
    assert timing["cached_tokens"]["local"] == usage.prompt_tokens_details.cached_tokens > 0
