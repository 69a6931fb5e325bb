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
class ClusterSnapshot:
    time: float
    prefill: tuple[WorkerLoad, ...]
    decode: tuple[WorkerLoad, ...]
