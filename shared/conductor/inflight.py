"""Prefixes on their way into a prefill worker's cache: the blocks of prompts placed there
whose prefill has not been reported yet (KV events come after the prefill, and a flush
later).

A worker computes its queue in order, so a prompt placed on it now starts after every
prompt placed there before: it will find their blocks in its own cache. The next turn of
a conversation, or an agent's next step, often arrives while the previous one is still
queued or prefilling; counting the previous one's blocks as the worker's own lets the
policy weigh that worker's cache against its queue (session affinity, as a prediction,
not a rule). An entry lasts until its prefill should be reported (predicted end, plus
LAG); the index has the blocks by then, or the worker lost them.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from shared.conductor.snapshot import PrefixMatch

LAG = 1.0  # seconds after a prefill's predicted end until its KV events are surely in


class Inflight(NamedTuple):
    worker_id: str
    hashes: tuple[int, ...]
    until: float


@dataclass
class InflightPrefixes:
    # first block hash -> prompts placed with it, oldest first
    by_first: dict[int, list[Inflight]] = field(default_factory=dict)
    # (until, first block hash) of every entry, soonest first: an entry goes when its time
    # is up, also when no later prompt starts with the same block
    _expiry: list[tuple[float, int]] = field(default_factory=list, repr=False)

    def placed(self, worker_id: str, hashes: Sequence[int], prefill_end: float) -> None:
        if hashes:
            entry = Inflight(worker_id, tuple(hashes), prefill_end + LAG)
            self.by_first.setdefault(hashes[0], []).append(entry)
            heapq.heappush(self._expiry, (entry.until, hashes[0]))

    def forget(self, worker_id: str) -> None:
        for first in list(self.by_first):
            kept = [e for e in self.by_first[first] if e.worker_id != worker_id]
            self._keep(first, kept)

    def extend(self, prefix: PrefixMatch, hashes: Sequence[int], now: float) -> PrefixMatch:
        """`prefix` with each worker's local run lengthened by what prompts placed there
        will have added to its cache before a prompt placed now starts."""
        self._expire(now)
        if not hashes or hashes[0] not in self.by_first:
            return prefix
        longer = dict(prefix.by_worker)
        for entry in self.by_first[hashes[0]]:
            run = _common_run(entry.hashes, hashes)
            if run > longer.get(entry.worker_id, 0):
                longer[entry.worker_id] = run
        if longer == prefix.by_worker:
            return prefix
        return PrefixMatch(longer, prefix.pool_blocks, prefix.sender_blocks())

    def _expire(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            _, first = heapq.heappop(self._expiry)
            if first in self.by_first:
                self._keep(first, [e for e in self.by_first[first] if e.until > now])

    def _keep(self, first: int, entries: list[Inflight]) -> None:
        if entries:
            self.by_first[first] = entries
        else:
            del self.by_first[first]


def _common_run(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading hashes two prompts share. Hashes chain (shared/hashing.py): equal
    hashes at a position mean equal prompts up to it, so a binary search finds where they
    part, O(log n) comparisons."""
    low, high = 0, min(len(a), len(b))  # they share `low` blocks; not more than `high`
    while low < high:
        mid = (low + high + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            low = mid
        else:
            high = mid - 1
    return low
