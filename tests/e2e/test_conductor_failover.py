"""Conductor failover under load: a stack with two conductors (mock workers: no model
computes), the active one SIGKILLed while requests flow. Every request completes, the
standby places within about one lease, and no request id is placed twice.

"Placed twice" is checked where it matters, in the placements the gateway receives: an
admin client hears every reply on the control bus; for each request id every accepted
reply must be the same placement (the one on record, docs/conductor.md), and after the
first placement of the new epoch one of the old epoch may come only as a replay of a record
the old conductor wrote before it died.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import urllib.request
from collections import defaultdict

import openai
import orjson
import pytest

from services.conductor.placements import record_key
from shared import codec, subjects
from shared.engine.mock import MockSpec
from shared.messages import Heartbeat, Placement
from tests.e2e.conftest import running_stack

SPEC = MockSpec("llama3-70b", "a800", 1e-3)
LEASE_TTL = 1.0
CONCURRENCY = 4
LOAD_BEFORE = 3.0  # seconds of load before the kill
LOAD_AFTER = 4.0  # and after it


@pytest.fixture(scope="module")
def stack(tmp_path_factory, smollm2_dir):
    with running_stack(
        tmp_path_factory.mktemp("failover"),
        num_conductors=2,
        lease_ttl=LEASE_TTL,
        num_kvstore=0,
        mock=SPEC,
        worker_args=("--threads", "1", "--kv-cache-gib", "0.02"),
        gateway_args=(),
    ) as s:
        yield s


class Placements:
    """Every placement reply on the bus, with the time it was heard."""

    def __init__(self) -> None:
        self.heard: list[tuple[float, Placement]] = []

    async def on_reply(self, msg) -> None:
        with contextlib.suppress(Exception):  # other replies than placements
            message = codec.decode(msg.data)
            if isinstance(message, Placement) and message.accepted:
                self.heard.append((time.time(), message))

    def by_request(self) -> dict[str, list[Placement]]:
        grouped = defaultdict(list)
        for _, placement in self.heard:
            grouped[placement.request_id].append(placement)
        return grouped


async def conductor_addrs(stack) -> dict[str, str]:
    bus = await stack.bus("test-conductors")
    seen: dict[str, str] = {}

    async def on_beat(msg) -> None:
        beat = codec.decode(msg.data, Heartbeat)
        if beat.service == "conductor":
            seen[beat.worker_id] = beat.http_addr

    sub = await bus.nc.subscribe(subjects.heartbeat("conductor", "*"), cb=on_beat)
    while len(seen) < 2:
        await asyncio.sleep(0.1)
    await sub.unsubscribe()
    await bus.drain()
    return seen


def ready(addr: str) -> dict:
    with urllib.request.urlopen(f"http://{addr}/ready", timeout=5) as response:
        assert response.status == 200  # a standby is ready too: it can take over at once
        return orjson.loads(response.read())


async def active_conductor(addrs: dict[str, str], timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = {name: ready(addr)["status"] for name, addr in addrs.items()}
        if sorted(states.values()) == ["active", "standby"]:
            return next(name for name, state in states.items() if state == "active")
        await asyncio.sleep(0.2)
    raise AssertionError(f"no single active conductor: {states}")


async def load(stack, until: float, results: list) -> None:
    client = openai.AsyncOpenAI(
        base_url=f"{stack.api_url}/v1", api_key="none", max_retries=0, timeout=60
    )
    n = 0
    while time.monotonic() < until:
        n += 1
        try:
            answer = await client.completions.create(
                model="SmolLM2-135M-Instruct",
                prompt=[100 + n % 50] * 40,
                max_tokens=4,
                extra_body={"ignore_eos": True},
            )
            results.append(answer.usage.completion_tokens == 4)
        except Exception as e:
            results.append(e)


async def recorded_at(bus, placement: Placement) -> float:
    """When `placement`'s record was written (the conductors' placements bucket)."""
    bucket = subjects.PLACEMENTS
    key = record_key(placement.request_id)
    record = await bus.nc.jetstream().get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}")
    assert codec.decode(record.data or b"", Placement) == placement
    return record.time.timestamp()


async def test_the_active_conductor_killed_under_load(stack) -> None:
    addrs = await conductor_addrs(stack)
    active = await active_conductor(addrs)
    standby = next(name for name in addrs if name != active)
    placements, results = Placements(), []
    bus = await stack.bus("test-placements")
    await bus.nc.subscribe("_INBOX.>", cb=placements.on_reply)

    began = time.monotonic()
    until = began + LOAD_BEFORE + LOAD_AFTER
    # NOTE: a request the killed conductor held waits out the gateway's 5 s request timeout
    clients = [asyncio.create_task(load(stack, until, results)) for _ in range(CONCURRENCY)]
    await asyncio.sleep(LOAD_BEFORE)
    os.killpg(stack.process(active).popen.pid, signal.SIGKILL)
    killed = time.time()
    await asyncio.gather(*clients)

    failures = [r for r in results if r is not True]
    assert results and not failures, failures[:3]  # 0 lost, each answered in full
    old = {p.epoch for t, p in placements.heard if t < killed}
    assert len(old) == 1 and 0 not in old, old  # one active before, under a lease
    after = [(t, p) for t, p in placements.heard if p.epoch not in old]
    assert after, "no placement after the kill"
    resumed = after[0][0] - killed
    print(
        f"{len(results)} requests, {len(placements.heard)} placements; placements resumed "
        f"{resumed:.2f}s after the kill (lease ttl {LEASE_TTL}s)"
    )
    # NOTE: how soon is a measurement (printed; docs/conductor.md, bench failover), not a
    # test's business: here, before the gateway's --placement-wait (10 s) gave up
    assert resumed < 10, resumed
    # NOTE: after the new epoch's first placement an old one may come only as a replay: a
    # request the old conductor recorded and died before answering, asked again, gets its
    # record (the old epoch) from the new conductor; fresh placements carry the new epoch.
    # Records are timed by the server: one the old conductor sent just before the SIGKILL
    # may be stored just after `killed`, but always before the new conductor's first.
    late = [p for t, p in placements.heard if t >= after[0][0] and p.epoch <= max(old)]
    first_new = await recorded_at(bus, after[0][1])
    assert first_new > killed
    assert all([await recorded_at(bus, p) < first_new for p in late]), late
    twice = {rid: ps for rid, ps in placements.by_request().items() if len(set(ps)) > 1}
    assert not twice, twice  # no request id placed twice
    await bus.drain()
    assert ready(addrs[standby]) == {
        "status": "active",
        "epoch": after[0][1].epoch,
        "worker_id": standby,
    }
