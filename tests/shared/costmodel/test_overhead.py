"""Timing first tokens at a gateway, against a small stand-in that streams SSE the way the
real one does after a set delay."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from shared.costmodel.fitted import FittedCostModel
from shared.costmodel.overhead import check_gateway, first_token_seconds, request_overhead
from shared.errors import KvstackError

DELAY = 0.05  # seconds the stand-in waits before its first token


class Gateway(BaseHTTPRequestHandler):
    bodies: ClassVar[list[dict]] = []
    reply: ClassVar[list[bytes]] = [b'data: {"choices": [{"text": "x"}]}\n\n', b"data: [DONE]\n\n"]
    status = 200

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append({**body, "auth": self.headers.get("Authorization")})
        self.send_response(self.status)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'data: {"id": "1", "choices": []}\n\n')  # a role-only event
        self.wfile.flush()
        time.sleep(DELAY)
        for chunk in self.reply:
            self.wfile.write(chunk)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def gateway():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Gateway.bodies, Gateway.status = [], 200
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_first_token_is_timed_and_the_key_sent(gateway) -> None:
    assert DELAY <= first_token_seconds(gateway, [1, 2, 3], api_key="k") < DELAY + 0.5
    body = Gateway.bodies[0]
    assert body["prompt"] == [1, 2, 3] and body["stream"] and body["max_tokens"] == 1
    assert body["auth"] == "Bearer k"


def test_overhead_is_what_the_prefill_does_not_explain(gateway) -> None:
    cost = FittedCostModel("m", (0.0, 1e-4, 0, 0, 0), (0, 0, 0), 1e9, 0.0, 1)
    overhead = request_overhead(cost, gateway, [[1] * 100] * 4)  # 10 ms of prefill each
    assert DELAY - 0.01 <= overhead < DELAY + 0.2
    assert len(Gateway.bodies) == 4  # a warm-up, then three measured


def test_an_http_error_is_a_clear_error(gateway) -> None:
    Gateway.status = 401
    with pytest.raises(KvstackError, match="answered 401"):
        first_token_seconds(gateway, [1])


def test_an_error_event_in_the_stream_is_a_clear_error(gateway, monkeypatch) -> None:
    monkeypatch.setattr(Gateway, "reply", [b'data: {"error": {"message": "no worker"}}\n\n'])
    with pytest.raises(KvstackError, match="no worker"):
        first_token_seconds(gateway, [1])


def test_a_stream_without_a_token_is_a_clear_error(gateway, monkeypatch) -> None:
    monkeypatch.setattr(Gateway, "reply", [b"data: [DONE]\n\n"])
    with pytest.raises(KvstackError, match="without a token"):
        first_token_seconds(gateway, [1])


def test_no_gateway_is_a_clear_error() -> None:
    with pytest.raises(KvstackError, match="cannot reach the gateway"):
        first_token_seconds("http://127.0.0.1:9", [1], timeout=5)
    with pytest.raises(KvstackError, match="cannot reach the gateway"):
        check_gateway("http://127.0.0.1:9")
