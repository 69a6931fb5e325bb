"""The cluster as a placement policy sees it: plain, frozen data, no I/O."""
from __future__ import annotations

from dataclasses import dataclass

from shared.messages import Heartbeat


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    worker_id: str
    service: str
    num_running: int
    num_waiting: int
    queued_tokens: int          # reported by the worker plus work assigned since its last beat
    free_blocks: int
    total_blocks: int
    block_size: int

    @classmethod
    def from_heartbeat(cls, hb: Heartbeat, pending_tokens: int = 0,
                       pending_requests: int = 0) -> WorkerLoad:
        """The worker's numbers plus what was sent its way since it last reported."""
        pending_blocks = -(-pending_tokens // hb.block_size) if hb.block_size else 0
        return cls(hb.worker_id, hb.service, hb.num_running, hb.num_waiting + pending_requests,
                   hb.queued_tokens + pending_tokens, max(0, hb.free_blocks - pending_blocks),
                   hb.total_blocks, hb.block_size)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks if self.total_blocks else 1.0


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """How much of one request's prompt (in leading blocks) is cached where."""
    by_worker: dict[str, int]     # prefill worker -> leading blocks in its local cache
    pool_blocks: int = 0          # leading blocks in the kvstore pool

    def local(self, worker_id: str) -> int:
        return self.by_worker.get(worker_id, 0)

    def best_peer(self, exclude: str) -> tuple[str, int]:
        """The other prefill worker with the longest match (ties: lowest id)."""
        peers = [(-n, w) for w, n in self.by_worker.items() if w != exclude and n > 0]
        return (min(peers)[1], -min(peers)[0]) if peers else ("", 0)


NO_MATCH = PrefixMatch({})


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    time: float
    prefill: tuple[WorkerLoad, ...]
    decode: tuple[WorkerLoad, ...]
