"""SSE framing, and errors: the HTTP error body and the in-stream error event."""

from __future__ import annotations

import openai
import orjson
import pytest

from services.gateway.errors import (
    ApiError,
    authentication_failed,
    body_too_large,
    error_body,
    from_status,
    internal_error,
    invalid_request,
    model_not_found,
    route_not_found,
    service_unavailable,
)
from services.gateway.sse import SSE_DONE, SSE_KEEPALIVE, sse_error, sse_event

try:  # the HTTP library this openai release is built on
    import httpx2 as httpx
except ImportError:
    import httpx


def data_lines(raw: bytes) -> list[bytes]:
    """What a client that splits on blank lines (as vLLM's does) reads back."""
    events = [event for event in raw.split(b"\n\n") if event]
    return [event.removeprefix(b"data: ") for event in events if not event.startswith(b":")]


def test_event_framing() -> None:
    event = sse_event({"text": "a\nb", "n": 1, "usage": None})
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n") == 2
    assert orjson.loads(data_lines(event)[0]) == {"text": "a\nb", "n": 1, "usage": None}
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_keepalive_is_skipped_by_clients() -> None:
    raw = sse_event({"a": 1}) + SSE_KEEPALIVE + SSE_DONE
    assert data_lines(raw) == [b'{"a":1}', b"[DONE]"]


def test_error_event_in_a_started_stream() -> None:
    event = sse_error(service_unavailable("no decode worker answered", retry_after_s=2))
    assert orjson.loads(data_lines(event)[0]) == {
        "error": {
            "message": "no decode worker answered",
            "type": "service_unavailable_error",
            "param": None,
            "code": "service_unavailable",
        }
    }


def test_openai_client_raises_on_an_error_event() -> None:
    raw = sse_event(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "text": "Hi", "logprobs": None, "finish_reason": None}],
        }
    )
    raw += sse_error(internal_error("worker died")) + SSE_DONE
    transport = httpx.MockTransport(
        lambda request: httpx.Response(
            200, content=raw, headers={"content-type": "text/event-stream"}
        )
    )
    client = openai.OpenAI(
        base_url="http://gateway/v1",
        api_key="k",
        max_retries=0,
        http_client=httpx.Client(transport=transport),
    )
    stream = client.completions.create(model="m", prompt="?", stream=True)
    assert next(stream).choices[0].text == "Hi"
    with pytest.raises(openai.APIError, match="worker died"):
        next(stream)


@pytest.mark.parametrize(
    "err, status, type_",
    [
        (invalid_request("bad", param="top_p"), 400, "invalid_request_error"),
        (authentication_failed(), 401, "authentication_error"),
        (model_not_found("gpt-4"), 404, "not_found_error"),
        (route_not_found("GET", "/v2/x"), 404, "not_found_error"),
        (body_too_large(4096), 413, "invalid_request_error"),
        (service_unavailable("busy"), 503, "service_unavailable_error"),
        (internal_error(), 500, "server_error"),
    ],
)
def test_error_helpers(err: ApiError, status: int, type_: str) -> None:
    body = error_body(err)
    assert (err.status, err.type) == (status, type_) == (status, body["error"]["type"])
    assert set(body["error"]) == {"message", "type", "param", "code"} and err.message
    assert str(err) == err.message


def test_retry_after_is_whole_seconds_when_known() -> None:
    assert service_unavailable("busy").headers == {}
    assert service_unavailable("busy", retry_after_s=0.2).headers == {"Retry-After": "1"}
    assert service_unavailable("busy", retry_after_s=2.5).headers == {"Retry-After": "3"}


def test_backend_status_maps_to_an_api_error() -> None:
    assert [from_status(code, "x").status for code in (400, 503, 500, 502)] == [400, 503, 500, 500]
