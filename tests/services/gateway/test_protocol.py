"""Request parsing: what the gateway accepts, the defaults it fills in, and every 400/404/413."""

from __future__ import annotations

import openai
import orjson
import pytest

from services.gateway.errors import ApiError, error_body
from services.gateway.fields import decode_body
from services.gateway.limits import GatewayLimits
from services.gateway.protocol import parse_chat, parse_completion
from shared.model.tokenizer import Tokenizer

try:  # the HTTP library this openai release is built on
    import httpx2 as httpx
except ImportError:
    import httpx

MODEL = "SmolLM2-135M-Instruct"
LIMITS = GatewayLimits(max_model_len=64)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir) -> Tokenizer:
    return Tokenizer.from_dir(smollm2_dir)


def completion(body, tokenizer, limits=LIMITS, **kwargs):
    return parse_completion(body, tokenizer, limits, MODEL, "req-1", **kwargs)


def chat(body, tokenizer, limits=LIMITS, **kwargs):
    return parse_chat(body, tokenizer, limits, MODEL, "req-1", **kwargs)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def assert_api_error(info: pytest.ExceptionInfo, status: int, param: str | None = None) -> dict:
    err = info.value
    body = error_body(err)
    assert err.status == status
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] and body["error"]["param"] == param
    orjson.dumps(body)
    return body["error"]


# -- accepted requests ---------------------------------------------------------------------------


def test_vllm_bench_serve_completion_request(tokenizer) -> None:
    # The payload `vllm bench serve` sends for random / trace datasets (pre-tokenized prompt).
    body = {
        "model": MODEL,
        "prompt": [11, 22, 33, 44],
        "repetition_penalty": 1.0,
        "max_tokens": 20,
        "logprobs": None,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    req = completion(body, tokenizer)
    assert req.endpoint == "completions" and req.model == MODEL
    assert req.prompt_token_ids == (11, 22, 33, 44)
    assert req.stream and req.include_usage and req.logprobs is None
    assert req.params.max_tokens == 20 and req.params.ignore_eos and req.params.greedy
    assert req.response_id == "cmpl-req-1" and req.num_prompt_tokens == 4


def test_openai_python_chat_request(tokenizer) -> None:
    sent = []

    def capture(request: httpx.Request) -> httpx.Response:
        sent.append(orjson.loads(request.content))
        return httpx.Response(500, json={"error": {"message": "captured"}})

    client = openai.OpenAI(
        base_url="http://gateway/v1",
        api_key="k",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(capture)),
    )
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"},
            ],
            max_completion_tokens=8,
            temperature=0.7,
            top_p=0.9,
            seed=3,
            stop=["\n\n"],
            logprobs=True,
            top_logprobs=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    req = chat(sent[0], tokenizer, GatewayLimits(max_model_len=2048))
    assert req.endpoint == "chat" and req.stream and req.include_usage
    assert req.prompt_token_ids == tuple(tokenizer.encode_chat(sent[0]["messages"]))
    p = req.params
    assert (p.max_tokens, p.temperature, p.top_p, p.seed, p.stop) == (8, 0.7, 0.9, 3, ("\n\n",))
    assert req.logprobs == p.logprobs == 2
    assert req.response_id == "chatcmpl-req-1"


def test_text_prompt_and_one_element_batches(tokenizer) -> None:
    ids = tuple(tokenizer.encode("Hello world"))
    for prompt in ("Hello world", ["Hello world"], list(ids), [list(ids)]):
        assert completion({"prompt": prompt}, tokenizer).prompt_token_ids == ids


def test_defaults_follow_openai(tokenizer) -> None:
    req = completion({"prompt": "Hi"}, tokenizer)
    p = req.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.stop) == (16, 1.0, 1.0, 0, ())
    assert not req.stream and not req.include_usage and req.model == MODEL


def test_aliases_and_unknown_fields(tokenizer) -> None:
    body = {
        "model": "smollm2",
        "prompt": "Hi",
        "user": "x",
        "frequency_penalty": 0.1,
        "some_future_field": {"a": 1},
    }
    assert completion(body, tokenizer, aliases={"smollm2"}).model == MODEL


