"""A node's DRAM prefix cache (LRU over block hashes) and the global pool: the union of
every node's cache (Mooncake's pool is the cluster's spare DRAM).

Block hashes chain, so a cache should hold a run of a prompt's leading blocks. A request
touches its blocks last-to-first, leaving the first block the most recently used, so the
LRU evicts the tails of old prompts before their heads (vLLM frees blocks in reverse order
for the same reason) and what a cache keeps of a prompt stays a leading run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from shared.kvpool.net_events import NetEvents


class BlockPool:
    """How many node caches hold each block: the pool holds a block when any does."""

    def __init__(self) -> None:
        self.holders: dict[int, int] = {}

    def leading(self, hashes: Sequence[int], start: int, stop: int) -> int:
        """How many of hashes[start:stop], from the first, some cache holds."""
        for i in range(start, stop):
            if hashes[i] not in self.holders:
                return i - start
        return max(0, stop - start)

    def add(self, block_hash: int) -> None:
        self.holders[block_hash] = self.holders.get(block_hash, 0) + 1

    def remove(self, block_hash: int) -> None:
        left = self.holders.pop(block_hash) - 1
        if left:
            self.holders[block_hash] = left


class BlockCache:
    """LRU of `capacity` blocks. Changes are netted until `take_events` (a live cache
    publishes KV events in batches: services/prefill/sharing.py)."""

    def __init__(self, capacity: int, pool: BlockPool | None = None) -> None:
        self.capacity = capacity
        self.pool = pool
        self.blocks: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.changes = NetEvents()

    def __len__(self) -> int:
        return len(self.blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self.blocks

    def leading(self, hashes: Sequence[int], stop: int) -> int:
        """How many of hashes[:stop], from the first, this cache holds."""
        for i in range(stop):
            if hashes[i] not in self.blocks:
                return i
        return max(0, stop)

    def holds_all(self, hashes: Sequence[int]) -> bool:
        return all(h in self.blocks for h in hashes)

    def touch(self, hashes: Sequence[int]) -> None:
        """Cache `hashes` (a prompt's blocks, in order) as just used; evict to capacity."""
        blocks, stored = self.blocks, []
        for block_hash in reversed(hashes):
            if block_hash in blocks:
                blocks.move_to_end(block_hash)
            else:
                blocks[block_hash] = None
                stored.append(block_hash)
        self._announce(stored, True)
        evicted = [blocks.popitem(last=False)[0] for _ in range(len(blocks) - self.capacity)]
        self._announce(evicted, False)

    def take_events(self) -> tuple[list[int], list[int]]:
        """(stored, removed) since the last call."""
        return self.changes.take()

    def _announce(self, hashes: list[int], stored: bool) -> None:
        if not hashes:
            return
        if stored:
            self.changes.stored(hashes)
        else:
            self.changes.removed(hashes)
        if self.pool is not None:
            update = self.pool.add if stored else self.pool.remove
            for block_hash in hashes:
                update(block_hash)
