"""Response JSON: OpenAI's shapes, chunk order (role with the first text, usage last), logprobs."""

from __future__ import annotations

import dataclasses

import openai
import orjson
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from services.gateway.limits import GatewayLimits
from services.gateway.protocol import GenerateRequest, parse_chat, parse_completion
from services.gateway.responses import (
    chat_logprobs,
    completion_logprobs,
    final_response,
    format_logprobs,
    stream_chunk,
    token_text,
    usage,
    usage_chunk,
)
from services.gateway.sse import SSE_DONE, sse_event
from services.gateway.text import TextStream
from shared.logprob import TokenLogprob
from shared.model.tokenizer import Tokenizer

try:  # the HTTP library this openai release is built on
    import httpx2 as httpx
except ImportError:
    import httpx

MODEL = "SmolLM2-135M-Instruct"
LIMITS = GatewayLimits(max_model_len=2048)
REPLY = "Paris is the capital. STOP ignored"


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir) -> Tokenizer:
    return Tokenizer.from_dir(smollm2_dir)


def chat_request(tokenizer, **fields) -> GenerateRequest:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Capital of France?"}],
        **fields,
    }
    return parse_chat(body, tokenizer, LIMITS, MODEL, "r1")


def completion_request(tokenizer, **fields) -> GenerateRequest:
    return parse_completion(
        {"prompt": "Capital of France?", **fields}, tokenizer, LIMITS, MODEL, "r1"
    )


def fake_logprobs(ids: list[int]) -> list[TokenLogprob]:
    return [TokenLogprob(i, -0.5, ((i, -0.5), (17, -2.0))) for i in ids]


def stream_events(req: GenerateRequest, tokenizer, reply_ids: list[int]) -> list[dict]:
    """The chunks a streaming handler sends, built the way the gateway's loop builds them."""
    text = TextStream(tokenizer, req.prompt_token_ids, req.params)
    chunks: list[dict] = []
    for token_id, logprob in zip(reply_ids, fake_logprobs(reply_ids)):
        update = text.push([token_id], [logprob])
        done = update.stopped or text.num_tokens == req.params.max_tokens
        out = update.text + (text.finish() if done else "")
        if out or done:
            chunks.append(
                stream_chunk(
                    req,
                    out,
                    first=not chunks,
                    finish_reason=("stop" if update.stopped else "length") if done else None,
                    logprobs=format_logprobs(req, tokenizer, update.logprobs, update.text_offset),
                )
            )
        if done:
            break
    if req.include_usage:
        chunks.append(usage_chunk(req, usage(req.num_prompt_tokens, text.num_tokens)))
    return chunks


# -- streams ---------------------------------------------------------------------------------------


def test_chat_stream_sends_the_role_with_the_first_text_only(tokenizer) -> None:
    req = chat_request(tokenizer, stream=True, stop=["STOP"])
    chunks = stream_events(req, tokenizer, tokenizer.encode(REPLY))
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert deltas[0]["role"] == "assistant" and deltas[0]["content"]
    assert all("role" not in delta for delta in deltas[1:])
    assert "".join(delta.get("content", "") for delta in deltas) == "Paris is the capital. "
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [
        "stop"
    ]
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk" and "usage" not in chunk
        ChatCompletionChunk.model_validate(chunk)


