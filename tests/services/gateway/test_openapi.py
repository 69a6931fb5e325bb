"""The OpenAPI document (GET /openapi.json): valid OpenAPI 3.1, every route in it, and its
schemas saying what the gateway does: the bodies protocol.py accepts are the ones the
request schemas accept, and what responses.py and errors.py build fits the response
schemas. tests/e2e/test_fuzz.py checks real answers of a running gateway against it."""

from __future__ import annotations

import inspect
import re

import pytest
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from services.gateway import errors
from services.gateway.errors import ApiError, error_body
from services.gateway.limits import GatewayLimits
from services.gateway.model_routes import model_card
from services.gateway.openapi import OPENAPI
from services.gateway.protocol import parse_chat, parse_completion
from services.gateway.responses import (
    final_response,
    format_logprobs,
    stream_chunk,
    usage,
    usage_chunk,
)
from services.gateway.service import GatewayConfig, GatewayService
from shared.logprob import TokenLogprob
from shared.model.tokenizer import Tokenizer

MODEL = "SmolLM2-135M-Instruct"
LIMITS = GatewayLimits(max_model_len=2048)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir) -> Tokenizer:
    return Tokenizer.from_dir(smollm2_dir)


def validator(name: str) -> OAS31Validator:
    """A validator of components/schemas/`name`, its references resolved in the document."""
    return OAS31Validator(
        {"$ref": f"#/components/schemas/{name}", "components": OPENAPI["components"]}
    )


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(OPENAPI)
    assert OPENAPI["openapi"] == "3.1.0"


def openapi_path(route: str) -> str:
    """An aiohttp route as OpenAPI writes it: /v1/models/{model_id:.+} -> {model_id}."""
    return re.sub(r"\{(\w+):[^}]+\}", r"{\1}", route)


def test_every_route_the_gateway_serves_is_documented(smollm2_dir) -> None:
    service = GatewayService(GatewayConfig(http_port=0))
    served = {(route.method.lower(), openapi_path(route.path)) for route in service.routes()}
    # every service serves these two (shared/runtime/service.py)
    served |= {("get", "/health"), ("get", "/metrics")}
    documented = {(method, path) for path, item in OPENAPI["paths"].items() for method in item}
    assert documented == served


def test_every_error_is_documented_as_an_openai_error_object() -> None:
    for path, item in OPENAPI["paths"].items():
        for operation in item.values():
            for status, response in operation["responses"].items():
                if int(status) >= 400 and path not in ("/health", "/ready"):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}, (path, status)


# -- requests: the schema accepts what protocol.py accepts ---------------------------------------

