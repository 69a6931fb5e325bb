"""The conductor's view of the cluster, kept from heartbeats, plus its own bookkeeping of
work it assigned that the workers have not reported yet (so a burst between two beats is
spread, not all sent to the worker that looked idlest at the last beat)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from shared.conductor.loads import NO_PENDING, Pending, WorkerLoad
from shared.conductor.snapshot import ClusterSnapshot
from shared.conductor.views import LoadViews
from shared.messages import Heartbeat

MISSED_BEATS = 3  # a worker silent for this many intervals is dead
MARGIN = 1e-3  # seconds: near a death time, liveness is checked beat by beat
SERVICES = ("prefill", "decode")


@dataclass
class ClusterState:
    """Change it only through its methods: they keep the caches below in step.

    A snapshot reuses each worker's WorkerLoad until its next heartbeat or assignment, and
    skips the liveness checks while every worker is surely alive (before the earliest time
    one could be dead), so a decision costs no per-worker work when nothing changed. The
    views (views.py) hear which workers changed between two snapshots."""

    heartbeats: dict[str, Heartbeat] = field(default_factory=dict)
    pending: dict[str, Pending] = field(default_factory=dict)
    # work a worker's beats report only from some time on (a decode worker's request once
    # its KV has landed): (from when, tokens), kept pending through the beats before then
    arriving: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    # service -> worker id -> load, of every non-draining worker, in heartbeat order; valid
    # while all are alive (None: to rebuild)
    _loads: dict[str, dict[str, WorkerLoad]] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    # no worker dies before this (an earliest death time, less MARGIN, or earlier)
    _alive_until: float = field(default=-math.inf, init=False, repr=False, compare=False)
    # the earliest time some pending work is predicted done
    _expiry: float = field(default=math.inf, init=False, repr=False, compare=False)
    # what policies derive from the loads, kept from one snapshot to the next
    _views: LoadViews = field(default_factory=LoadViews, init=False, repr=False, compare=False)
    # per service: the loads of the last snapshot, and the workers whose load changed since
    _handed: dict[str, tuple[WorkerLoad, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _changed: dict[str, set[str]] = field(
        default_factory=lambda: {s: set() for s in SERVICES}, init=False, repr=False, compare=False
    )

    def observe(self, hb: Heartbeat) -> None:
        old = self.heartbeats.get(hb.worker_id)
        self.heartbeats[hb.worker_id] = hb
        self.pending.pop(hb.worker_id, None)
        if hb.worker_id in self.arriving:
            self._still_arriving(hb.worker_id, hb.time)
        self._alive_until = min(self._alive_until, _death(hb) - MARGIN)
        if old is None or (old.service, old.draining) != (hb.service, hb.draining):
            self._loads = None
        self._refresh(hb.worker_id)

    def forget(self, worker_id: str) -> None:
        """A worker that left (a clean stop): no longer placed on, at once."""
        if self.heartbeats.pop(worker_id, None) is not None:
            self.pending.pop(worker_id, None)
            self.arriving.pop(worker_id, None)
            self._loads = None

    def assign(
        self,
        worker_id: str,
        num_tokens: int,
        seconds: float = 0.0,
        until: float = math.inf,
        reported_from: float = -math.inf,
    ) -> None:
        """Count work sent to a worker until its next beat reports it, or until `until`, when
        it is predicted done (a worker that finished before its next beat is not busy).
        Beats before `reported_from` cannot report it yet: it stays pending through them."""
        if reported_from > -math.inf:
            self.arriving.setdefault(worker_id, []).append((reported_from, num_tokens))
        old = self.pending.get(worker_id)
        until = until if old is None else max(old.until, until)
        old = old or NO_PENDING
        self.pending[worker_id] = Pending(
            old.tokens + num_tokens, old.requests + 1, old.seconds + seconds, until
        )
        self._expiry = min(self._expiry, until)
        self._refresh(worker_id)

    def live(self, service: str, now: float) -> list[Heartbeat]:
        return [
            hb
            for hb in self.heartbeats.values()
            if hb.service == service and not hb.draining and self._alive(hb, now)
        ]

    def forget_dead(self, now: float) -> list[str]:
        if self._all_alive(now):
            return []
        dead = [w for w, hb in self.heartbeats.items() if not self._alive(hb, now)]
        for worker_id in dead:
            del self.heartbeats[worker_id]
            self.pending.pop(worker_id, None)
            self.arriving.pop(worker_id, None)
        if dead:
            self._loads = None
        return dead

    def snapshot(self, now: float) -> ClusterSnapshot:
        if now >= self._expiry:
            self._expire(now)
        if not self._all_alive(now):  # some may be dead: check each one
            prefill, decode = (tuple(self._load(hb) for hb in self.live(s, now)) for s in SERVICES)
            return ClusterSnapshot(now, prefill, decode, self._views)
        if self._loads is None:
            self._loads = {
                s: {hb.worker_id: self._load(hb) for hb in self.live(s, now)} for s in SERVICES
            }
            self._handed.clear()
        by_service = self._loads
        return ClusterSnapshot(
            now,
            self._hand("prefill", by_service["prefill"]),
            self._hand("decode", by_service["decode"]),
            self._views,
        )

    def _hand(self, service: str, by_id: dict[str, WorkerLoad]) -> tuple[WorkerLoad, ...]:
        """The service's loads (`by_id`) for a snapshot: the last ones when none changed,
        else new ones, and the views hear which workers changed."""
        before, changed = self._handed.get(service), self._changed[service]
        if before is not None and not changed:
            return before
        loads = tuple(by_id.values())
        if before is not None:
            self._views.advance(service, before, loads, [by_id[w] for w in changed])
        self._handed[service] = loads
        changed.clear()
        return loads

    def _still_arriving(self, worker_id: str, beat_time: float) -> None:
        """After a beat at `beat_time`: what it could not report stays pending."""
        later = [(t, tokens) for t, tokens in self.arriving[worker_id] if t > beat_time]
        if not later:
            del self.arriving[worker_id]
            return
        self.arriving[worker_id] = later
        self.pending[worker_id] = Pending(sum(tokens for _, tokens in later), len(later))

    def _expire(self, now: float) -> None:
        done = [w for w, pending in self.pending.items() if pending.until <= now]
        for worker_id in done:
            del self.pending[worker_id]
            self._refresh(worker_id)
        self._expiry = min((p.until for p in self.pending.values()), default=math.inf)

    def _load(self, hb: Heartbeat) -> WorkerLoad:
        return WorkerLoad.from_heartbeat(hb, self.pending.get(hb.worker_id, NO_PENDING))

    def _refresh(self, worker_id: str) -> None:
        """Recompute one worker's load where the cached loads hold it."""
        hb = self.heartbeats.get(worker_id)
        if hb is None or self._loads is None:
            return
        loads = self._loads.get(hb.service)
        if loads is not None and worker_id in loads:
            loads[worker_id] = self._load(hb)
            self._changed[hb.service].add(worker_id)

    def _all_alive(self, now: float) -> bool:
        """Whether every worker is surely alive at `now`, so none needs checking."""
        if now < self._alive_until:
            return True
        self._alive_until = min(map(_death, self.heartbeats.values()), default=math.inf) - MARGIN
        return now < self._alive_until

    @staticmethod
    def _alive(hb: Heartbeat, now: float) -> bool:
        return now - hb.time <= MISSED_BEATS * hb.interval


def _death(hb: Heartbeat) -> float:
    """When a worker that sends no more beats after `hb` is dead."""
    return hb.time + MISSED_BEATS * hb.interval
