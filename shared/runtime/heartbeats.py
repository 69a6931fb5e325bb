"""Hearing heartbeats: each one checked to speak for the worker its subject names, and
timed by the listener's own clock on arrival, never by the time the sender wrote in it (a
beat dated in the future, or a huge interval, must not keep a dead worker alive)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from shared import subjects
from shared.messages import Heartbeat
from shared.runtime.bus import Bus

MIN_INTERVAL = 0.01  # seconds; the bounds a sender's stated interval is held to
MAX_INTERVAL = 10.0


async def subscribe_heartbeats(bus: Bus, handler: Callable[[Heartbeat], Awaitable[None]]):
    async def on_beat(beat: Heartbeat) -> None:
        await handler(received(beat, time.time()))

    return await bus.subscribe(
        subjects.all_heartbeats(), on_beat, expected=Heartbeat, sender=lambda beat: beat.worker_id
    )


def received(beat: Heartbeat, now: float) -> Heartbeat:
    """The beat as the listener trusts it: heard at `now`, with a bounded interval."""
    interval = min(max(beat.interval, MIN_INTERVAL), MAX_INTERVAL)
    return replace(beat, time=now, interval=interval)


MISSED_BEATS = 3  # peers give up on a worker silent for this many of its intervals


class BusLease:
    """Whether this process's peers still count it alive, as far as it can know: renewed
    each time one of its own heartbeats comes back to it through NATS (it hears its own
    subject), that is, when its peers hear it too. Past MISSED_BEATS intervals without a
    renewal (cut off from NATS, or frozen) its peers have given it up, so whatever they
    placed here has moved on, and it must not speak for that work any more (fencing)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.renewed_at: float | None = None  # monotonic; None before the first beat

    def renew(self, at: float) -> None:
        """One of its beats came back through NATS at `at` (monotonic)."""
        self.renewed_at = max(at, self.renewed_at or at)

    def silent_for(self, now: float | None = None) -> float:
        if self.renewed_at is None:
            return 0.0
        return (time.monotonic() if now is None else now) - self.renewed_at

    def expired(self, now: float | None = None) -> bool:
        return self.silent_for(now) > MISSED_BEATS * self.interval
