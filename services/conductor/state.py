"""The conductor's view of the cluster, kept from heartbeats."""
from __future__ import annotations

from dataclasses import dataclass, field

from shared.messages import Heartbeat
from services.conductor.snapshot import ClusterSnapshot, WorkerLoad

MISSED_BEATS = 3     # a worker silent for this many intervals is dead


@dataclass
class _Pending:
    """Work the conductor assigned since the worker's last heartbeat (not in its numbers yet)."""
    tokens: int = 0
    requests: int = 0


@dataclass
class ClusterState:
    heartbeats: dict[str, Heartbeat] = field(default_factory=dict)
    pending: dict[str, _Pending] = field(default_factory=dict)

    def observe(self, hb: Heartbeat) -> None:
        self.heartbeats[hb.worker_id] = hb
        self.pending.pop(hb.worker_id, None)

    def assign(self, worker_id: str, num_tokens: int) -> None:
        pending = self.pending.setdefault(worker_id, _Pending())
        pending.tokens += num_tokens
        pending.requests += 1

    def live(self, service: str, now: float) -> list[Heartbeat]:
        return [hb for hb in self.heartbeats.values()
                if hb.service == service and not hb.draining and self._alive(hb, now)]

    def forget_dead(self, now: float) -> list[str]:
        dead = [w for w, hb in self.heartbeats.items() if not self._alive(hb, now)]
        for worker_id in dead:
            del self.heartbeats[worker_id]
            self.pending.pop(worker_id, None)
        return dead

    def snapshot(self, now: float) -> ClusterSnapshot:
        def loads(service: str) -> tuple[WorkerLoad, ...]:
            return tuple(WorkerLoad.from_heartbeat(hb, *self._pending_of(hb.worker_id))
                         for hb in self.live(service, now))
        return ClusterSnapshot(now, loads("prefill"), loads("decode"))

    def _pending_of(self, worker_id: str) -> tuple[int, int]:
        pending = self.pending.get(worker_id)
        return (pending.tokens, pending.requests) if pending else (0, 0)

    @staticmethod
    def _alive(hb: Heartbeat, now: float) -> bool:
        return now - hb.time <= MISSED_BEATS * hb.interval
