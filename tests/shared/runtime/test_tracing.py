"""Tracing through the bus against a real nats-server and a stand-in OTLP collector: a
request's trace goes on in the responder and in what it publishes; off, no message
carries headers and nothing of OpenTelemetry is imported."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from shared.messages import Ack
from shared.runtime import tracing
from shared.runtime.bus import Bus
from tests.otlp_collector import Collector, ReceivedSpan

ASKED = "kvstack.test.traced"
TOLD = "kvstack.test.told"


@pytest.fixture
def collector():
    collector = Collector()
    yield collector
    collector.close()


@pytest.fixture
def traced(collector):
    tracing.start("test", collector.url, "test-0")
    yield collector
    tracing.stop()


async def connected(secure_nats, name: str) -> Bus:
    return await Bus.connect(secure_nats.url, name, secure_nats.auth())


def by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {span.name: span for span in spans}


async def test_a_request_carries_its_trace_to_the_responder_and_on(secure_nats, traced) -> None:
    """client -> (request) -> responder -> (publish with a request's span as parent) ->
    subscriber: one trace, each span the child of the one before."""
    client, server = await connected(secure_nats, "client"), await connected(secure_nats, "server")
    spans = tracing.RequestSpans()
    told = asyncio.Event()

    async def respond(msg: Ack) -> Ack:
        with tracing.span("responder"):
            spans.open(msg.request_id, "request", {"kvstack.test": 1})
        # outside the responder's span: the parent is given, not the current one
        await server.publish(TOLD, Ack(msg.request_id, True), parent=spans.get(msg.request_id))
        return Ack(msg.request_id, True)

    async def on_told(msg: Ack) -> None:
        with tracing.span("subscriber"):
            spans.close(msg.request_id, {"kvstack.done": True})
        told.set()

    await server.serve(ASKED, respond, expected=Ack)
    await client.subscribe(TOLD, on_told, expected=Ack)
    # Two connections: the server must hold both subscriptions before the request goes.
    await server.nc.flush()
    await client.nc.flush()
    with tracing.span("client"):
        await client.request(ASKED, Ack("r1", True), 5.0, expected=Ack)
    await asyncio.wait_for(told.wait(), 5)
    await client.drain()
    await server.drain()
    await asyncio.to_thread(tracing.stop)  # exports what is batched

    got = by_name(traced.spans)
    assert set(got) == {"client", "responder", "request", "subscriber"}
    assert len({span.trace_id for span in got.values()}) == 1
    assert got["client"].parent_id == ""
    assert got["responder"].parent_id == got["client"].span_id
    assert got["request"].parent_id == got["responder"].span_id
    assert got["subscriber"].parent_id == got["request"].span_id
    assert got["request"].attributes == {
        "kvstack.request_id": "r1",
        "kvstack.test": 1,
        "kvstack.done": True,
    }
    assert got["client"].service == "kvstack-test"
    assert len(spans) == 0


async def test_a_message_outside_any_trace_goes_without_headers(secure_nats, traced) -> None:
    """Heartbeats and the like: tracing on costs them nothing on the wire."""
    bus = await connected(secure_nats, "plain")
    seen: asyncio.Queue = asyncio.Queue()

    async def on_msg(msg) -> None:
        seen.put_nowait(msg.headers)

    await bus.nc.subscribe(TOLD, cb=on_msg)
    await bus.publish(TOLD, Ack("beat", True))
    with tracing.span("traced"):
        await bus.publish(TOLD, Ack("traced", True))
    untraced, traced_headers = await seen.get(), await seen.get()
    await bus.drain()
    assert untraced is None
    assert set(traced_headers) == {"traceparent"}


async def test_a_failed_request_span_says_why(traced) -> None:
    spans = tracing.RequestSpans()
    spans.open("r2", "request", {})
    spans.close("r2", error="decode worker refused the KV")
    spans.close("r2", error="closed twice: nothing happens")
    await asyncio.to_thread(tracing.stop)
    [span] = traced.spans
    assert span.failed and span.attributes == {"kvstack.request_id": "r2"}


async def test_off_messages_carry_no_headers_and_spans_are_not_kept(secure_nats) -> None:
    assert not tracing.enabled()
    bus = await connected(secure_nats, "off")
    seen: asyncio.Queue = asyncio.Queue()

    async def on_msg(msg) -> None:
        seen.put_nowait(msg.headers)

    await bus.nc.subscribe(TOLD, cb=on_msg)
    spans = tracing.RequestSpans()
    with tracing.span("nothing") as span:
        span.set_attribute("kvstack.ignored", 1)
        spans.open("r3", "request", {})
        await bus.publish(TOLD, Ack("r3", True), parent=spans.get("r3"))
    assert await seen.get() is None
    assert len(spans) == 0
    await bus.drain()


# The services and the bus, imported and their hooks run with tracing off.
OFF_PROGRAM = """
import sys
import services.conductor.service, services.decode.service, services.gateway.service
import services.prefill.service, shared.runtime.bus, shared.runtime.service
from shared.runtime import tracing
with tracing.span("x") as span, tracing.received({"traceparent": "00-1-2-01"}):
    span.set_attributes({"a": 1})
spans = tracing.RequestSpans()
spans.open("r", "request", {})
spans.close("r", error="e")
assert tracing.headers() is None
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""


def test_off_nothing_of_opentelemetry_is_imported() -> None:
    result = subprocess.run(
        [sys.executable, "-c", OFF_PROGRAM], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# What a service started with --otlp-endpoint says where the extra is not installed
# (a None in sys.modules makes the import fail as a missing package does).
MISSING_PROGRAM = """
import sys
sys.modules["opentelemetry"] = None
from shared.runtime import tracing
from shared.errors import KvstackError
try:
    tracing.start("gateway", "http://127.0.0.1:4318")
except KvstackError as e:
    print(e)
"""


def test_asked_for_without_the_extra_it_says_what_to_install() -> None:
    result = subprocess.run(
        [sys.executable, "-c", MISSING_PROGRAM], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'kvstack[tracing]'" in result.stdout
    assert not tracing.enabled()
