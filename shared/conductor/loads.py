"""A worker's load as the conductor counts it: its last heartbeat plus the work assigned
to it since. Plain data, no I/O; it imports nothing of the conductor.

NOTE: the values built on every decision (a load per assignment and heartbeat, pending
work) are NamedTuples: a frozen dataclass sets each field through object.__setattr__, and
building a WorkerLoad that way costs about four times as much.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from shared.messages import Heartbeat


class Pending(NamedTuple):
    """Work the conductor assigned to a worker since its last heartbeat (not in its numbers)."""

    tokens: int = 0
    requests: int = 0
    seconds: float = 0.0  # predicted prefill seconds of those requests
    until: float = math.inf  # when they are predicted done (prefill); inf: next beat


NO_PENDING = Pending()


class WorkerLoad(NamedTuple):
    worker_id: str
    service: str
    num_running: int
    num_waiting: int  # reported plus assigned since the last beat
    queued_tokens: int  # reported plus assigned since the last beat
    free_blocks: int
    total_blocks: int
    block_size: int
    context_tokens: int = 0  # KV tokens of running requests, plus assigned ones (decode)
    pending: Pending = NO_PENDING

    @classmethod
    def from_heartbeat(cls, hb: Heartbeat, pending: Pending = NO_PENDING) -> WorkerLoad:
        """The worker's numbers plus what was sent its way since it last reported."""
        pending_blocks = -(-pending.tokens // hb.block_size) if hb.block_size else 0
        return cls(
            hb.worker_id,
            hb.service,
            hb.num_running,
            hb.num_waiting + pending.requests,
            hb.queued_tokens + pending.tokens,
            max(0, hb.free_blocks - pending_blocks),
            hb.total_blocks,
            hb.block_size,
            hb.context_tokens + pending.tokens,
            pending,
        )

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks if self.total_blocks else 1.0

    @property
    def reported_queue(self) -> tuple[int, int]:
        """(requests, tokens to compute) by the worker's own last report: waiting and in
        progress (a prefill worker's running requests are prefills under way)."""
        return (
            self.num_waiting + self.num_running - self.pending.requests,
            self.queued_tokens - self.pending.tokens,
        )
