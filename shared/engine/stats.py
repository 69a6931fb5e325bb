"""An engine's load at one moment: what a worker reports in each heartbeat (Heartbeat's
field names). No torch here: the simulator's nodes report theirs with the same type."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    queued_tokens: int = 0  # tokens the waiting requests still need computed
    context_tokens: int = 0  # tokens of the running requests
    free_blocks: int = 0  # allocatable now, counting freed blocks still in the prefix cache
    total_blocks: int = 0

    @property
    def usage(self) -> float:
        """The share of KV blocks in use."""
        return 1.0 - self.free_blocks / self.total_blocks
