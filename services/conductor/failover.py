"""What a conductor among several needs: the lease that says whether it is active, and the
records that keep a request from being placed twice (docs/conductor.md, "Failover")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

from services.conductor.lease import LeaseKeeper, OnChange
from services.conductor.placements import PlacementRecords
from shared.conductor.lease import Lease, LeaseConfig
from shared.messages import Placement
from shared.runtime.bus import Bus


class Failover:
    def __init__(self, config: LeaseConfig, holder: str) -> None:
        self.lease = Lease(config)
        self.holder = holder
        self.keeper: LeaseKeeper | None = None
        self.records: PlacementRecords | None = None
        self.task: asyncio.Task | None = None

    async def start(self, bus: Bus, on_change: OnChange, fail: Callable[[str], None]) -> None:
        """Open the buckets and keep the lease; `fail(why)` if keeping it ever ends
        unexpectedly (a conductor that cannot take part stops, and is restarted)."""
        # NOTE: a lease write that takes longer than half the lease is as good as lost
        lease_js = bus.nc.jetstream(timeout=self.lease.config.ttl / 2)
        replicas = bucket_replicas(len(bus.nc.servers))
        self.keeper = LeaseKeeper(lease_js, self.holder, self.lease, on_change, replicas)
        await self.keeper.open()
        self.records = await PlacementRecords.open(bus.nc.jetstream(timeout=2.0), replicas)
        self.task = asyncio.create_task(self.keeper.run(), name=f"{self.holder}: lease")
        self.task.add_done_callback(lambda task: _check(task, fail))

    def active(self) -> bool:
        return self.lease.active(time.monotonic())

    async def settle(self, placement: Placement) -> Placement:
        """The placement to answer: fenced with this epoch and on record (or the one
        already on record for its request id)."""
        if not placement.accepted or self.records is None:
            return placement
        return await self.records.record(replace(placement, epoch=self.lease.epoch))

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.keeper is not None:
            await self.keeper.release()


def bucket_replicas(num_servers: int) -> int:
    """Copies JetStream keeps of the lease and the records: one per node of a cluster (the
    client knows every node, named or discovered), up to JetStream's limit of 5."""
    return max(1, min(5, num_servers))


def _check(task: asyncio.Task, fail: Callable[[str], None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        fail(f"the lease keeper stopped: {task.exception()!r}")
