"""An engine's load at one moment: what a worker reports in each heartbeat (Heartbeat's
field names). No torch here: the simulator's nodes report theirs with the same type."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    # prompt tokens still to compute: of the prefills in progress and waiting, not counting
    # a waiting prompt's prefix (loaded, or in the prefix cache now)
    queued_tokens: int = 0
    context_tokens: int = 0  # tokens of the running requests
    free_blocks: int = 0  # allocatable now, counting freed blocks still in the prefix cache
    total_blocks: int = 0

    @property
    def usage(self) -> float:
        """The share of KV blocks in use."""
        return 1.0 - self.free_blocks / self.total_blocks


def tokens_to_compute(num_prompt_tokens: int, num_prefix_tokens: int) -> int:
    """A prompt's tokens past its prefix; one is always computed (the first token's logits)."""
    return num_prompt_tokens - min(num_prefix_tokens, num_prompt_tokens - 1)
