"""A step's chunk as `attention_metadata` reads it, for attention tests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    start_pos: int
    num_tokens: int
    block_ids: tuple[int, ...]

    @property
    def context_len(self) -> int:
        return self.start_pos + self.num_tokens
