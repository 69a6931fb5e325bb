"""The conductor lease and the placed-once records against a real nats-server with
JetStream, under the conductor role's own permissions (shared/auth/roles.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from nats.js.errors import NotFoundError

from services.conductor.lease import LeaseKeeper
from services.conductor.placements import PlacementRecords, record_key
from shared import subjects
from shared.conductor.lease import Lease, LeaseConfig
from shared.messages import Placement
from shared.runtime.bus import Bus

TTL = 0.5


@pytest.fixture
async def buses(secure_nats):
    """Two conductors' connections, with fresh buckets."""
    admin = await Bus.connect(secure_nats.url, "admin", secure_nats.auth())
    for bucket in (subjects.CONDUCTOR_LEASE, subjects.PLACEMENTS):
        with contextlib.suppress(NotFoundError):
            await admin.nc.jetstream().delete_key_value(bucket)
    await admin.nc.close()
    names = ("conductor-a", "conductor-b")
    pair = [await Bus.connect(secure_nats.url, n, secure_nats.auth("conductor", n)) for n in names]
    yield pair
    for bus in pair:
        await bus.nc.close()


async def keeper(bus: Bus, changes: list, ttl: float = TTL) -> LeaseKeeper:
    async def on_change(active: bool) -> None:
        changes.append((bus.name, active, time.monotonic()))

    lease = Lease(LeaseConfig(ttl))
    k = LeaseKeeper(bus.nc.jetstream(timeout=TTL / 2), bus.name, lease, on_change)
    await k.open()
    return k


async def test_one_is_active_and_the_other_takes_over_after_the_ttl(buses) -> None:
    changes: list = []
    a, b = [await keeper(bus, changes) for bus in buses]
    tasks = [asyncio.create_task(k.run()) for k in (a, b)]
    await asyncio.sleep(3 * TTL)  # many renewals and claim attempts
    assert [(name, up) for name, up, _ in changes] in (
        [("conductor-a", True)],
        [("conductor-b", True)],
    )
    active, standby = (a, b) if a.lease.held else (b, a)
    assert not standby.lease.active(time.monotonic())
    first_epoch = active.lease.epoch

    tasks[(a, b).index(active)].cancel()  # the active stops renewing (as if it hung)
    stopped = time.monotonic()
    while not standby.lease.held:
        assert time.monotonic() - stopped < 4 * TTL, "the standby never took over"
        # NOTE: fencing: the stale holder never acts while another holds the lease
        assert active.lease.active(time.monotonic()) or not standby.lease.held
        await asyncio.sleep(0.01)
    took = time.monotonic() - stopped
    assert not active.lease.active(time.monotonic())
    assert standby.lease.epoch > first_epoch
    assert TTL * 0.5 < took < 3 * TTL, took

    await active.step()  # the stale holder tries to renew: refused, it stands by
    assert not active.lease.held
    assert changes[-1][:2] == (str(active), False)
    tasks[(a, b).index(standby)].cancel()


async def test_a_released_lease_is_claimed_at_once(buses) -> None:
    changes: list = []
    a, b = [await keeper(bus, changes) for bus in buses]
    await a.step()
    await b.step()
    assert a.lease.held and not b.lease.held
    await a.release()
    await b.step()
    assert b.lease.held and b.lease.epoch > a.lease.epoch


async def test_a_request_is_placed_once_whoever_asks(buses) -> None:
    first, second = [await PlacementRecords.open(bus.nc.jetstream()) for bus in buses]
    placed = Placement("cmpl-1-a0", True, "prefill-0", "decode-0", epoch=3)
    assert await first.record(placed) == placed
    other = Placement("cmpl-1-a0", True, "prefill-1", "decode-1", epoch=5)
    assert await second.record(other) == placed  # the one on record, not a second one
    odd = Placement("chat.1/x y", True, "prefill-1", "decode-1")
    assert await second.record(odd) == odd
    assert record_key(odd.request_id).startswith("sha256-")


def test_the_lease_config_refuses_nonsense() -> None:
    from shared.errors import KvstackError

    for ttl in (0, -1, 0.01, 600):
        with pytest.raises(KvstackError, match="lease ttl"):
            LeaseConfig(ttl)


async def test_conductors_with_different_lease_ttls_are_refused(buses) -> None:
    from shared.errors import KvstackError

    await keeper(buses[0], [])
    with pytest.raises(KvstackError, match="same --lease-ttl"):
        await keeper(buses[1], [], ttl=2 * TTL)
