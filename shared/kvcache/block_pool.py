"""The pool of KV blocks of one worker, with its prefix cache."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.kvcache.block import FreeBlockQueue, KVBlock


@dataclass(slots=True)
class KVEvents:
    """Block hashes named (stored) and forgotten (removed) since the last drain."""

    stored: list[int] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.stored or self.removed)


class BlockPool:
    """Owns every block: which are free, which are named by a block hash.

    A freed block keeps its hash and stays findable until it is reallocated, so a
    later request with the same prefix reuses it (lazy eviction, LRU order).
    Callers check `num_free_blocks` before `allocate`; nothing here raises for
    lack of space.
    """

    def __init__(self, num_blocks: int, enable_prefix_cache: bool = True) -> None:
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[int, KVBlock] = {}
        self.enable_prefix_cache = enable_prefix_cache
        self.events = KVEvents()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be allocated now, counting freed blocks still in the cache."""
        return len(self.free_queue)

    def lookup(self, block_hash: int) -> KVBlock | None:
        return self.cached.get(block_hash)

    def snapshot(self) -> list[int]:
        """Every cached block hash, clearing pending events (the snapshot supersedes them)."""
        self.events = KVEvents()
        return list(self.cached)

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on cached blocks (a prefix hit), pulling freed ones out of the LRU."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def allocate(self, num_blocks: int) -> list[KVBlock]:
        """The `num_blocks` least recently used free blocks, ordered by id: a request's
        blocks then tend to be consecutive, and consecutive blocks move as one span."""
        assert num_blocks <= self.num_free_blocks, "allocate without checking num_free_blocks"
        blocks = sorted(
            (self.free_queue.popleft() for _ in range(num_blocks)), key=lambda block: block.block_id
        )
        for block in blocks:
            self._forget(block)
            block.ref_cnt = 1
        return blocks

    def free(self, blocks: list[KVBlock]) -> None:
        """Drop one reference from each block; pass them tail first so tails are evicted first."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def name(self, block: KVBlock, block_hash: int) -> None:
        """Record that `block` now holds the full block named `block_hash`."""
        if not self.enable_prefix_cache or block.block_hash is not None:
            return
        if block_hash in self.cached:
            return  # NOTE: the same content computed twice; the first copy keeps the name
        block.block_hash = block_hash
        self.cached[block_hash] = block
        self.events.stored.append(block_hash)

    def reset_prefix_cache(self) -> None:
        for block in list(self.cached.values()):
            self._forget(block)

    def take_events(self) -> KVEvents:
        events, self.events = self.events, KVEvents()
        return events

    def _forget(self, block: KVBlock) -> None:
        if block.block_hash is None:
            return
        del self.cached[block.block_hash]
        self.events.removed.append(block.block_hash)
        block.block_hash = None
