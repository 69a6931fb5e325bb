"""Decode load in the near future, for predictive admission (Mooncake §7.4).

Every admitted request is booked on its decode worker from the time its prefill should end
until its decode should end. `predictive` books every request for the same uniform decode
time (the paper's system-level prediction); `predictive-request` books each for its own
predicted duration. The forecast at time t counts the bookings that cover t, plus the
requests the worker reports running that no active booking explains (after a conductor
restart, or running past their predicted end): they are taken to still run at t, since
nothing says when they end, and the worker's next beats drop them once they do.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, field

from shared.conductor.loads import WorkerLoad
from shared.costmodel import CostModel


@dataclass(frozen=True, slots=True)
class Booking:
    start: float  # predicted end of prefill: the request joins decode
    end: float  # predicted end of decode
    context_tokens: int  # its KV tokens (the prompt; output grows it, ignored)


@dataclass
class Ledger:
    bookings: dict[str, list[Booking]] = field(default_factory=lambda: defaultdict(list))
    first_end: float = math.inf  # no booking ends before this: nothing to prune until then

    def book(self, decode_id: str, booking: Booking) -> None:
        bisect.insort(self.bookings[decode_id], booking, key=lambda b: b.end)
        self.first_end = min(self.first_end, booking.end)

    def prune(self, now: float) -> None:
        """Drop bookings that ended: each worker's list is kept sorted by end."""
        if now < self.first_end:
            return
        for decode_id, books in list(self.bookings.items()):
            del books[: bisect.bisect_right(books, now, key=lambda b: b.end)]
            if not books:
                del self.bookings[decode_id]
        self.first_end = min((books[0].end for books in self.bookings.values()), default=math.inf)

    def forget(self, decode_id: str) -> None:
        self.bookings.pop(decode_id, None)

    def batch_at(self, worker: WorkerLoad, now: float, t: float) -> tuple[int, int]:
        """(requests, KV tokens) predicted on `worker` at time t >= now."""
        books = self.bookings.get(worker.worker_id, [])
        active_now = [b for b in books if b.start <= now]
        unknown = max(0, worker.num_running - len(active_now))
        reported_context = worker.context_tokens - worker.pending.tokens
        unknown_context = max(0, reported_context - sum(b.context_tokens for b in active_now))
        covering = [b for b in books if b.start <= t < b.end]
        return (
            len(covering) + unknown,
            sum(b.context_tokens for b in covering) + (unknown_context if unknown else 0),
        )


def tbt_at(
    ledger: Ledger, worker: WorkerLoad, now: float, t: float, cost: CostModel, extra_tokens: int = 0
) -> float:
    """Predicted seconds per token on `worker` at time t, with one more request of
    `extra_tokens` when that is > 0."""
    batch, context = ledger.batch_at(worker, now, t)
    if extra_tokens:
        batch, context = batch + 1, context + extra_tokens
    return cost.decode_step_time(batch, context) if batch else 0.0