def test_max_tokens_past_the_context_names_both_numbers(tokenizer) -> None:
    # As vLLM: a requested max_tokens is not cut to fit, it is refused.
    with pytest.raises(ApiError) as info:
        completion({"prompt": list(range(10, 50)), "max_tokens": 30}, tokenizer)
    error = assert_api_error(info, 400, "max_tokens")
    assert error["code"] == "context_length_exceeded"
    assert "maximum context length is 64 tokens" in error["message"]
    assert "requested 70 tokens (40 in the prompt, 30 in the completion)" in error["message"]
    assert (
        completion({"prompt": list(range(10, 50)), "max_tokens": 24}, tokenizer).params.max_tokens
        == 24
    )


def test_a_missing_max_tokens_defaults_to_what_fits(tokenizer) -> None:
    assert completion({"prompt": list(range(10, 20))}, tokenizer).params.max_tokens == 16
    assert completion({"prompt": list(range(10, 60))}, tokenizer).params.max_tokens == 64 - 50
    capped = GatewayLimits(max_model_len=64, max_tokens_limit=8)  # --max-tokens-limit 8
    assert completion({"prompt": [10]}, tokenizer, capped).params.max_tokens == 8


def test_chat_max_tokens_past_the_context_blames_the_field_used(tokenizer) -> None:
    limits = GatewayLimits(max_model_len=2048)
    prompt = chat({"messages": user("Hi")}, tokenizer, limits).num_prompt_tokens
    body = {"messages": user("Hi"), "max_completion_tokens": 2048 - prompt + 1}
    with pytest.raises(ApiError) as info:
        chat(body, tokenizer, limits)
    error = assert_api_error(info, 400, "max_completion_tokens")
    assert f"({prompt} in the messages, {2049 - prompt} in the completion)" in error["message"]


def test_chat_without_max_tokens_may_fill_the_context(tokenizer) -> None:
    limits = GatewayLimits(max_model_len=2048)
    req = chat({"messages": user("Hi")}, tokenizer, limits)
    assert req.params.max_tokens == 2048 - req.num_prompt_tokens
    capped = GatewayLimits(max_model_len=2048, max_tokens_limit=100)
    assert chat({"messages": user("Hi")}, tokenizer, capped).params.max_tokens == 100


def test_chat_prefers_max_completion_tokens(tokenizer) -> None:
    body = {"messages": user("Hi"), "max_tokens": 5, "max_completion_tokens": 7}
    assert chat(body, tokenizer, GatewayLimits(max_model_len=2048)).params.max_tokens == 7


def test_chat_text_parts_are_joined(tokenizer) -> None:
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
    limits = GatewayLimits(max_model_len=2048)
    req = chat({"messages": [{"role": "user", "content": parts}]}, tokenizer, limits)
    assert (
        req.prompt_token_ids
        == chat({"messages": user("Hello\nthere")}, tokenizer, limits).prompt_token_ids
    )


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({}, None),
        ({"logprobs": False}, None),
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": 5}, 5),
    ],
)
def test_chat_logprobs(tokenizer, fields, expected) -> None:
    req = chat({"messages": user("Hi"), **fields}, tokenizer, GatewayLimits(max_model_len=2048))
    assert req.logprobs == req.params.logprobs == expected


def test_sampling_extensions(tokenizer) -> None:
    body = {
        "prompt": "Hi",
        "top_k": -1,
        "stop": "END",
        "stop_token_ids": [2],
        "skip_special_tokens": False,
        "seed": 2**63,
        "min_p": 0.05,
    }
    p = completion(body, tokenizer).params
    assert (p.top_k, p.stop, p.stop_token_ids, p.skip_special_tokens) == (-1, ("END",), (2,), False)
    assert p.min_p == 0.05


def test_sampling_ranges_accept_their_bounds(tokenizer) -> None:
    body = {
        "prompt": "Hi",
        "temperature": 2,
        "top_p": 1,
        "top_k": 1,
        "min_p": 1,
        "stop": ["x" * 1000] * 4,
        "stop_token_ids": [2] * 64,
    }
    p = completion(body, tokenizer).params
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (2, 1, 1, 1)
    assert completion({"prompt": "Hi", "temperature": 1e-320}, tokenizer).params.greedy


