"""The cluster as a placement policy sees it: plain, frozen data, no I/O."""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from shared.messages import Heartbeat


@dataclass(frozen=True, slots=True)
class Pending:
    """Work the conductor assigned to a worker since its last heartbeat (not in its numbers)."""
    tokens: int = 0
    requests: int = 0
    seconds: float = 0.0          # predicted prefill seconds of those requests
    until: float = math.inf       # when they are predicted done (prefill); inf: next beat


NO_PENDING = Pending()


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    worker_id: str
    service: str
    num_running: int
    num_waiting: int              # reported plus assigned since the last beat
    queued_tokens: int            # reported plus assigned since the last beat
    free_blocks: int
    total_blocks: int
    block_size: int
    context_tokens: int = 0       # KV tokens of running requests, plus assigned ones (decode)
    pending: Pending = NO_PENDING
    # NOTE: (cost model, seconds) last answered by estimate.prefill_queue_time: the cluster
    # state keeps a load until its worker's next beat or assignment, and placements ask again.
    _queue_time: tuple[object, float] | None = field(default=None, init=False, repr=False,
                                                     compare=False)

    @classmethod
    def from_heartbeat(cls, hb: Heartbeat, pending: Pending = NO_PENDING) -> WorkerLoad:
        """The worker's numbers plus what was sent its way since it last reported."""
        pending_blocks = -(-pending.tokens // hb.block_size) if hb.block_size else 0
        return cls(hb.worker_id, hb.service, hb.num_running, hb.num_waiting + pending.requests,
                   hb.queued_tokens + pending.tokens, max(0, hb.free_blocks - pending_blocks),
                   hb.total_blocks, hb.block_size, hb.context_tokens + pending.tokens, pending)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks if self.total_blocks else 1.0

    @property
    def reported_waiting(self) -> tuple[int, int]:
        """(requests, tokens) queued by the worker's own last report."""
        return (self.num_waiting - self.pending.requests,
                self.queued_tokens - self.pending.tokens)


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """How much of one request's prompt (in leading blocks) is cached where."""
    by_worker: dict[str, int]     # prefill worker -> leading blocks in its local cache
    pool_blocks: int = 0          # leading blocks in the kvstore pool
    # NOTE: the two longest matches as (-blocks, worker), found on the first best_peer call:
    # every prefill worker asks, so a decision ranks the workers once, not once per worker.
    _top: tuple[tuple[int, str], ...] | None = field(default=None, init=False, repr=False,
                                                      compare=False)

    def local(self, worker_id: str) -> int:
        return self.by_worker.get(worker_id, 0)

    def best_peer(self, exclude: str) -> tuple[str, int]:
        """The other prefill worker with the longest match (ties: lowest id)."""
        if self._top is None:
            object.__setattr__(self, "_top", tuple(heapq.nsmallest(
                2, ((-n, w) for w, n in self.by_worker.items() if n > 0))))
        for blocks, worker in self._top:
            if worker != exclude:
                return worker, -blocks
        return "", 0

    def best_remote(self, worker_id: str) -> tuple[str, int]:
        """Where `worker_id` could load the longest prefix from: a peer when it holds more
        than the kvstore pool, else the pool ("kvstore")."""
        peer, blocks = self.best_peer(worker_id)
        return (peer, blocks) if blocks > self.pool_blocks else ("kvstore", self.pool_blocks)


NO_MATCH = PrefixMatch({})


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    time: float
    prefill: tuple[WorkerLoad, ...]
    decode: tuple[WorkerLoad, ...]
