"""The service runner against a real nats-server: health, metrics, heartbeats, discovery,
drain on stop."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import urllib.request

import pytest

from shared import codec, subjects
from shared.messages import Ack, Heartbeat
from shared.runtime.bus import Bus, ServiceUnavailable
from shared.runtime.service import Service, ServiceConfig, serve


@pytest.fixture(scope="module")
def nats_url(secure_nats):
    return secure_nats.url


@pytest.fixture(scope="module")
def admin(secure_nats):
    return secure_nats.auth()


class Echo(Service):
    name = "echo"

    def __init__(self, config: ServiceConfig) -> None:
        super().__init__(config)
        self.drained = self.abandoned = False
        self.calls = self.metrics.counter("calls", "echo calls")

    async def start(self, bus: Bus) -> None:
        await bus.serve("kvstack.test.echo", self._echo, expected=Ack)

    async def _echo(self, msg: Ack) -> Ack:
        self.calls.inc()
        return Ack(msg.request_id, True)

    async def drain(self) -> None:
        self.drained = True

    async def abandon(self) -> None:
        self.abandoned = True


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def test_a_service_lives_beats_answers_and_drains(nats_url, admin) -> None:
    service = Echo(
        ServiceConfig(
            nats_url=nats_url, worker_id="echo-1", heartbeat_interval=0.1, nats_auth=admin
        )
    )
    client = await Bus.connect(nats_url, "test", admin)
    beats: list[Heartbeat] = []
    await client.subscribe(subjects.heartbeat("echo", "echo-1"), lambda hb: _append(beats, hb))
    ready = asyncio.Event()
    task = asyncio.ensure_future(serve(service, ready))
    await asyncio.wait_for(ready.wait(), 10)

    reply = await client.request("kvstack.test.echo", Ack("r1", True), 5, expected=Ack)
    assert reply.ok and reply.request_id == "r1"
    bad = await client.nc.request("kvstack.test.echo", b"garbage", timeout=5)
    assert codec.decode(bad.data, Ack).code == 400
    status, body = await asyncio.to_thread(get, f"http://{service.http_addr}/health")
    assert status == 200 and json.loads(body)["worker_id"] == "echo-1"
    status, metrics = await asyncio.to_thread(get, f"http://{service.http_addr}/metrics")
    assert "kvstack_echo_calls_total 1.0" in metrics
    ping = await client.nc.request("$SRV.PING.kvstack-echo", b"", timeout=5)
    assert json.loads(ping.data)["metadata"]["worker_id"] == "echo-1"
    await asyncio.sleep(0.35)
    assert len(beats) >= 2 and beats[-1].worker_id == "echo-1"

    service.stopped.set()
    await asyncio.wait_for(task, 10)
    assert service.drained and not service.abandoned
    with pytest.raises(ServiceUnavailable):
        await client.request("kvstack.test.echo", Ack("r2", True), 1, expected=Ack)
    await client.drain()
    # The stop is announced: draining first, then a last beat that deregisters it.
    assert [(hb.draining, hb.stopped) for hb in beats[-2:]] == [(True, False), (True, True)]
    assert {hb.instance for hb in beats} == {service.instance}


class Stuck(Echo):
    """Its drain never ends: past the drain timeout what it holds is handed off."""

    async def drain(self) -> None:
        await asyncio.Event().wait()


async def test_a_drain_past_its_timeout_hands_off_what_is_left(nats_url, admin) -> None:
    service = Stuck(
        ServiceConfig(nats_url=nats_url, worker_id="stuck-1", drain_timeout=0.3, nats_auth=admin)
    )
    ready = asyncio.Event()
    task = asyncio.ensure_future(serve(service, ready))
    await asyncio.wait_for(ready.wait(), 10)
    service.stopped.set()
    await asyncio.wait_for(task, 10)
    assert service.abandoned


async def _append(beats: list, hb) -> None:
    beats.append(hb)


class SlowStart(Echo):
    """Its start waits for the test: /health answers meanwhile, /ready does not yet."""

    def __init__(self, config: ServiceConfig) -> None:
        super().__init__(config)
        self.go = asyncio.Event()

    async def start(self, bus: Bus) -> None:
        await self.go.wait()
        await super().start(bus)

    async def drain(self) -> None:
        await asyncio.Event().wait()  # stays draining until the drain timeout


async def test_ready_only_once_started_and_not_while_draining(nats_url, admin) -> None:
    config = ServiceConfig(nats_url=nats_url, worker_id="slow-1", nats_auth=admin)
    service = SlowStart(dataclasses.replace(config, drain_timeout=2))
    task = asyncio.ensure_future(serve(service))
    while not service.http_addr:
        await asyncio.sleep(0.02)
    url = f"http://{service.http_addr}"
    assert (await asyncio.to_thread(get, f"{url}/health"))[0] == 200
    status, body = await asyncio.to_thread(get, f"{url}/ready")
    assert status == 503 and json.loads(body)["status"] == "not ready"
    service.go.set()
    while not service.started:
        await asyncio.sleep(0.02)
    status, body = await asyncio.to_thread(get, f"{url}/ready")
    assert status == 200 and json.loads(body) == {"status": "ready", "worker_id": "slow-1"}
    service.stopped.set()
    while not service.draining:
        await asyncio.sleep(0.02)
    assert (await asyncio.to_thread(get, f"{url}/ready"))[0] == 503
    await asyncio.wait_for(task, 20)


class Fenced(Echo):
    def __init__(self, config: ServiceConfig) -> None:
        super().__init__(config)
        self.lost: list[float] = []

    async def lease_lost(self, silent_for: float) -> None:
        self.lost.append(silent_for)


async def test_a_lease_run_out_gives_the_work_up_once_until_a_beat_renews_it(
    nats_url, admin
) -> None:
    config = ServiceConfig(nats_url=nats_url, worker_id="fenced-1", nats_auth=admin)
    service = Fenced(dataclasses.replace(config, heartbeat_interval=0.1))
    task = asyncio.ensure_future(serve(service))
    while service.lease.renewed_at is None:  # the first beat reached NATS
        await asyncio.sleep(0.02)
    assert not service.lease.expired() and service.lost == []
    service.lease.renewed_at -= 5.0  # as after a freeze or a partition of 5 s
    assert service.lease.expired()
    await service.check_lease()
    await service.check_lease()
    assert len(service.lost) == 1 and service.lost[0] > 4.9
    while service.fenced:  # the next beat that reaches NATS renews it
        await asyncio.sleep(0.02)
    assert not service.lease.expired()
    service.stopped.set()
    await asyncio.wait_for(task, 10)


async def test_an_own_beat_that_waited_out_a_freeze_renews_no_lease(nats_url, admin) -> None:
    """A beat reaches NATS just before SIGSTOP and waits in the frozen process's socket;
    read after the thaw, it counts as of when it was sent, so the lease stays run out."""
    config = ServiceConfig(nats_url=nats_url, worker_id="fenced-2", nats_auth=admin)
    service = Fenced(dataclasses.replace(config, heartbeat_interval=5.0))
    task = asyncio.ensure_future(serve(service))
    while service.lease.renewed_at is None:
        await asyncio.sleep(0.02)
    service.lease.renewed_at -= 30.0  # frozen for 30 s
    await service.check_lease()
    beat = dataclasses.replace(service.heartbeat(), instance=service.instance)
    subject = subjects.heartbeat(service.name, service.worker_id)
    await service.live_bus.publish(subject, dataclasses.replace(beat, time=time.time() - 29.0))
    await service.live_bus.nc.flush()
    await asyncio.sleep(0.3)
    assert service.lease.expired() and service.fenced and len(service.lost) == 1
    await service.live_bus.publish(subject, dataclasses.replace(beat, time=time.time()))
    while service.fenced:  # a beat sent now renews it
        await asyncio.sleep(0.02)
    assert not service.lease.expired()
    service.stopped.set()
    await asyncio.wait_for(task, 10)