def test_temperature_names_openais_range(tokenizer) -> None:
    with pytest.raises(ApiError) as info:
        completion({"prompt": "Hi", "temperature": 3}, tokenizer)
    message = assert_api_error(info, 400, "temperature")["message"]
    assert "between 0 and 2" in message and "OpenAI" in message and "3" in message


def test_slo_fields_travel_with_the_request(tokenizer) -> None:
    req = completion({"prompt": "Hi", "slo_ttft": 2, "slo_tbt": 0.05}, tokenizer)
    assert (req.slo_ttft, req.slo_tbt) == (2.0, 0.05)
    assert completion({"prompt": "Hi"}, tokenizer).slo_ttft == 0.0  # the conductor's default


def test_stream_options_default_to_usage(tokenizer) -> None:
    req = completion({"prompt": "Hi", "stream": True, "stream_options": {}}, tokenizer)
    assert req.include_usage
    off = {"prompt": "Hi", "stream": True, "stream_options": {"include_usage": False}}
    assert not completion(off, tokenizer).include_usage


def test_token_prompt_without_tokenizer_checks_vocab_from_limits() -> None:
    limits = GatewayLimits(max_model_len=64, vocab_size=100)
    assert completion({"prompt": [1, 99]}, None, limits).prompt_token_ids == (1, 99)
    with pytest.raises(ApiError) as info:
        completion({"prompt": [1, 100]}, None, limits)
    assert_api_error(info, 400, "prompt")


def test_limits_default_the_max_tokens_cap() -> None:
    assert GatewayLimits(max_model_len=128).max_tokens_limit == 128
    with pytest.raises(ValueError):
        GatewayLimits(max_model_len=0)


# -- rejected requests -------------------------------------------------------------------------

