"""Bad input and missing services get the documented status and an OpenAI error object."""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.parse

import pytest

from tests.e2e.conftest import API_KEY, running_stack, worker_stats

MODEL = "SmolLM2-135M-Instruct"


def call(
    base_url: str,
    method: str,
    path: str,
    body=None,
    key: str | None = API_KEY,
    raw: bytes | None = None,
) -> tuple[int, dict, dict]:
    url = urllib.parse.urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    conn.request(method, path, body=data, headers=headers)
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, dict(response.getheaders()), json.loads(payload)


def assert_error(result: tuple[int, dict, dict], status: int, fragment: str) -> dict:
    code, _, body = result
    assert code == status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment.lower() in error["message"].lower(), error["message"]
    return error


def completion(**overrides) -> dict:
    return {"model": MODEL, "prompt": "Hello", "max_tokens": 4, **overrides}


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_missing_or_wrong_key_is_401(stack, key) -> None:
    error = assert_error(
        call(stack.api_url, "POST", "/v1/completions", completion(), key=key), 401, "API key"
    )
    assert error["type"] == "authentication_error"


CASES = [
    ("unknown model", completion(model="gpt-9"), 404, "gpt-9"),
    ("negative temperature", completion(temperature=-1), 400, "temperature"),
    ("temperature of the wrong type", completion(temperature="hot"), 400, "temperature"),
    ("n above sixteen", completion(n=17), 400, "n"),
    ("an unsupported field", completion(suffix="!"), 400, "suffix"),
    ("max_tokens over the limit", completion(max_tokens=10**6), 400, "max_tokens"),
    ("prompt longer than the context", completion(prompt=[1] * 9000), 400, "context length"),
    ("token id outside the vocabulary", completion(prompt=[1, 10**7]), 400, "vocabulary"),
    ("missing prompt", {"model": MODEL}, 400, "prompt"),
    ("chat without messages", {"model": MODEL, "messages": []}, 400, "messages"),
]


@pytest.mark.parametrize("name,body,status,fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_requests(stack, name, body, status, fragment) -> None:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    assert_error(call(stack.api_url, "POST", path, body), status, fragment)


def test_malformed_json_unknown_route_and_huge_body(stack) -> None:
    assert_error(call(stack.api_url, "POST", "/v1/completions", raw=b"{not json"), 400, "JSON")
    assert_error(call(stack.api_url, "GET", "/v1/nothing-here"), 404, "/v1/nothing-here")
    huge = json.dumps(completion(prompt="x" * (5 << 20))).encode()
    assert_error(call(stack.api_url, "POST", "/v1/completions", raw=huge), 413, "")


def test_the_stack_keeps_serving_after_bad_input(stack) -> None:
    for body in (b"\xff\xfe", b"[]", b'{"model": 1}'):
        assert call(stack.api_url, "POST", "/v1/completions", raw=body)[0] == 400
    code, _, body = call(stack.api_url, "POST", "/v1/completions", completion())
    assert code == 200 and body["usage"]["completion_tokens"] == 4


def test_client_disconnect_frees_the_request_on_the_decode_worker(stack) -> None:
    url = urllib.parse.urlparse(stack.api_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    body = completion(max_tokens=400, stream=True, ignore_eos=True, temperature=0)
    conn.request(
        "POST",
        "/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: {")  # decoding now
    busy = worker_stats(stack, "decode", "decode-0")
    assert busy.num_running == 1 and busy.free_blocks < busy.total_blocks
    conn.sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-stream
    response.close()
    conn.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stats = worker_stats(stack, "decode", "decode-0")
        if stats.num_running == 0 and stats.num_reserved == 0:
            break
        time.sleep(0.2)
    assert stats.num_running == 0 and stats.num_reserved == 0
    assert stats.num_requests_done == busy.num_requests_done  # aborted, not run to the end


# No worker or conductor will come: answer after a short wait, not the default 15 s.
QUICK = ("--dtype", "float32", "--placement-wait", "1")


def test_no_workers_gives_503_with_retry_after(tmp_path) -> None:
    with running_stack(tmp_path, num_prefill=0, num_decode=0, gateway_args=QUICK) as bare:
        code, headers, body = call(bare.api_url, "POST", "/v1/completions", completion())
        assert code == 503 and int(headers["Retry-After"]) >= 1
        assert "no prefill worker" in body["error"]["message"]


def test_no_conductor_gives_503(tmp_path) -> None:
    with running_stack(
        tmp_path, num_prefill=0, num_decode=0, with_conductor=False, gateway_args=QUICK
    ) as bare:
        error = assert_error(
            call(bare.api_url, "POST", "/v1/completions", completion()), 503, "conductor"
        )
        assert error["type"] == "service_unavailable_error"
