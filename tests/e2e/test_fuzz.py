"""Fuzzing a live stack: schemathesis against the gateway's own OpenAPI document, known-bad
inputs and slow clients. Every answer is a documented status with an OpenAI error object
for errors, never a 5xx; real answers fit the document; afterwards every service still
serves and the KV blocks in use are back to where they were.

A gateway of its own joins the session stack (its conductor, prefill and decode workers):
a 2 s read timeout, so slow clients are cut off quickly, and at most 8 output tokens in a
64-token context, so the fuzzed requests that do generate are short. Its document is the
same as every gateway's; only the limits the document leaves to flags differ.
"""

from __future__ import annotations

import gzip
import json
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest
from openapi_schema_validator import OAS31Validator

from bench.chaos.runner import kv_in_use, settle_kv
from services.cli.fuzz import table
from services.cli.fuzz_runner import FuzzConfig, fuzz
from services.cli.main import main
from services.gateway.openapi import OPENAPI
from services.stack import process as stack_process
from services.stack.stack import Stack
from tests.e2e.conftest import API_KEY, GATEWAY_ARGS, free_port

MODEL = "SmolLM2-135M-Instruct"
READ_TIMEOUT_S = 2.0
FUZZ_GATEWAY = (
    "--read-timeout",
    f"{READ_TIMEOUT_S:g}",
    "--max-tokens-limit",
    "8",
    "--max-model-len",
    "64",
)
MAX_EXAMPLES = 40  # per operation and mode: ~230 cases, some 15 s here


@pytest.fixture(scope="module")
def baseline(stack) -> dict[str, int]:
    """KV blocks in use per worker before anything here ran."""
    return kv_in_use(stack)


@pytest.fixture(scope="module")
def gateway(stack, baseline) -> Iterator[str]:
    port = free_port()
    args = [
        "gateway",
        "--worker-id",
        "gateway-fuzz",
        "--model",
        MODEL,
        "--host",
        stack.config.host,
        "--http-port",
        str(port),
        *GATEWAY_ARGS,
        "--api-key",
        API_KEY,
        *FUZZ_GATEWAY,
    ]
    process = stack.spawn("gateway-fuzz", args)
    url = f"http://{stack.config.host}:{port}"
    try:
        wait_healthy(url, stack)
        yield url
    finally:
        stack_process.terminate([process], 30)
        stack.processes.remove(process)


def wait_healthy(url: str, stack: Stack, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while status_of(f"{url}/health") != 200:
        stack.check_alive()
        assert time.monotonic() < deadline, f"{url} never became healthy"
        time.sleep(0.2)


def status_of(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def call(
    url: str, path: str, body: bytes, headers: dict[str, str] | None = None, method: str = "POST"
) -> tuple[int, dict, bytes]:
    headers = {
        "Authorization": f"Bearer {API_KEY}",
        "Content-Type": "application/json",
        **(headers or {}),
    }
    request = urllib.request.Request(url + path, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def assert_serving(stack: Stack, urls: list[str], baseline: dict[str, int]) -> None:
    """Every process alive, a normal request answered by each gateway, KV back to before."""
    stack.check_alive()
    body = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 4}).encode()
    for url in urls:
        status, _, answer = call(url, "/v1/completions", body)
        assert status == 200, answer
        assert json.loads(answer)["usage"]["completion_tokens"] == 4
    after = settle_kv(stack, baseline, timeout=30)
    assert all(n <= baseline.get(w, 0) for w, n in after.items()), (baseline, after)


def validator(name: str) -> OAS31Validator:
    return OAS31Validator(
        {"$ref": f"#/components/schemas/{name}", "components": OPENAPI["components"]}
    )


def assert_fits(name: str, body) -> None:
    problems = [e.message for e in validator(name).iter_errors(body)]
    assert not problems, (name, problems, body)


# -- the document against real answers ---------------------------------------------------------


def sse_events(raw: bytes) -> list:
    lines = [line for line in raw.decode().split("\n\n") if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]


@pytest.mark.parametrize(
    "path,request_body,schema",
    [
        ("/v1/completions", {"prompt": "Hello", "max_tokens": 3, "logprobs": 2}, "Completion"),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 3,
                "logprobs": True,
                "top_logprobs": 2,
            },
            "ChatCompletion",
        ),
    ],
)
def test_real_answers_fit_the_document(gateway, path, request_body, schema) -> None:
    status, headers, body = call(gateway, path, json.dumps(request_body).encode())
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert_fits(schema, json.loads(body))
    streamed = {**request_body, "stream": True, "stream_options": {"include_usage": True}}
    status, headers, body = call(gateway, path, json.dumps(streamed).encode())
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(body)
    assert len(events) >= 2 and events[-1]["usage"]["completion_tokens"] == 3
    for event in events:
        assert_fits(f"{schema}Chunk", event)


