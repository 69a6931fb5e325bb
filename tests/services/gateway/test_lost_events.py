"""Token events a worker published just before its NATS connection moved to another node
are lost (NATS core is at most once): the gateway migrates the stream as soon as the
worker's heartbeat says it reconnected and the stream shows a gap or goes silent, instead of
waiting `next_token` (60 s) for events that will never come. Real nats-server; the
conductor, prefill and decode workers are scripted on a second connection."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.gateway.backend import Backend, BackendTimeouts
from services.gateway.protocol import GenerateRequest
from shared import subjects
from shared.messages import (
    Ack,
    Heartbeat,
    Placement,
    PlacementRequest,
    PrefillRequest,
    TokenEvent,
)
from shared.runtime.bus import Bus
from shared.runtime.heartbeats import subscribe_heartbeats
from shared.sampling_params import SamplingParams

MAX_TOKENS = 6
FIRST_ATTEMPT = (7, 8, 9, 10)  # tokens seq 0..3 of the first attempt, one each


class ScriptedWorkers:
    """Conductor, prefill p0 and decode d0. The first attempt's events after `lost_from`
    never reach the gateway (published to a node that died); then d0 beats as a worker
    whose connection was re-established (they beat all along, so only that tells). Later
    attempts run to the end."""

    def __init__(self, bus: Bus, lost_from: int, resumes: bool) -> None:
        self.bus, self.lost_from, self.resumes = bus, lost_from, resumes
        self.submitted: list[PrefillRequest] = []
        self.reconnections = 0

    async def start(self) -> None:
        await self.bus.serve(subjects.place(), self._place, expected=PlacementRequest)
        await self.bus.serve(subjects.prefill_submit("p0"), self._submit)
        await self.beat()
        await self.bus.nc.flush()
        self.bus.tasks.spawn(self._beat_on(), "heartbeats")

    async def _beat_on(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            await self.beat()

    async def beat(self) -> None:
        reconnections = self.reconnections
        for service, worker in (("prefill", "p0"), ("decode", "d0")):
            beat = Heartbeat(
                service, worker, time.time(), 1.0, instance="i", reconnections=reconnections
            )
            await self.bus.publish(subjects.heartbeat(service, worker), beat)

    async def _place(self, request) -> Placement:
        return Placement(request.request_id, True, "p0", "d0")

    async def _submit(self, request: PrefillRequest) -> Ack:
        self.submitted.append(request)
        self.bus.tasks.spawn(self._stream(request), "streaming")
        return Ack(request.request_id, True)

    async def _stream(self, request: PrefillRequest) -> None:
        await asyncio.sleep(0.05)  # after the Ack
        first = len(self.submitted) == 1
        tokens = FIRST_ATTEMPT if first else tuple(range(20, 20 + request.params.max_tokens))
        for seq, token in enumerate(tokens):
            last = not first and seq == len(tokens) - 1
            event = TokenEvent(request.request_id, seq, (token,), finished=last)
            lost = first and seq >= self.lost_from and (seq < len(tokens) - 1 or not self.resumes)
            if not lost:  # NOTE: with `resumes`, the last one arrives: a gap
                await self.bus.publish(subjects.tokens(request.request_id), event)
        if first:
            await self.bus.nc.flush()
            self.reconnections = 1  # d0 is on another node now
            await self.beat()


def generate_request() -> GenerateRequest:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    return GenerateRequest("r1", "completions", "m", (1, 2, 3), params, True, False, None)


@pytest.mark.parametrize("resumes", [True, False], ids=["gap", "silence"])
async def test_events_lost_in_a_workers_reconnection_migrate_the_stream(
    secure_nats, resumes
) -> None:
    admin = secure_nats.auth()
    gateway_bus = await Bus.connect(secure_nats.url, "test-gateway", admin)
    workers_bus = await Bus.connect(secure_nats.url, "test-workers", admin)
    backend = Backend(gateway_bus, BackendTimeouts(next_token=60.0))
    try:
        await subscribe_heartbeats(gateway_bus, _observer(backend))
        workers = ScriptedWorkers(workers_bus, lost_from=2, resumes=resumes)
        await workers.start()
        await _until(lambda: backend.liveness.instance("d0") == "i")
        progress = backend.progress(generate_request())
        started = time.monotonic()
        events = await asyncio.wait_for(_collect(backend, progress), 10.0)
        # the 2 tokens that arrived, then the rest from the migrated attempt: none twice
        assert [t for e in events for t in e.token_ids] == [7, 8, 20, 21, 22, 23]
        assert events[-1].finished and progress.migrations == 1
        assert workers.submitted[1].prompt_token_ids == (1, 2, 3, 7, 8)
        assert time.monotonic() - started < 5.0  # not `next_token`
    finally:
        workers_bus.tasks.cancel()
        await gateway_bus.drain()
        await workers_bus.drain()


def _observer(backend: Backend):
    async def observe(hb: Heartbeat) -> None:
        backend.liveness.observe(hb)

    return observe


async def _collect(backend: Backend, progress) -> list[TokenEvent]:
    return [event async for event in backend.generate(progress)]


async def _until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
