"""The gateway's HTTP edge on real sockets: deadlines for slow clients, header limits,
content encodings, the per-key limit, CORS and constant-time keys, every refusal an
OpenAI error object.

The real GatewayService serves HTTP here exactly as `kvstack gateway` does
(`shared.runtime.service._start_http`), without NATS: every request below is decided before a
request would reach the workers (tests/e2e/test_fuzz.py covers the whole way)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from services.cli.main import build_parser
from services.gateway.cors import parse_origins
from services.gateway.edge import EdgeConfig
from services.gateway.openapi import OPENAPI
from services.gateway.service import GatewayConfig, GatewayService
from shared.errors import KvstackError
from shared.runtime.service import _start_http

KEY = "edge-key"
ORIGIN = "https://app.example"


@contextlib.contextmanager
def serving(config: GatewayConfig) -> Iterator[tuple[str, int]]:
    """The gateway's HTTP server on its own event loop in a thread; (host, port)."""
    service = GatewayService(config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = asyncio.run_coroutine_threadsafe(_start_http(service), loop).result(60)
    try:
        host, port = service.http_addr.rsplit(":", 1)
        yield host, int(port)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(scope="module")
def edge(smollm2_dir) -> Iterator[tuple[str, int]]:
    """An API key, a 1 s read timeout, CORS for ORIGIN."""
    config = GatewayConfig(
        http_port=0, api_key=KEY, edge=EdgeConfig(read_timeout=1.0, cors_origins=(ORIGIN,))
    )
    with serving(config) as address:
        yield address


@pytest.fixture(scope="module")
def limited(smollm2_dir) -> Iterator[tuple[str, int]]:
    """No API key (any bearer is a key of its own), one request in flight per key, CORS off."""
    config = GatewayConfig(http_port=0, edge=EdgeConfig(read_timeout=2.0, max_concurrent_per_key=1))
    with serving(config) as address:
        yield address


# -- clients ------------------------------------------------------------------------------------


def head(
    method: str, path: str, headers: dict[str, str] | None = None, length: int | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def post(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    return head("POST", path, headers, len(body)) + body


def exchange(address: tuple[str, int], raw: bytes) -> tuple[int, dict, bytes]:
    """Send `raw` bytes, read one response: (status, headers, body)."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(raw)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, dict(response.getheaders()), response.read()


def openai_error(response: tuple[int, dict, bytes], status: int, fragment: str = "") -> dict:
    code, headers, body = response
    assert code == status, body
    assert headers["Content-Type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment.lower() in error["message"].lower(), error["message"]
    return error


def seconds_until_closed(sock: socket.socket, trickle: bytes = b"") -> tuple[float, bytes]:
    """Seconds until the server closes `sock` (sending `trickle` one byte per 0.1 s
    meanwhile) and what it sent before closing."""
    began, received = time.monotonic(), b""
    sock.settimeout(0.1)
    for byte in [trickle[i : i + 1] for i in range(len(trickle))] + [b""] * 300:
        try:
            if byte:
                sock.sendall(byte)
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            break
        if not chunk:
            break
        received += chunk
    return time.monotonic() - began, received


# -- slow clients ---------------------------------------------------------------------------------


def test_a_connection_that_sends_nothing_is_closed_after_the_read_timeout(edge) -> None:
    with socket.create_connection(edge) as sock:
        waited, received = seconds_until_closed(sock)
    assert received == b"" and 0.8 <= waited <= 3.0


def test_headers_trickled_forever_are_cut_off_at_the_read_timeout(edge) -> None:
    """Slowloris: a header byte every 0.1 s never completes the head; data arriving does
    not push the deadline back."""
    with socket.create_connection(edge) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n")
        waited, received = seconds_until_closed(sock, b"X-Slow: " + b"a" * 200)
    assert received == b"" and 0.8 <= waited <= 3.0


def test_a_body_that_stops_arriving_gets_408_and_the_connection_closes(edge) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    with socket.create_connection(edge) as sock:
        sock.sendall(head("POST", "/v1/completions", auth, length=100) + b'{"prompt": ')
        waited, received = seconds_until_closed(sock)
    assert 0.8 <= waited <= 3.0
    status_line, _, rest = received.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 408")
    error = json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout"


def test_a_keep_alive_connection_serves_again_within_the_timeout(edge) -> None:
    with socket.create_connection(edge, timeout=5) as sock:
        for _ in range(2):
            sock.sendall(head("GET", "/openapi.json"))
            response = http.client.HTTPResponse(sock)
            response.begin()
            assert response.status == 200 and json.loads(response.read()) == OPENAPI
            time.sleep(0.3)


# -- header limits and malformed HTTP -------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        head("GET", "/v1/models", {"X-Big": "a" * 9000}),
        head("GET", "/v1/models", {f"X-Many-{i}": "1" for i in range(150)}),
        head("GET", "/v1/models?q=" + "a" * 9000),
    ],
    ids=["a header too large", "too many headers", "a request line too long"],
)
def test_oversized_heads_get_431(edge, raw) -> None:
    error = openai_error(exchange(edge, raw), 431, "too large")
    assert error["code"] == "request_header_fields_too_large"


def test_malformed_http_gets_400(edge) -> None:
    error = openai_error(exchange(edge, b"HELLO\r\n\r\n"), 400, "malformed")
    assert error["code"] == "bad_request"


def test_unknown_routes_and_methods(edge) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    openai_error(exchange(edge, head("GET", "/v1/nothing", auth)), 404, "/v1/nothing")
    _, headers, _ = response = exchange(edge, head("DELETE", "/v1/completions", auth))
    openai_error(response, 405, "DELETE")
    assert headers["Allow"] == "POST"


# -- bodies and their encodings --------------------------------------------------------------------


def completion(body: bytes, encoding: str | None = None) -> bytes:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    return post("/v1/completions", body, headers)


def test_a_gzip_header_on_a_body_that_is_not_gzip_is_400(edge) -> None:
    error = openai_error(exchange(edge, completion(b'{"prompt": "hi"}', "gzip")), 400, "gzip")
    assert error["code"] == "invalid_body"


def test_a_gzip_body_is_decoded(edge) -> None:
    raw = completion(gzip.compress(b'{"prompt": "hi", "temperature": 7}'), "gzip")
    error = openai_error(exchange(edge, raw), 400, "temperature")
    assert error["param"] == "temperature"  # parsed: the body was decoded


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, gzip"])
def test_encodings_not_supported_get_415(edge, encoding) -> None:
    error = openai_error(exchange(edge, completion(b"{}", encoding)), 415, "not supported")
    assert error["code"] == "unsupported_content_encoding"


def test_a_gzip_bomb_is_413(edge) -> None:
    bomb = gzip.compress(b"0" * (16 << 20))  # 16 MiB of zeros in ~16 KiB
    openai_error(exchange(edge, completion(bomb, "gzip")), 413, "larger than the limit")


def test_invalid_utf8_and_non_finite_numbers_are_400(edge) -> None:
    for body in (
        b'{"prompt": "\xff\xfe"}',
        b'{"prompt": "hi", "temperature": NaN}',
        b'{"prompt": "hi", "top_p": Infinity}',
        b'{"prompt": "hi", "seed": 1e400}',
    ):
        openai_error(exchange(edge, completion(body)), 400, "not valid JSON")


# -- keys, the per-key limit, CORS ---------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong", f"Bearer {KEY}x", f"bearer {KEY}", "Bearer \u00e9"]
)
def test_a_wrong_key_is_401(edge, authorization) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    error = openai_error(exchange(edge, head("GET", "/v1/models", headers)), 401, "API key")
    assert error["type"] == "authentication_error"


def test_the_openapi_document_needs_no_key(edge) -> None:
    status, _headers, body = exchange(edge, head("GET", "/openapi.json"))
    assert status == 200 and json.loads(body) == OPENAPI


def test_one_request_in_flight_per_key(limited) -> None:
    """A request still sending its body holds its key's one slot: the same key gets 429
    meanwhile, another key does not; once it timed out, the key is free again."""

    def request(key: str) -> tuple[int, dict, bytes]:
        return exchange(
            limited, post("/v1/completions", b'{"prompt": []}', {"Authorization": f"Bearer {key}"})
        )

    with socket.create_connection(limited) as stalled:
        stalled.sendall(head("POST", "/v1/completions", {"Authorization": "Bearer a"}, 50))
        time.sleep(0.3)
        _, headers, _ = response = request("a")
        error = openai_error(response, 429, "in flight")
        assert error["type"] == "rate_limit_error" and headers["Retry-After"] == "1"
        openai_error(request("b"), 400, "prompt is empty")
        seconds_until_closed(stalled)  # its read timeout (408) frees the slot
    openai_error(request("a"), 400, "prompt is empty")


def test_cors_preflight_and_headers_for_the_configured_origin(edge) -> None:
    preflight = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    status, headers, _ = exchange(edge, head("OPTIONS", "/v1/chat/completions", preflight))
    assert status == 204 and headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    _, headers, _ = response = exchange(edge, head("GET", "/v1/models", {"Origin": ORIGIN}))
    openai_error(response, 401, "API key")  # errors carry it too, so browsers can read them
    assert headers["Access-Control-Allow-Origin"] == ORIGIN and headers["Vary"] == "Origin"


def test_cors_refuses_other_origins_and_is_off_by_default(edge, limited) -> None:
    """A preflight CORS does not answer is an ordinary request: 401 without a key, else
    405 (no route takes OPTIONS), and never with Access-Control-Allow-Origin."""
    preflight = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    for address, status in ((edge, 401), (limited, 405)):
        _, headers, _ = response = exchange(address, head("OPTIONS", "/v1/completions", preflight))
        openai_error(response, status)
        assert "Access-Control-Allow-Origin" not in headers
    _, headers, _ = exchange(limited, head("GET", "/openapi.json", {"Origin": ORIGIN}))
    assert "Access-Control-Allow-Origin" not in headers


# -- flags ---------------------------------------------------------------------------------------


def test_the_gateway_flags() -> None:
    args = build_parser().parse_args(
        [
            "gateway",
            "--read-timeout",
            "5",
            "--max-concurrent-per-key",
            "2",
            "--cors-origins",
            "https://a.example, https://b/",
        ]
    )
    assert (args.read_timeout, args.max_concurrent_per_key) == (5.0, 2)
    assert parse_origins(args.cors_origins) == ("https://a.example", "https://b")
    defaults = build_parser().parse_args(["gateway"])
    assert (defaults.read_timeout, defaults.max_concurrent_per_key, defaults.cors_origins) == (
        EdgeConfig.read_timeout,
        0,
        "",
    )


@pytest.mark.parametrize(
    "fields",
    [dict(read_timeout=0), dict(read_timeout=float("nan")), dict(max_concurrent_per_key=-1)],
)
def test_edge_settings_out_of_range_are_refused(fields) -> None:
    with pytest.raises(KvstackError):
        EdgeConfig(**fields)
