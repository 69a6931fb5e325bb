"""SSE parsing and what one request records (TTFT, ITL, usage, failures)."""

from __future__ import annotations

import time

import aiohttp
import numpy as np
import orjson
import pytest

from loadgen.client import SSEDecoder, StreamClock, Target, carries_text, event_data, send
from loadgen.datasets import Prompt
from tests.e2e.conftest import free_port
from tests.loadgen.conftest import (
    API_KEY,
    BRISK_KEEPALIVE,
    CUT_MAX_TOKENS,
    DROP_MAX_TOKENS,
    MODEL,
    REJECT_MAX_TOKENS,
    event,
)

PROMPT = Prompt(7, np.array([1001, 1002, 1003], dtype=np.int32), 3, 4)


# -- SSE framing ------------------------------------------------------------------------------


def test_events_split_across_chunks_are_put_back_together() -> None:
    decoder = SSEDecoder()
    wire = (
        event({"a": 1}) + b": keepalive\n\n" + event({"b": "\u00e9t\u00e9"}) + b"data: [DONE]\n\n"
    )
    got = []
    for i in range(0, len(wire), 3):  # splits lines, events and the UTF-8 of "é"
        got += decoder.feed(wire[i : i + 3])
    assert got == ['{"a":1}', '{"b":"\u00e9t\u00e9"}', "[DONE]"]


def test_crlf_framing_and_multiline_data() -> None:
    assert SSEDecoder().feed(b"data: one\r\ndata:two\r\n\r\ndata: x") == ["one\ntwo"]
    assert event_data("event: ping\nid: 3") is None


# -- the clock --------------------------------------------------------------------------------


def chunk(text: str | None = None, role: bool = False, usage: dict | None = None) -> str:
    choices = []
    if text is not None or role:
        delta = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        choices = [{"index": 0, "delta": delta}]
    return orjson.dumps({"choices": choices, "usage": usage}).decode()


def test_ttft_itl_and_e2el_from_token_events() -> None:
    clock = StreamClock(sent=10.0)
    clock.on_data(chunk(role=True), 10.1)  # role alone is not a token
    clock.on_data(chunk("Hel"), 10.5)
    clock.on_data(chunk("lo"), 10.75)
    clock.on_data(chunk(""), 10.8)  # empty text is not a token
    clock.on_data(chunk(" you"), 11.25)
    clock.on_data(chunk(usage={"prompt_tokens": 5, "completion_tokens": 3}), 12.0)
    clock.on_data("[DONE]", 12.0)
    record = clock.record(PROMPT, start_time=2.0, queue_time=0.5, status=200, ended=12.0)
    assert record.success and clock.done
    assert record.ttft == pytest.approx(0.5)
    assert record.itl == pytest.approx((0.25, 0.5))
    assert record.latency == pytest.approx(1.25)  # the usage chunk does not extend it
    assert (record.input_len, record.output_len) == (5, 3)
    assert record.tpot == pytest.approx((1.25 - 0.5) / 2)
    assert (record.start_time, record.queue_time, record.index) == (2.0, 0.5, 7)


def test_counts_token_events_when_the_server_sends_no_usage() -> None:
    clock = StreamClock(sent=0.0)
    for i in range(4):
        clock.on_event({"choices": [{"text": "x"}]}, 0.1 * (i + 1))
    record = clock.record(PROMPT, 0.0, 0.0, 200, 1.0)
    assert (record.input_len, record.output_len, record.cached_tokens) == (3, 4, 0)


def test_cached_tokens_from_prompt_tokens_details() -> None:
    clock = StreamClock(sent=0.0)
    clock.on_event({"choices": [{"text": "x"}]}, 0.1)
    clock.on_event(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 9,
                "completion_tokens": 1,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        },
        0.2,
    )
    assert clock.record(PROMPT, 0.0, 0.0, 200, 0.2).cached_tokens == 8


def test_a_stream_without_tokens_failed() -> None:
    clock = StreamClock(sent=0.0)
    clock.on_data("[DONE]", 1.0)
    record = clock.record(PROMPT, 0.0, 0.0, 200, 1.0)
    assert not record.success and record.error == "no token in the response"
    assert record.latency == pytest.approx(1.0)


def test_an_error_event_fails_the_request_with_its_message() -> None:
    clock = StreamClock(sent=0.0)
    clock.on_event({"choices": [{"text": "x"}]}, 0.1)
    clock.on_data(orjson.dumps({"error": {"message": "worker died"}}).decode(), 0.2)
    record = clock.record(PROMPT, 0.0, 0.0, 200, 0.2)
    assert not record.success and "worker died" in record.error


