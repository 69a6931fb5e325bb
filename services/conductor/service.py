"""The conductor service: feeds heartbeats, KV events and finished requests to the
Conductor (shared/conductor/core.py, no I/O) and answers placement requests; metrics and
stats over NATS. With --lease-ttl, one of several conductors answers (the one holding the
lease, failover.py); the others keep their view warm and stand by."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

from aiohttp import web
from nats.errors import Error as NatsError

from services.conductor.failover import Failover
from shared import subjects
from shared.conductor.accuracy import done_pairs, relative_error
from shared.conductor.config import SchedulingConfig
from shared.conductor.core import Conductor
from shared.conductor.lease import LeaseConfig
from shared.costmodel import CostModel
from shared.messages import (
    ConductorStats,
    Heartbeat,
    KVEvent,
    KVResync,
    Placement,
    PlacementRequest,
    RequestDone,
    StatsRequest,
)
from shared.runtime import tracing
from shared.runtime.bus import Bus
from shared.runtime.heartbeats import subscribe_heartbeats
from shared.runtime.metrics import TTFT_BUCKETS
from shared.runtime.service import Service, ServiceConfig

log = logging.getLogger("kvstack.conductor")
ERROR_BUCKETS = (0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.0, 5.0)
# NOTE: not an overload: the gateway asks again, and the active conductor answers
STANDBY = "standby conductor: another one is active"


@dataclass(frozen=True)
class ConductorConfig(ServiceConfig):
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    cost_model: str = ""  # a fitted file or roofline:<model>:<hardware>; see cli
    lease_ttl: float = 0.0  # > 0: one of several conductors, elected by a lease (seconds)


class ConductorService(Service):
    name = "conductor"

    def __init__(self, config: ConductorConfig, cost: CostModel) -> None:
        super().__init__(config)
        self.core = Conductor(config.scheduling, cost)
        self.failover = (
            Failover(LeaseConfig(config.lease_ttl), self.worker_id) if config.lease_ttl else None
        )
        self.serving: list = []  # the subscriptions of the active conductor
        self.placements = self.metrics.counter(
            "placements",
            "placement decisions: accepted, rejected (admission: overload), unplaceable (no "
            "worker could take it)",
            ("result",),
        )
        for result in ("accepted", "rejected", "unplaceable"):
            self.placements.labels(result)
        self.replications = self.metrics.counter(
            "replicated_blocks", "prefix blocks placements pull into a worker (replicas)"
        )
        self.predicted_ttft = self.metrics.histogram(
            "predicted_ttft_seconds", "TTFT predicted for admitted requests", TTFT_BUCKETS
        )
        self.estimate_error = self.metrics.histogram(
            "estimate_error_ratio",
            "|predicted - actual| / actual of finished requests, by estimate",
            ERROR_BUCKETS,
            ("estimate",),
        )
        self.path_overhead = self.metrics.gauge(
            "path_overhead_seconds",
            "the stack's own time before an idle worker's prefill, learned; in predictions",
        )
        self.live_workers = self.metrics.gauge("live_workers", "workers alive", ("service",))
        self.indexed_blocks = self.metrics.gauge("indexed_blocks", "blocks in the prefix index")
        self.pooled_blocks = self.metrics.gauge(
            "pooled_blocks", "blocks in the prefix index that a kvstore holds"
        )
        self.active_gauge = self.metrics.gauge(
            "active", "1 while this conductor places (holds the lease, or runs alone)"
        )
        self.lease_epoch = self.metrics.gauge(
            "lease_epoch", "the lease epoch this conductor places under (0: none held)"
        )

    async def start(self, bus: Bus) -> None:
        # NOTE: a standby hears everything the active one hears: its view is warm when
        # it takes over
        await subscribe_heartbeats(bus, self._on_heartbeat)
        await bus.subscribe(
            subjects.all_kv_events(),
            self._on_kv_event,
            expected=KVEvent,
            sender=lambda event: event.source,
        )
        await bus.subscribe(subjects.request_done(), self._on_done, expected=RequestDone)
        # NOTE: after a restart the index is empty; every cache answers with a snapshot.
        # After a NATS outage events may be lost: the same question rebuilds it.
        await self._resync()
        bus.on_reconnect.append(self._resync)
        if self.failover is None:
            await self._on_lease(True)
        else:
            await self.failover.start(bus, self._on_lease, self.fail)

    async def _on_lease(self, active: bool) -> None:
        """Answer placements and stats while active; stop at once when not."""
        bus = self.live_bus
        self.active_gauge.set(int(active))
        self.lease_epoch.set(self.failover.lease.epoch if self.failover and active else 0)
        if not active:
            for subscription in self.serving:
                with contextlib.suppress(NatsError):  # NATS is gone: so is the subscription
                    await subscription.unsubscribe()
            self.serving = []
            return
        self.serving = [
            await bus.serve(
                subjects.place(), self._place, queue="conductor", expected=PlacementRequest
            ),
            await bus.serve(subjects.conductor_stats(), self._stats, expected=StatsRequest),
        ]
        if self.failover is not None:
            await self._resync()  # every worker beats now: loads as of the takeover

    async def drain(self) -> None:
        """Hand the lease over at once (a standby need not wait for it to expire)."""
        if self.failover is not None:
            await self.failover.stop()

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/ready", self._ready)]

    async def _ready(self, _: web.Request) -> web.Response:
        """200 for the active conductor and for a standby (both are ready to place: a
        standby the moment it holds the lease); the body says which."""
        active = self.failover is None or self.failover.active()
        epoch = self.failover.lease.epoch if self.failover and active else 0
        body = {"status": "active" if active else "standby", "epoch": epoch}
        return web.json_response({**body, "worker_id": self.worker_id})

    async def _resync(self) -> None:
        assert self.bus is not None, "start() runs on a connected bus"
        await self.bus.publish(subjects.kv_resync(), KVResync(self.worker_id))

    async def _on_heartbeat(self, hb: Heartbeat) -> None:
        self.core.observe(hb)

    async def _on_kv_event(self, event: KVEvent) -> None:
        self.core.apply(event)

    async def _on_done(self, done: RequestDone) -> None:
        self.core.finished(done)
        self.path_overhead.set(self.core.overhead.seconds)
        for name, predicted, actual in done_pairs(done):
            self.estimate_error.labels(name).observe(abs(relative_error(predicted, actual)))

    async def _place(self, request: PlacementRequest) -> Placement:
        if self.failover is not None and not self.failover.active():
            return Placement(request.request_id, False, reason=STANDBY, retry_after=1.0)
        with tracing.span("conductor.place", {"kvstack.request_id": request.request_id}) as span:
            placement = await self._settled(self._placement(request))
            span.set_attributes(_span_attributes(placement))
        return placement

    async def _settled(self, placement: Placement) -> Placement:
        if self.failover is None:
            return placement
        try:
            return await self.failover.settle(placement)
        except NatsError as e:  # not placed: the gateway asks again
            log.warning("%s: placement record failed: %s", self.worker_id, e)
            return Placement(placement.request_id, False, reason=f"no record: {e}")

    def _placement(self, request: PlacementRequest) -> Placement:
        counters = self.core.counters
        before, unplaceable = counters.replicated_blocks, counters.unplaceable
        placement = self.core.place(request, time.time())
        self.placements.labels(_result(placement, counters.unplaceable > unplaceable)).inc()
        self.replications.inc(counters.replicated_blocks - before)
        if placement.accepted:
            self.predicted_ttft.observe(placement.predicted_ttft)
        return placement

    async def _stats(self, _: StatsRequest) -> ConductorStats:
        core, now = self.core, time.time()
        return ConductorStats(
            self.worker_id,
            core.config.policy,
            core.config.admission,
            len(core.index),
            core.counters.accepted,
            core.counters.rejected + core.counters.unplaceable,
            core.counters.replications,
            tuple(hb.worker_id for hb in core.state.live("prefill", now)),
            tuple(hb.worker_id for hb in core.state.live("decode", now)),
            core.estimates.summary(),
            core.index.num_pooled,
        )

    def heartbeat(self) -> Heartbeat:
        now = time.time()
        for service in ("prefill", "decode"):
            self.live_workers.labels(service).set(len(self.core.state.live(service, now)))
        self.indexed_blocks.set(len(self.core.index))
        self.pooled_blocks.set(self.core.index.num_pooled)
        return super().heartbeat()


def _span_attributes(placement: Placement) -> dict:
    return {
        "kvstack.accepted": placement.accepted,
        "kvstack.prefill_id": placement.prefill_id,
        "kvstack.decode_id": placement.decode_id,
        "kvstack.predicted_ttft_s": placement.predicted_ttft,
        "kvstack.reason": placement.reason,
    }


def _result(placement: Placement, unplaceable: bool) -> str:
    if placement.accepted:
        return "accepted"
    return "unplaceable" if unplaceable else "rejected"