def test_the_other_routes_fit_the_document(gateway) -> None:
    assert_fits("ModelList", json.loads(call(gateway, "/v1/models", None, method="GET")[2]))
    assert_fits("Health", json.loads(call(gateway, "/health", None, method="GET")[2]))
    status, _, body = call(gateway, "/openapi.json", None, {"Authorization": ""}, "GET")
    assert status == 200 and json.loads(body) == OPENAPI
    status, headers, _ = call(gateway, "/metrics", None, method="GET")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")


# -- schemathesis ---------------------------------------------------------------------------------


def test_schemathesis_finds_nothing(stack, gateway, baseline) -> None:
    began = time.monotonic()
    reports = fuzz(FuzzConfig(gateway, API_KEY, max_examples=MAX_EXAMPLES, seed=0))
    summary = table(reports)
    print(f"\n{summary}\nfuzzing took {time.monotonic() - began:.0f}s")
    failures = [f for report in reports for f in report.failures]
    assert not failures, f"{summary}\n\n" + "\n".join(failures[:3])
    assert sum(report.cases for report in reports) >= 4 * MAX_EXAMPLES
    generated = sum(r.statuses[200] for r in reports if r.operation.startswith("POST"))
    assert generated >= MAX_EXAMPLES // 2  # the fuzz reached the workers too
    assert_serving(stack, [gateway, stack.api_url], baseline)


def test_the_fuzz_command_prints_its_table(gateway, capsys) -> None:
    argv = [
        "fuzz",
        "--base-url",
        gateway,
        "--api-key",
        API_KEY,
        "--max-examples",
        "3",
        "--seed",
        "1",
    ]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "operation",
        "mode",
        "cases",
        "2xx",
        "4xx",
        "5xx",
        "failed",
        "seconds",
    ]
    assert any(line.startswith("POST /v1/chat/completions") for line in lines)
    assert lines[-1].startswith("total") and lines[-1].split()[2] == "0"  # nothing failed


# -- known-bad inputs ----------------------------------------------------------------------------


def completion(**fields) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 2, **fields}).encode()


def chat(messages) -> bytes:
    return json.dumps({"model": MODEL, "messages": messages, "max_tokens": 2}).encode()


COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
KNOWN_BAD = [
    ("prompt of the wrong type", COMPLETIONS, completion(prompt=5), {}, 400),
    ("max_tokens as a string", COMPLETIONS, completion(max_tokens="4"), {}, 400),
    ("messages as a string", CHAT, json.dumps({"messages": "hi"}).encode(), {}, 400),
    ("stream as a string", COMPLETIONS, completion(stream="yes"), {}, 400),
    ("a huge max_tokens", COMPLETIONS, completion(max_tokens=10**30), {}, 400),
    ("a negative max_tokens", COMPLETIONS, completion(max_tokens=-1), {}, 400),
    ("a huge temperature", COMPLETIONS, completion(temperature=1e308), {}, 400),
    ("a seed past 64 bits", COMPLETIONS, completion(seed=2**70), {}, 400),
    ("a negative top_k", COMPLETIONS, completion(top_k=-5), {}, 400),
    ("a huge logprobs", COMPLETIONS, completion(logprobs=10**6), {}, 400),
    ("a tiny top_p", COMPLETIONS, completion(top_p=5e-324), {}, 200),
    ("NaN", COMPLETIONS, b'{"prompt": "Hello", "temperature": NaN}', {}, 400),
    ("Infinity", COMPLETIONS, b'{"prompt": "Hello", "top_p": Infinity}', {}, 400),
    ("-Infinity", COMPLETIONS, b'{"prompt": "Hello", "min_p": -Infinity}', {}, 400),
    ("a number past double range", COMPLETIONS, b'{"prompt": "Hello", "seed": 1e999}', {}, 400),
    ("invalid UTF-8 in a string", COMPLETIONS, b'{"prompt": "\xff\xfe"}', {}, 400),
    ("invalid UTF-8 as the body", COMPLETIONS, b"\xc3\x28\xa0\xa1", {}, 400),
    ("a lone surrogate escape", COMPLETIONS, b'{"prompt": "\\ud800"}', {}, 400),
    (
        "JSON nested 10000 deep",
        COMPLETIONS,
        b'{"prompt": ' + b"[" * 10000 + b"]" * 10000 + b"}",
        {},
        400,
    ),
    ("a JSON array as the body", COMPLETIONS, b"[]", {}, 400),
    ("an empty body", COMPLETIONS, b"", {}, 400),
    ("an unknown role", CHAT, chat([{"role": "wizard", "content": "hi"}]), {}, 400),
    ("empty messages", CHAT, chat([]), {}, 400),
    ("an empty message", CHAT, chat([{}]), {}, 400),
    ("null content", CHAT, chat([{"role": "user", "content": None}]), {}, 400),
    ("thousands of stop strings", COMPLETIONS, completion(stop=["a"] * 5000), {}, 400),
    ("a stop string of 100k characters", COMPLETIONS, completion(stop="a" * 100_000), {}, 400),
    ("thousands of stop token ids", COMPLETIONS, completion(stop_token_ids=[1] * 5000), {}, 400),
    ("a prompt past the context", COMPLETIONS, completion(prompt="word " * 200), {}, 400),
    ("token ids past the context", COMPLETIONS, completion(prompt=[1] * 64), {}, 400),
    ("a token id out of vocabulary", COMPLETIONS, completion(prompt=[1, 49152]), {}, 400),
    ("a token id past 64 bits", COMPLETIONS, completion(prompt=[2**64]), {}, 400),
    ("a negative token id", COMPLETIONS, completion(prompt=[-1]), {}, 400),
    ("a stop token id out of vocabulary", COMPLETIONS, completion(stop_token_ids=[10**9]), {}, 400),
    ("a gzip header on a plain body", COMPLETIONS, completion(), {"Content-Encoding": "gzip"}, 400),
    (
        "a truncated gzip body",
        COMPLETIONS,
        gzip.compress(completion())[:20],
        {"Content-Encoding": "gzip"},
        400,
    ),
    ("an unknown encoding", COMPLETIONS, completion(), {"Content-Encoding": "compress"}, 415),
    ("a body over the limit", COMPLETIONS, completion(prompt="a" * (5 << 20)), {}, 413),
    (
        "an x-request-id full of odd characters",
        COMPLETIONS,
        completion(),
        {"x-request-id": "../\u00ff*>.$ " * 40},
        200,
    ),
]


@pytest.mark.parametrize(
    "name,path,body,headers,status", KNOWN_BAD, ids=[case[0] for case in KNOWN_BAD]
)
def test_known_bad_input(gateway, name, path, body, headers, status) -> None:
    got, answer_headers, answer = call(gateway, path, body, headers)
    assert got == status, answer[:500]
    assert answer_headers["Content-Type"].startswith("application/json")
    if status >= 400:
        assert_fits("Error", json.loads(answer))


def test_slow_clients_are_cut_off_at_the_read_timeout(gateway) -> None:
    url = urllib.parse.urlparse(gateway)
    began = time.monotonic()
    with (
        socket.create_connection((url.hostname, url.port), timeout=30) as headers_only,
        socket.create_connection((url.hostname, url.port), timeout=30) as body_stalled,
    ):
        headers_only.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        body_stalled.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: "
            f"Bearer {API_KEY}\r\nContent-Length: 100\r\n\r\n{{".encode()
        )
        assert read_to_end(headers_only) == b""  # closed, nothing said
        answer = read_to_end(body_stalled)  # 408, then closed
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
    assert time.monotonic() - began < READ_TIMEOUT_S + 3


def read_to_end(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_the_stack_still_serves_after_the_known_bad_inputs(stack, gateway, baseline) -> None:
    assert_serving(stack, [gateway, stack.api_url], baseline)
