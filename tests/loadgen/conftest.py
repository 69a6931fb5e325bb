"""A small OpenAI-style streaming server on a real socket, for the client and runner tests
(the end-to-end test in tests/e2e/test_loadgen.py runs against the real gateway).

It streams `max_tokens` one-token chunks `delay` seconds apart, then a usage chunk and
`[DONE]`, as the kvstack gateway does; `max_tokens == REJECT_MAX_TOKENS` is answered 503,
`DROP_MAX_TOKENS` gets its connection closed before any response byte, `CUT_MAX_TOKENS` after
one token, requests without the key 401, and requests for another model 404."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson
import pytest
from aiohttp import web

from tests.e2e.conftest import free_port

API_KEY = "unit-key"
MODEL = "fake-model"
REJECT_MAX_TOKENS = 13
DROP_MAX_TOKENS = 17
CUT_MAX_TOKENS = 19


@dataclass
class FakeServer:
    delay: float = 0.01
    url: str = ""
    num_finished: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    bodies: list[dict] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.auth])
        app.add_routes(
            [
                web.get("/v1/models", self.models),
                web.post("/v1/completions", self.generate),
                web.post("/v1/chat/completions", self.generate),
            ]
        )
        return app

    @web.middleware
    async def auth(self, request: web.Request, handler):
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            return web.json_response({"error": {"message": "Invalid API key."}}, status=401)
        return await handler(request)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": MODEL, "root": MODEL}]})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if body.get("model") != MODEL:
            return web.json_response({"error": {"message": "no such model"}}, status=404)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        if max_tokens == REJECT_MAX_TOKENS:
            return web.json_response({"error": {"message": "overloaded: queue full"}}, status=503)
        if max_tokens == DROP_MAX_TOKENS:
            return drop_connection(request)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self._stream(request, body, max_tokens)
        finally:
            self.in_flight -= 1

    async def _stream(
        self, request: web.Request, body: dict, max_tokens: int
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(max_tokens):
            await asyncio.sleep(self.delay)
            await response.write(event({"choices": [{"index": 0, "text": "tok"}], "usage": None}))
            if max_tokens == CUT_MAX_TOKENS:
                return drop_connection(request)
        prompt_tokens = len(body.get("prompt") or [])
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "prompt_tokens_details": {"cached_tokens": 3},
        }
        # NOTE: with the chunked body's end in the same write, the client has read the whole
        # response when it sees [DONE], so its connection goes back to the pool.
        await response.write_eof(event({"choices": [], "usage": usage}) + b"data: [DONE]\n\n")
        self.num_finished += 1
        return response


def drop_connection(request: web.Request) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.close()
    return web.StreamResponse()


def event(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def serve_in_thread(
    server: FakeServer, keepalive_timeout: float | None = None
) -> Iterator[FakeServer]:
    """Runs the server's app on its own event loop in a daemon thread until closed;
    `keepalive_timeout`: seconds an idle connection stays open (None: aiohttp's default)."""
    loop = asyncio.new_event_loop()
    options = {} if keepalive_timeout is None else {"keepalive_timeout": keepalive_timeout}
    runner = web.AppRunner(server.app(), **options)
    port = free_port()
    server.url = f"http://127.0.0.1:{port}"

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    yield from serve_in_thread(FakeServer())


BRISK_KEEPALIVE = 0.05


@pytest.fixture
def brisk_server() -> Iterator[FakeServer]:
    """Closes a keep-alive connection after 50 ms idle (llama-server's uvicorn: 5 s)."""
    yield from serve_in_thread(FakeServer(), keepalive_timeout=BRISK_KEEPALIVE)


@pytest.fixture
def slow_server() -> Iterator[FakeServer]:
    """Tokens 50 ms apart: requests stay in flight long enough to be interrupted."""
    yield from serve_in_thread(FakeServer(delay=0.05))
