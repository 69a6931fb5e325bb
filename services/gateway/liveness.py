"""Which workers are alive, from their heartbeats: a request whose worker died is placed
again now, not after a token timeout.

A worker is lost to a request when it stopped beating, when it said goodbye (the last
beat of a clean stop), or when its beats come from another process under the same id (it
was restarted: whatever the old one held is gone). A worker whose beats say its NATS
connection was re-established is alive, but what it published just before may be lost.
When no worker at all has been heard for as long, the silence is the gateway's own (cut
off from NATS, or frozen): it says nothing about any one worker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from shared.messages import Heartbeat

MISSED_BEATS = 3
# Placements avoid a worker silent for this many intervals already: the conductor only
# gives up on it after MISSED_BEATS, and a request sent there meanwhile would be lost.
QUIET_BEATS = 1.5


@dataclass(frozen=True, slots=True)
class _Seen:
    at: float  # monotonic
    interval: float
    instance: str
    stopped: bool
    service: str = ""  # "prefill", "decode", "conductor", ...
    draining: bool = False
    reconnections: int = 0


class Liveness:
    def __init__(self) -> None:
        self._last: dict[str, _Seen] = {}
        self._heard_since = 0.0  # after a reconnection nobody could be heard before it
        self._heard_any: _Seen | None = None  # the latest beat of anyone

    def observe(self, hb: Heartbeat) -> None:
        self._heard_any = self._last[hb.worker_id] = _Seen(
            time.monotonic(),
            hb.interval,
            hb.instance,
            hb.stopped,
            hb.service,
            hb.draining,
            hb.reconnections,
        )

    def reconnected(self) -> None:
        """Silence while this gateway was cut off says nothing about the workers."""
        self._heard_since = time.monotonic()

    def watch(self, worker_ids: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
        """(worker id, its process now) for each worker: what `lost` compares with."""
        return tuple((w, self._last[w].instance if w in self._last else "") for w in worker_ids)

    def connections(self, worker_ids: tuple[str, ...]) -> dict[str, int]:
        """Each known worker's NATS reconnections so far: what `reconnected_worker`
        compares with."""
        return {w: self._last[w].reconnections for w in worker_ids if w in self._last}

    def reconnected_worker(self, since: dict[str, int], worker_ids: tuple[str, ...]) -> str:
        """The first of `worker_ids` whose NATS connection was re-established since
        `since` by the same process ("" if none): what it published just before may be
        lost. A restart is `lost`'s to report."""
        for worker_id in worker_ids:
            seen = self._last.get(worker_id)
            if seen is not None and seen.reconnections > since.get(worker_id, seen.reconnections):
                return worker_id
        return ""

    def instance(self, worker_id: str) -> str | None:
        """The process behind `worker_id` now (None: never heard of)."""
        seen = self._last.get(worker_id)
        return None if seen is None else seen.instance

    def heard_since(self, worker_id: str, since: float) -> bool:
        """Whether `worker_id` beat after `since` (time.monotonic())."""
        seen = self._last.get(worker_id)
        return seen is not None and seen.at > since

    def quiet(self) -> tuple[str, ...]:
        """Workers to avoid in a placement: silent for a while, or stopped."""
        now = time.monotonic()
        return tuple(
            w
            for w, seen in self._last.items()
            if seen.stopped or now - max(seen.at, self._heard_since) > QUIET_BEATS * seen.interval
        )

    def serving(self, service: str) -> tuple[str, ...]:
        """Workers of `service` ("prefill", "decode", "conductor") that take work now: heard
        within MISSED_BEATS of their intervals, neither draining nor stopped (GET /ready)."""
        now = time.monotonic()
        return tuple(
            w
            for w, seen in self._last.items()
            if seen.service == service
            and not (seen.stopped or seen.draining)
            and now - max(seen.at, self._heard_since) <= MISSED_BEATS * seen.interval
        )

    def lost(self, watched: tuple[tuple[str, str], ...]) -> tuple[str, str] | None:
        """(worker id, why) of the first watched worker that is gone, or None; unknown
        workers count as alive."""
        now = time.monotonic()
        isolated = self.isolated(now)
        for worker_id, instance in watched:
            seen = self._last.get(worker_id)
            if seen is None:
                continue
            if seen.stopped:
                return worker_id, f"worker {worker_id} stopped"
            if instance and seen.instance != instance:
                return worker_id, f"worker {worker_id} restarted"
            silent = now - max(seen.at, self._heard_since) > MISSED_BEATS * seen.interval
            if silent and not isolated:
                return worker_id, f"worker {worker_id} stopped responding"
        return None

    def isolated(self, now: float) -> bool:
        """Whether nobody has been heard for MISSED_BEATS intervals: then the gateway is
        the one cut off, and a worker's silence is not the worker's."""
        last = self._heard_any
        return last is not None and now - last.at > MISSED_BEATS * last.interval