PROMPT = {"prompt": "Hello"}
COMPLETIONS = [
    (PROMPT, True),
    ({"prompt": [1, 2, 3]}, True),
    ({"prompt": ["Hello"]}, True),
    ({"prompt": [[1, 2]]}, True),
    (
        {
            **PROMPT,
            "model": MODEL,
            "max_tokens": None,
            "temperature": 2,
            "top_p": 1,
            "top_k": -1,
            "min_p": 0,
            "seed": -(2**63),
            "stop": ["a", "b", "c", "d"],
            "n": 1,
            "best_of": None,
            "logprobs": 20,
            "echo": False,
            "stream": True,
            "stream_options": {"include_usage": False},
            "stop_token_ids": [0, 2],
            "ignore_eos": True,
            "skip_special_tokens": False,
            "slo_ttft": 0.5,
            "user": "x",
        },
        True,
    ),
    ({**PROMPT, "seed": 2**64 - 1, "stop": "x" * 1000, "temperature": 0}, True),
    ({}, False),
    ({"prompt": ""}, False),
    ({"prompt": []}, False),
    ({"prompt": ["a", "b"]}, False),
    ({"prompt": [-1]}, False),
    ({"prompt": [1.5]}, False),
    ({"prompt": {"text": "hi"}}, False),
    ({**PROMPT, "model": 5}, False),
    ({**PROMPT, "max_tokens": 0}, False),
    ({**PROMPT, "max_tokens": "4"}, False),
    ({**PROMPT, "temperature": 2.01}, False),
    ({**PROMPT, "temperature": -0.1}, False),
    ({**PROMPT, "top_p": 0}, False),
    ({**PROMPT, "top_p": 1.5}, False),
    ({**PROMPT, "top_k": -2}, False),
    ({**PROMPT, "top_k": True}, False),
    ({**PROMPT, "min_p": 1.1}, False),
    ({**PROMPT, "seed": 2**64}, False),
    ({**PROMPT, "seed": -(2**63) - 1}, False),
    ({**PROMPT, "stop": ""}, False),
    ({**PROMPT, "stop": [""]}, False),
    ({**PROMPT, "stop": ["a"] * 5}, False),
    ({**PROMPT, "stop": "x" * 1001}, False),
    ({**PROMPT, "stop_token_ids": [-1]}, False),
    ({**PROMPT, "stop_token_ids": list(range(65))}, False),
    ({**PROMPT, "n": 2}, True),
    ({**PROMPT, "best_of": 3}, True),
    ({**PROMPT, "n": 17}, False),
    ({**PROMPT, "n": 0}, False),
    ({**PROMPT, "presence_penalty": 2, "frequency_penalty": -2, "repetition_penalty": 1.3}, True),
    ({**PROMPT, "presence_penalty": 2.5}, False),
    ({**PROMPT, "frequency_penalty": "1"}, False),
    ({**PROMPT, "repetition_penalty": 0}, False),
    ({**PROMPT, "logit_bias": {"5": -100, "7": 100}, "min_tokens": 3}, True),
    ({**PROMPT, "logit_bias": {"x": 1}}, False),
    ({**PROMPT, "logit_bias": {"5": 101}}, False),
    ({**PROMPT, "logit_bias": {"5": "1"}}, False),
    ({**PROMPT, "min_tokens": -1}, False),
    ({**PROMPT, "logprobs": 21}, False),
    ({**PROMPT, "logprobs": -1}, False),
    ({**PROMPT, "echo": True}, True),
    ({**PROMPT, "echo": 1}, False),
    ({**PROMPT, "stream": "yes"}, False),
    ({**PROMPT, "stream": True, "stream_options": []}, False),
    ({**PROMPT, "ignore_eos": 1}, False),
    ({**PROMPT, "slo_ttft": 0}, False),
    ({**PROMPT, "slo_tbt": -1}, False),
]
USER = {"messages": [{"role": "user", "content": "Hello"}]}
CHATS = [
    (USER, True),
    (
        {
            "messages": [
                {"role": role, "content": "Hi"}
                for role in ("system", "developer", "user", "assistant", "tool")
            ]
        },
        True,
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": "me"}]},
        True,
    ),
    (
        {
            **USER,
            "max_completion_tokens": 4,
            "max_tokens": None,
            "logprobs": True,
            "top_logprobs": 20,
        },
        True,
    ),
    ({}, False),
    ({"messages": []}, False),
    ({"messages": {"role": "user", "content": "Hi"}}, False),
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, False),
    ({"messages": [{"role": 1, "content": "Hi"}]}, False),
    ({"messages": [{"content": "Hi"}]}, False),
    ({"messages": [{"role": "user"}]}, False),
    ({"messages": [{"role": "user", "content": None}]}, False),
    ({"messages": [{"role": "user", "content": []}]}, False),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "url": "x"}]}]}, False),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, False),
    ({"messages": ["Hi"]}, False),
    ({**USER, "max_completion_tokens": 0}, False),
    ({**USER, "logprobs": 1}, False),
    ({**USER, "logprobs": True, "top_logprobs": 21}, False),
    ({**USER, "temperature": 3}, False),
    ({**USER, "n": 3, "presence_penalty": 1, "logit_bias": {"2": -100}, "user": "u"}, True),
    ({**USER, "best_of": 2}, False),
    ({**USER, "echo": True}, False),
    ({**USER, "functions": [{"name": "f"}]}, False),
    ({**USER, "response_format": {"type": "text"}, "tool_choice": "none"}, True),
]


