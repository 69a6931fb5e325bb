"""The conductor service: keeps the cluster view and answers placement requests."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from shared import subjects
from shared.bus import Bus
from shared.messages import Heartbeat, KVEvent, Placement, PlacementRequest
from shared.service import Service, ServiceConfig
from services.conductor.index import PrefixIndex
from services.conductor.policies import POLICIES
from services.conductor.state import ClusterState

log = logging.getLogger("kvstack.conductor")


@dataclass(frozen=True)
class ConductorConfig(ServiceConfig):
    policy: str = "load-balance"


class ConductorService(Service):
    name = "conductor"

    def __init__(self, config: ConductorConfig) -> None:
        super().__init__(config)
        self.state = ClusterState()
        self.index = PrefixIndex()
        self.policy = POLICIES[config.policy]
        self.placements = self.metrics.counter("placements", "placement decisions", ("result",))
        self.live_workers = self.metrics.gauge("live_workers", "workers alive", ("service",))

    async def start(self, bus: Bus) -> None:
        await bus.subscribe(subjects.all_heartbeats(), self._on_heartbeat, expected=Heartbeat)
        await bus.subscribe(subjects.kv_events(), self._on_kv_event, expected=KVEvent)
        await bus.serve(subjects.place(), self._place, queue="conductor",
                        expected=PlacementRequest)

    async def _on_heartbeat(self, hb: Heartbeat) -> None:
        if hb.service in ("prefill", "decode", "kvstore"):
            self.state.observe(hb)

    async def _on_kv_event(self, event: KVEvent) -> None:
        if event.service in ("prefill", "kvstore"):
            self.index.apply(event)

    async def _place(self, request: PlacementRequest) -> Placement:
        now = time.time()
        for worker_id in self.state.forget_dead(now):
            self.index.forget(worker_id)
            log.warning("worker %s missed its heartbeats; no new work goes there", worker_id)
        snapshot = self.state.snapshot(now)
        prefix = self.index.match(request.block_hashes, [w.worker_id for w in snapshot.prefill])
        placement = self.policy(snapshot, request, prefix)
        if placement.accepted:
            self.state.assign(placement.prefill_id, request.num_prompt_tokens)
            self.state.assign(placement.decode_id, request.num_prompt_tokens + 1)
        self.placements.labels("accepted" if placement.accepted else "rejected").inc()
        return placement

    def heartbeat(self) -> Heartbeat:
        now = time.time()
        for service in ("prefill", "decode"):
            self.live_workers.labels(service).set(len(self.state.live(service, now)))
        return super().heartbeat()