BAD_COMPLETIONS = [
    ({"prompt": "Hi", "model": "gpt-4"}, 404, "model"),
    ({"prompt": "Hi", "model": 7}, 400, "model"),
    ({"prompt": "Hi", "n": 17}, 400, "n"),
    ({"prompt": "Hi", "n": 3, "best_of": 2}, 400, "best_of"),
    ({"prompt": "Hi", "best_of": 3, "stream": True}, 400, "best_of"),
    ({"prompt": "Hi", "echo": True, "logprobs": 1}, 400, "echo"),
    ({"prompt": "Hi", "suffix": "!"}, 400, "suffix"),
    ({"prompt": "Hi", "logit_bias": {"49152": 5}}, 400, "logit_bias"),
    ({"prompt": "Hi", "logit_bias": {"-3": 5}}, 400, "logit_bias"),
    ({"prompt": "Hi", "logit_bias": {"3": 100.5}}, 400, "logit_bias"),
    ({"prompt": "Hi", "presence_penalty": -2.1}, 400, "presence_penalty"),
    ({"prompt": "Hi", "frequency_penalty": 3}, 400, "frequency_penalty"),
    ({"prompt": "Hi", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ({"prompt": "Hi", "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens"),
    ({"prompt": "Hi", "user": 5}, 400, "user"),
    ({"prompt": ["Hi", "there"]}, 400, "prompt"),
    ({"prompt": [[1, 2], [3]]}, 400, "prompt"),
    ({"prompt": 42}, 400, "prompt"),
    ({"prompt": [1, "a"]}, 400, "prompt"),
    ({}, 400, "prompt"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": [1, 49152]}, 400, "prompt"),
    ({"prompt": [-1]}, 400, "prompt"),
    ({"prompt": list(range(64))}, 400, "prompt"),
    ({"prompt": "Hi", "max_tokens": 65}, 400, "max_tokens"),
    ({"prompt": "Hi", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "Hi", "max_tokens": "10"}, 400, "max_tokens"),
    ({"prompt": "Hi", "max_tokens": 1.5}, 400, "max_tokens"),
    ({"prompt": "Hi", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "Hi", "temperature": -1}, 400, "temperature"),
    ({"prompt": "Hi", "temperature": 2.01}, 400, "temperature"),
    ({"prompt": "Hi", "top_p": 0}, 400, "top_p"),
    ({"prompt": "Hi", "top_p": 1.5}, 400, "top_p"),
    ({"prompt": "Hi", "top_k": -2}, 400, "top_k"),
    ({"prompt": "Hi", "top_k": True}, 400, "top_k"),
    ({"prompt": "Hi", "top_k": 2.5}, 400, "top_k"),
    ({"prompt": "Hi", "min_p": -0.1}, 400, "min_p"),
    ({"prompt": "Hi", "min_p": 1.01}, 400, "min_p"),
    ({"prompt": "Hi", "min_p": "low"}, 400, "min_p"),
    ({"prompt": list(range(10, 50)), "max_tokens": 25}, 400, "max_tokens"),
    ({"prompt": "Hi", "seed": "x"}, 400, "seed"),
    ({"prompt": "Hi", "seed": 2**64}, 400, "seed"),
    ({"prompt": "Hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"prompt": "Hi", "stop": [1]}, 400, "stop"),
    ({"prompt": "Hi", "stop": ""}, 400, "stop"),
    ({"prompt": "Hi", "stop": ["ok", "x" * 1001]}, 400, "stop"),
    ({"prompt": "Hi", "stop_token_ids": [2] * 65}, 400, "stop_token_ids"),
    ({"prompt": "Hi", "stop_token_ids": [1, 10**6]}, 400, "stop_token_ids"),
    ({"prompt": "Hi", "stop_token_ids": "2"}, 400, "stop_token_ids"),
    ({"prompt": "Hi", "ignore_eos": "yes"}, 400, "ignore_eos"),
    ({"prompt": "Hi", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "Hi", "logprobs": True}, 400, "logprobs"),
    ({"prompt": "Hi", "stream": "true"}, 400, "stream"),
    ({"prompt": "Hi", "slo_ttft": 0}, 400, "slo_ttft"),
    ({"prompt": "Hi", "slo_tbt": -0.1}, 400, "slo_tbt"),
    ({"prompt": "Hi", "slo_tbt": "fast"}, 400, "slo_tbt"),
    ({"prompt": "Hi", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"prompt": "Hi", "stream": True, "stream_options": []}, 400, "stream_options"),
    (
        {"prompt": "Hi", "stream": True, "stream_options": {"include_usage": 1}},
        400,
        "stream_options.include_usage",
    ),
]


@pytest.mark.parametrize("body, status, param", BAD_COMPLETIONS)
def test_bad_completion_requests(tokenizer, body, status, param) -> None:
    with pytest.raises(ApiError) as info:
        completion(body, tokenizer)
    assert_api_error(info, status, param)


BAD_CHATS = [
    ({"messages": user("Hi"), "model": "other"}, 404, "model"),
    ({}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": "Hi"}, 400, "messages"),
    ({"messages": ["Hi"]}, 400, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, 400, "messages[0].role"),
    ({"messages": [*user("Hi"), {"role": "function", "content": "{}"}]}, 400, "messages[1].role"),
    ({"messages": [{"content": "Hi"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ({"messages": [{"role": "user", "content": None}]}, 400, "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        400,
        "messages[0].content",
    ),
    ({"messages": user("Hi"), "n": 0}, 400, "n"),
    ({"messages": user("Hi"), "best_of": 2}, 400, "best_of"),
    ({"messages": user("Hi"), "response_format": {"type": "xml"}}, 400, "response_format"),
    ({"messages": user("Hi"), "guided_choice": []}, 400, "guided_choice"),
    ({"messages": user("Hi"), "tool_choice": "required"}, 400, "tool_choice"),
    ({"messages": user("Hi"), "tools": [{"type": "function"}]}, 400, "tools"),
    ({"messages": user("Hi"), "functions": []}, 400, "functions"),
    ({"messages": user("Hi"), "audio": {}}, 400, "audio"),
    ({"messages": user("Hi"), "max_completion_tokens": 5000}, 400, "max_completion_tokens"),
    ({"messages": user("Hi"), "max_tokens": 5000}, 400, "max_tokens"),
    ({"messages": user("Hi"), "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ({"messages": user("Hi"), "logprobs": 3}, 400, "logprobs"),
    ({"messages": user("Hi"), "top_logprobs": 2}, 400, "top_logprobs"),
    ({"messages": user("Hi"), "logprobs": True, "top_logprobs": 50}, 400, "top_logprobs"),
    ({"messages": user("word " * 3000)}, 400, "messages"),
]


@pytest.mark.parametrize("body, status, param", BAD_CHATS)
def test_bad_chat_requests(tokenizer, body, status, param) -> None:
    with pytest.raises(ApiError) as info:
        chat(body, tokenizer, GatewayLimits(max_model_len=2048, max_tokens_limit=1000))
    assert_api_error(info, status, param)


def test_unknown_model_is_a_404_in_openai_shape(tokenizer) -> None:
    with pytest.raises(ApiError) as info:
        completion({"model": "gpt-4", "prompt": "Hi"}, tokenizer)
    error = assert_api_error(info, 404, "model")
    assert error["type"] == "not_found_error" and error["code"] == "model_not_found"
    assert "gpt-4" in error["message"]


def test_too_long_prompt_names_both_lengths(tokenizer) -> None:
    with pytest.raises(ApiError) as info:
        completion({"prompt": list(range(70))}, tokenizer)
    error = assert_api_error(info, 400, "prompt")
    assert "maximum context length is 64 tokens" in error["message"]
    assert "70 tokens" in error["message"] and error["code"] == "context_length_exceeded"


def test_text_needs_a_tokenizer() -> None:
    for parse, body in (
        (completion, {"prompt": "Hi"}),
        (chat, {"messages": user("Hi")}),
        (completion, {"prompt": [1], "stop": "x"}),
    ):
        with pytest.raises(ApiError) as info:
            parse(body, None)
        assert info.value.status == 400


@pytest.mark.parametrize("body", [[1, 2], "text", None, 3])
def test_body_must_be_an_object(tokenizer, body) -> None:
    for parse in (completion, chat):
        with pytest.raises(ApiError) as info:
            parse(body, tokenizer)
        assert_api_error(info, 400)


def test_decode_body() -> None:
    assert decode_body(b'{"prompt": "Hi"}', LIMITS) == {"prompt": "Hi"}
    for raw in (b"[1]", b"{", b"", b"\xff"):
        with pytest.raises(ApiError) as info:
            decode_body(raw, LIMITS)
        assert_api_error(info, 400)
    small = GatewayLimits(max_model_len=64, max_body_bytes=10)
    with pytest.raises(ApiError) as info:
        decode_body(b'{"prompt": "Hello there"}', small)
    assert_api_error(info, 413)


def test_penalties_bias_min_tokens_choices_and_echo_reach_the_request(tokenizer) -> None:
    req = completion(
        {
            "prompt": "Hi there",
            "presence_penalty": 0.5,
            "frequency_penalty": -1,
            "repetition_penalty": 1.2,
            "logit_bias": {"7": -100, "3": 2.5},
            "min_tokens": 2,
            "n": 2,
            "best_of": 3,
            "echo": True,
            "user": "u-1",
        },
        tokenizer,
    )
    p = req.params
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -1, 1.2)
    assert p.logit_bias == ((3, 2.5), (7, -100.0)) and p.min_tokens == 2
    assert (req.n, req.best_of, req.echo) == (2, 3, "Hi there")


def test_tools_and_constraints_reach_the_request(tokenizer) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    plain = chat({"messages": user("Hi")}, tokenizer, GatewayLimits(max_model_len=2048))
    offered = chat(
        {"messages": user("Hi"), "tools": [tool]}, tokenizer, GatewayLimits(max_model_len=2048)
    )
    assert offered.tools is not None and offered.params.grammar is None  # auto: free text
    assert len(offered.prompt_token_ids) > len(plain.prompt_token_ids)  # tools in the prompt
    forced = chat(
        {"messages": user("Hi"), "tools": [tool], "tool_choice": "required"},
        tokenizer,
        GatewayLimits(max_model_len=2048),
    )
    assert forced.params.grammar is not None and forced.grammar_field == "tool_choice"
    none = chat(
        {"messages": user("Hi"), "tools": [tool], "tool_choice": "none"},
        tokenizer,
        GatewayLimits(max_model_len=2048),
    )
    assert none.tools is None and none.prompt_token_ids == plain.prompt_token_ids
    schema = chat({"messages": user("Hi"), "response_format": {"type": "json_object"}}, tokenizer)
    assert schema.params.grammar.kind == "json_object"
    assert schema.grammar_field == "response_format"
