"""A KV block's bookkeeping and the free queue that doubles as the LRU of cached blocks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None  # set once the block is full and named
    prev_free: KVBlock | None = None
    next_free: KVBlock | None = None


class FreeBlockQueue:
    """Doubly linked list threaded through the blocks themselves.

    Removing a block from the middle (a prefix-cache hit on a freed block) is O(1)
    and allocates nothing. Freed blocks join the back, so the front is the least
    recently used one and is the first to be reused (and so evicted from the cache).
    """

    def __init__(self, blocks: Iterable[KVBlock]) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev_free
        assert last is not None, "the tail sentinel always has a predecessor"
        last.next_free, block.prev_free = block, last
        block.next_free, self._tail.prev_free = self._tail, block
        self.num_free += 1

    def popleft(self) -> KVBlock:
        assert self.num_free > 0, "popleft on an empty free queue"
        block = self._head.next_free
        assert block is not None, "the head sentinel always has a successor"
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        before, after = block.prev_free, block.next_free
        assert before is not None and after is not None, "the block is not in the queue"
        before.next_free, after.prev_free = after, before
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def contains(self, block: KVBlock) -> bool:
        return block.prev_free is not None
