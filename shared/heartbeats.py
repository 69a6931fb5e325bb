"""Hearing heartbeats: each one checked to speak for the worker its subject names, and
timed by the listener's own clock on arrival, never by the time the sender wrote in it (a
beat dated in the future, or a huge interval, must not keep a dead worker alive)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from shared import subjects
from shared.bus import Bus
from shared.messages import Heartbeat

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