def test_carries_text() -> None:
    assert carries_text([{"text": "a"}]) and carries_text([{"delta": {"content": "b"}}])
    assert carries_text([{"delta": {"reasoning_content": "c"}}])
    assert not carries_text([]) and not carries_text(None)
    assert not carries_text([{"delta": {"role": "assistant"}}])


# -- request bodies -----------------------------------------------------------------------------


def test_completion_and_chat_bodies() -> None:
    target = Target("http://h:1", "m", "completions", "k")
    body = target.body([1, 2], 5)
    assert body["prompt"] == [1, 2] and body["max_tokens"] == 5 and body["ignore_eos"]
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert target.url == "http://h:1/v1/completions"
    assert target.headers(3) == {
        "Content-Type": "application/json",
        "Authorization": "Bearer k",
        "x-request-id": "loadgen-3",
    }
    chat = Target("http://h:1", "m", "chat").body("hi", 5, stream=False)
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert chat["max_completion_tokens"] == 5 and "stream_options" not in chat
    assert Target("http://h:1", "m", "chat").url == "http://h:1/v1/chat/completions"


def test_extra_body_fields_go_in_last() -> None:
    target = Target("http://h:1", "m", extra_body={"min_tokens": 5, "temperature": 0.7})
    body = target.body("some words", 5)
    assert body["min_tokens"] == 5 and body["temperature"] == 0.7
    assert body["prompt"] == "some words"
    assert "x-request-id" not in Target("http://h:1", "m", request_ids=False).headers(3)


# -- over a socket ------------------------------------------------------------------------------


async def send_one(url: str, prompt: Prompt, api_key: str = API_KEY):
    async with aiohttp.ClientSession() as session:
        return await send(session, Target(url, MODEL, api_key=api_key), prompt, time.perf_counter())


async def test_a_streamed_request_over_http(fake_server) -> None:
    record = await send_one(fake_server.url, PROMPT)
    assert record.success, record.error
    assert record.status == 200 and record.output_len == 4 and len(record.itl) == 3
    assert 0 < record.ttft <= record.latency
    assert record.input_len == 3 and record.cached_tokens == 3
    assert fake_server.bodies[0]["prompt"] == [1001, 1002, 1003]  # int32 ids as JSON ints


async def test_503_is_a_rejection_with_the_servers_message(fake_server) -> None:
    record = await send_one(fake_server.url, Prompt(0, np.array([1001]), 1, REJECT_MAX_TOKENS))
    assert not record.success and record.rejected and record.status == 503
    assert record.error == "HTTP 503: overloaded: queue full"


async def test_401_is_recorded_with_its_status(fake_server) -> None:
    record = await send_one(fake_server.url, PROMPT, api_key="wrong")
    assert record.status == 401 and "Invalid API key" in record.error


async def test_no_server_is_status_0() -> None:
    record = await send_one(f"http://127.0.0.1:{free_port()}", PROMPT)
    assert record.status == 0 and not record.success and "Connect" in record.error


# -- connections the server dropped -------------------------------------------------------------


async def test_a_pooled_connection_the_server_closed_is_resent_on_a_fresh_one(
    brisk_server,
) -> None:
    target = Target(brisk_server.url, MODEL, api_key=API_KEY)
    async with aiohttp.ClientSession() as session:
        first = await send(session, target, PROMPT, time.perf_counter())
        # The loop is busy past the server's keep-alive timeout, so the close of the idle
        # pooled connection is not read before the next request takes it from the pool.
        time.sleep(BRISK_KEEPALIVE * 4)
        second = await send(session, target, PROMPT, time.perf_counter())
    assert first.success and second.success, second.error
    assert len(brisk_server.bodies) == 2


async def test_a_connection_dropped_before_any_byte_is_resent_once(fake_server) -> None:
    record = await send_one(fake_server.url, Prompt(0, np.array([1001]), 1, DROP_MAX_TOKENS))
    assert not record.success and record.status == 0 and "disconnected" in record.error
    assert len(fake_server.bodies) == 2  # the first try and one resend


async def test_a_stream_cut_midway_is_an_error_and_not_resent(fake_server) -> None:
    record = await send_one(fake_server.url, Prompt(0, np.array([1001]), 1, CUT_MAX_TOKENS))
    assert not record.success and record.status == 200 and record.ttft is not None
    assert len(fake_server.bodies) == 1
