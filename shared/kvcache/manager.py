"""Block tables of the requests a worker holds, over one BlockPool."""

from __future__ import annotations

from collections.abc import Sequence

from shared.kvcache.block import KVBlock
from shared.kvcache.block_pool import BlockPool


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Decides where a request's KV lives: its block table, prefix hits, and freeing.

    Check-then-act: `allocate_slots` returns False and changes nothing when blocks
    are short, so the scheduler can wait or preempt instead of handling exceptions.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = True):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_prefix_cache)
        self.block_tables: dict[str, list[KVBlock]] = {}
        self.num_named_blocks: dict[str, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return 1.0 - self.pool.num_free_blocks / self.pool.num_blocks

    def match_prefix(self, block_hashes: list[int], max_blocks: int | None = None) -> list[KVBlock]:
        """The longest run of cached blocks naming a prefix; takes no reference."""
        matched = []
        for block_hash in block_hashes[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            matched.append(block)
        return matched

    def can_allocate(
        self, request_id: str, num_tokens: int, cached: Sequence[KVBlock] = ()
    ) -> bool:
        return self._num_missing(request_id, num_tokens, cached) <= self._num_usable(cached)

    def allocate_slots(
        self, request_id: str, num_tokens: int, cached: Sequence[KVBlock] = ()
    ) -> bool:
        """Grow the request's table to hold `num_tokens` tokens in all.

        `cached` (only for a request without a table yet) are prefix-hit blocks that
        become the head of the table. Returns False, changing nothing, when short.
        """
        held = self.block_tables.get(request_id, ())
        if not cached and len(held) * self.block_size >= num_tokens:
            return True  # most decode steps: the last block has room
        if not self.can_allocate(request_id, num_tokens, cached):
            return False
        table = self.block_tables.setdefault(request_id, [])
        if cached:
            assert not table, "prefix blocks are only attached to a new request"
            self.pool.touch(list(cached))
            table.extend(cached)
            self.num_named_blocks[request_id] = len(cached)
        table.extend(self.pool.allocate(self._num_missing(request_id, num_tokens, ())))
        return True

    def name_full_blocks(self, request_id: str, block_hashes: list[int], num_tokens: int) -> None:
        """Name the blocks made full by `num_tokens` computed tokens so others can reuse them."""
        table = self.block_tables[request_id]
        first = self.num_named_blocks.get(request_id, 0)
        last = min(num_tokens // self.block_size, len(block_hashes), len(table))
        for i in range(first, last):
            self.pool.name(table[i], block_hashes[i])
        self.num_named_blocks[request_id] = max(first, last)

    def free(self, request_id: str) -> None:
        table = self.block_tables.pop(request_id, [])
        self.num_named_blocks.pop(request_id, None)
        self.pool.free(table[::-1])

    def block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.block_tables.get(request_id, ())]

    def _num_missing(self, request_id: str, num_tokens: int, cached: Sequence[KVBlock]) -> int:
        have = len(self.block_tables.get(request_id, ())) + len(cached)
        return max(0, cdiv(num_tokens, self.block_size) - have)

    def _num_usable(self, cached: Sequence[KVBlock]) -> int:
        # NOTE: freed-but-cached prefix blocks sit in the free queue; touching them uses them up.
        return self.pool.num_free_blocks - sum(1 for block in cached if block.ref_cnt == 0)