def accepted(parse, body: dict, tokenizer: Tokenizer) -> bool:
    try:
        parse(body, tokenizer, LIMITS, MODEL, "r1")
    except ApiError as e:
        assert e.status == 400, e
        return False
    return True


@pytest.mark.parametrize("body,valid", COMPLETIONS, ids=[str(b)[:60] for b, _ in COMPLETIONS])
def test_completion_schema_accepts_what_the_gateway_accepts(tokenizer, body, valid) -> None:
    assert validator("CompletionRequest").is_valid(body) is valid
    assert accepted(parse_completion, body, tokenizer) is valid


@pytest.mark.parametrize("body,valid", CHATS, ids=[str(b)[:60] for b, _ in CHATS])
def test_chat_schema_accepts_what_the_gateway_accepts(tokenizer, body, valid) -> None:
    assert validator("ChatCompletionRequest").is_valid(body) is valid
    assert accepted(parse_chat, body, tokenizer) is valid


# -- responses: what the gateway builds fits the schemas ----------------------------------------


def assert_fits(name: str, body: dict) -> None:
    errors_found = [e.message for e in validator(name).iter_errors(body)]
    assert not errors_found, (name, errors_found, body)


def entries(ids: list[int]) -> list[TokenLogprob]:
    return [TokenLogprob(i, -0.5, ((i, -0.5), (17, -2.0))) for i in ids]


@pytest.mark.parametrize("logprobs", [None, 2])
def test_completions_and_their_chunks_fit(tokenizer, logprobs) -> None:
    req = parse_completion(
        {**PROMPT, "logprobs": logprobs, "stream": True, "stream_options": {}},
        tokenizer,
        LIMITS,
        MODEL,
        "r1",
    )
    formatted = format_logprobs(req, tokenizer, entries([42, 43]))
    assert_fits("Completion", final_response(req, "Hi", "length", usage(3, 2), formatted))
    assert_fits("CompletionChunk", stream_chunk(req, "Hi", first=True, logprobs=formatted))
    assert_fits("CompletionChunk", stream_chunk(req, "", first=False, finish_reason="stop"))
    assert_fits("CompletionChunk", usage_chunk(req, usage(3, 2, cached_tokens=1, migrations=1)))


@pytest.mark.parametrize("logprobs", [None, 2])
def test_chat_completions_and_their_chunks_fit(tokenizer, logprobs) -> None:
    fields = {"logprobs": True, "top_logprobs": logprobs} if logprobs else {}
    req = parse_chat(
        {**USER, **fields, "stream": True, "stream_options": {}}, tokenizer, LIMITS, MODEL, "r1"
    )
    formatted = format_logprobs(req, tokenizer, entries([42, 43]))
    assert_fits("ChatCompletion", final_response(req, "Hi", "stop", usage(9, 2), formatted))
    assert_fits("ChatCompletionChunk", stream_chunk(req, "Hi", first=True, logprobs=formatted))
    assert_fits("ChatCompletionChunk", stream_chunk(req, " there", first=False))
    assert_fits("ChatCompletionChunk", stream_chunk(req, "", first=False, finish_reason="length"))
    assert_fits("ChatCompletionChunk", usage_chunk(req, usage(9, 2)))


def test_the_model_list_fits() -> None:
    card = model_card(MODEL, "HuggingFaceTB/" + MODEL, 1700000000, 8192)
    assert_fits("ModelList", {"object": "list", "data": [card]})


def every_error() -> list[ApiError]:
    """One of each error errors.py builds (made with placeholder arguments)."""
    made = []
    for _name, build in inspect.getmembers(errors, inspect.isfunction):
        if inspect.signature(build).return_annotation in ("ApiError", ApiError):
            made.append(build(*placeholders(build)))
    return made


def placeholders(build) -> list:
    kinds = {"int": 1, "float": 1.0, "str": "x", "set[str]": {"GET"}, "tuple[str, ...]": ("gzip",)}
    return [
        kinds[p.annotation]
        for p in inspect.signature(build).parameters.values()
        if p.default is inspect.Parameter.empty
    ]


def test_every_error_object_fits() -> None:
    made = every_error()
    assert len(made) >= 15
    for error in made:
        assert_fits("Error", error_body(error))