def test_usage_chunk_comes_last_and_other_chunks_carry_null_usage(tokenizer) -> None:
    req = completion_request(
        tokenizer, stream=True, stream_options={"include_usage": True}, max_tokens=4
    )
    chunks = stream_events(req, tokenizer, tokenizer.encode(REPLY))
    *content, last = chunks
    assert all(chunk["usage"] is None and len(chunk["choices"]) == 1 for chunk in content)
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert last["choices"] == [] and last["object"] == "text_completion"
    assert last["usage"] == {
        "prompt_tokens": req.num_prompt_tokens,
        "completion_tokens": 4,
        "total_tokens": req.num_prompt_tokens + 4,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_chat_usage_chunk(tokenizer) -> None:
    req = chat_request(tokenizer, stream=True, stream_options={"include_usage": True})
    last = usage_chunk(req, usage(10, 3, cached_tokens=8))
    assert last["choices"] == [] and last["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    assert ChatCompletionChunk.model_validate(last).usage.total_tokens == 13


def test_a_finish_only_first_chunk_still_carries_the_role(tokenizer) -> None:
    req = chat_request(tokenizer, stream=True)
    chunk = stream_chunk(req, "", first=True, finish_reason="stop")
    assert chunk["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert stream_chunk(req, "", first=False, finish_reason="stop")["choices"][0]["delta"] == {}


@pytest.mark.parametrize("reason", ["abort", "error", "eos", None])
def test_only_stop_and_length_reach_clients(tokenizer, reason) -> None:
    req = chat_request(tokenizer)
    with pytest.raises(ValueError):
        final_response(req, "x", reason, usage(1, 1))
    if reason is not None:
        with pytest.raises(ValueError):
            stream_chunk(req, "x", first=True, finish_reason=reason)


# -- whole responses ---------------------------------------------------------------------------


def test_completion_response(tokenizer) -> None:
    req = dataclasses.replace(completion_request(tokenizer, logprobs=1), created=1700000000)
    ids = tokenizer.encode("Paris")
    body = final_response(
        req,
        "Paris",
        "stop",
        usage(5, len(ids)),
        format_logprobs(req, tokenizer, fake_logprobs(ids)),
    )
    assert body["id"] == "cmpl-r1" and body["object"] == "text_completion"
    assert body["created"] == 1700000000 and body["model"] == MODEL
    choice = body["choices"][0]
    assert (choice["index"], choice["text"], choice["finish_reason"]) == (0, "Paris", "stop")
    parsed = Completion.model_validate(body)
    assert parsed.choices[0].logprobs.tokens == [tokenizer.decode([i]) for i in ids]


def test_chat_response(tokenizer) -> None:
    req = chat_request(tokenizer)
    body = final_response(req, "Paris.", "length", usage(20, 2, cached_tokens=16))
    assert body["id"] == "chatcmpl-r1" and body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Paris."}
    assert body["choices"][0]["logprobs"] is None
    parsed = ChatCompletion.model_validate(body)
    assert parsed.usage.prompt_tokens_details.cached_tokens == 16


# -- logprobs --------------------------------------------------------------------------------------


def test_completion_logprobs_format(tokenizer) -> None:
    hello, world = tokenizer.encode("Hello world")
    entries = [
        TokenLogprob(hello, -0.1, ((hello, -0.1), (world, -3.0))),
        TokenLogprob(world, float("-inf"), ((hello, -1.0),)),
    ]
    out = completion_logprobs(tokenizer, entries, text_offset=7)
    assert out == {
        "tokens": ["Hello", " world"],
        "token_logprobs": [-0.1, -9999.0],
        "top_logprobs": [{"Hello": -0.1, " world": -3.0}, {"Hello": -1.0, " world": -9999.0}],
        "text_offset": [7, 12],
    }
    orjson.dumps(out)


def test_chat_logprobs_format(tokenizer) -> None:
    (hi,) = tokenizer.encode("Hi")
    out = chat_logprobs(tokenizer, [TokenLogprob(hi, -0.2, ((hi, -0.2), (2, -4.0)))])
    assert out == {
        "content": [
            {
                "token": "Hi",
                "logprob": -0.2,
                "bytes": [72, 105],
                "top_logprobs": [
                    {"token": "Hi", "logprob": -0.2, "bytes": [72, 105]},
                    {"token": "<|im_end|>", "logprob": -4.0, "bytes": list(b"<|im_end|>")},
                ],
            }
        ]
    }


def test_logprobs_only_when_asked(tokenizer) -> None:
    entries = fake_logprobs([5])
    assert format_logprobs(chat_request(tokenizer), tokenizer, entries) is None
    assert "content" in format_logprobs(chat_request(tokenizer, logprobs=True), tokenizer, entries)
    assert "tokens" in format_logprobs(
        completion_request(tokenizer, logprobs=0), tokenizer, entries
    )


def test_token_text_without_a_tokenizer() -> None:
    assert token_text(None, 42) == "token_id:42"


# -- through the openai client -------------------------------------------------------------------


def openai_client(reply: httpx.Response) -> openai.OpenAI:
    transport = httpx.MockTransport(lambda request: reply)
    return openai.OpenAI(
        base_url="http://gateway/v1",
        api_key="k",
        max_retries=0,
        http_client=httpx.Client(transport=transport),
    )


def test_openai_client_reads_a_streamed_chat(tokenizer) -> None:
    req = chat_request(
        tokenizer,
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
        top_logprobs=1,
        stop=["STOP"],
    )
    chunks = stream_events(req, tokenizer, tokenizer.encode(REPLY))
    raw = b"".join(map(sse_event, chunks)) + SSE_DONE
    client = openai_client(
        httpx.Response(200, content=raw, headers={"content-type": "text/event-stream"})
    )
    got = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "?"}], stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in got if c.choices)
    assert text == "Paris is the capital. " and got[-1].usage.completion_tokens > 0
    assert got[0].choices[0].delta.role == "assistant"
    assert got[0].choices[0].logprobs.content[0].top_logprobs


def test_openai_client_reads_a_streamed_completion(tokenizer) -> None:
    req = completion_request(
        tokenizer, stream=True, stream_options={"include_usage": True}, max_tokens=3
    )
    raw = b"".join(map(sse_event, stream_events(req, tokenizer, tokenizer.encode(REPLY))))
    client = openai_client(
        httpx.Response(200, content=raw + SSE_DONE, headers={"content-type": "text/event-stream"})
    )
    got = list(client.completions.create(model=MODEL, prompt="?", stream=True))
    assert "".join(c.choices[0].text for c in got if c.choices) == "Paris is the"
    assert got[-2].choices[0].finish_reason == "length"
    assert got[-1].usage.completion_tokens == 3


def test_openai_client_reads_a_completion(tokenizer) -> None:
    req = completion_request(tokenizer)
    body = final_response(req, "Paris", "stop", usage(5, 1))
    client = openai_client(httpx.Response(200, json=body))
    got = client.completions.create(model=MODEL, prompt="Capital of France?")
    assert got.choices[0].text == "Paris" and got.usage.total_tokens == 6
