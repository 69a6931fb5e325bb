"""Which workers are alive, from their heartbeats: a request whose worker died fails now,
not after a token timeout."""
from __future__ import annotations

import time

from shared.messages import Heartbeat

MISSED_BEATS = 3


class Liveness:
    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}   # worker id -> (seen at, interval)

    def observe(self, hb: Heartbeat) -> None:
        self._last[hb.worker_id] = (time.monotonic(), hb.interval)

    def dead(self, worker_ids: tuple[str, ...]) -> str | None:
        """The first of `worker_ids` that stopped beating (unknown workers count as alive)."""
        now = time.monotonic()
        for worker_id in worker_ids:
            seen = self._last.get(worker_id)
            if seen is not None and now - seen[0] > MISSED_BEATS * seen[1]:
                return worker_id
        return None
