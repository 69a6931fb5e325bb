"""The DRAM tier: one buffer per block, a hard byte budget, LRU over unpinned blocks.

Nothing here locks: `BlockStore` holds its lock around every call. The tier only keeps
books; buffers are allocated, filled and read by the store's callers outside the lock.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from services.kvstore.arena import BlockArena
from shared.kvblocks import BlockLayout

UNKNOWN_CHECKSUM = 0  # not taken yet (a real 0 is only taken again)


class BlockState(enum.Enum):
    RESERVED = "reserved"  # a receiver is writing it; invisible until committed
    LOADING = "loading"  # being promoted from SSD; readers wait for it
    COMMITTED = "committed"  # complete and visible


@dataclass(slots=True, eq=False)
class DramBlock:
    """Bookkeeping of one DRAM buffer. `pins` counts its writer or readers; a pinned or
    evicting block is outside the LRU and is never chosen as a victim."""

    block_hash: int
    layout: BlockLayout
    state: BlockState
    buffer: np.ndarray | None = None  # allocated by the reserving caller, outside the lock
    pins: int = 1
    checksum: int = UNKNOWN_CHECKSUM  # xxh3_64 of its bytes: from its file, or when written
    evicting: bool = False  # being demoted; its evictor decides its fate
    read_views: tuple[memoryview, ...] = ()  # its layers' K and V, read-only, once read
    slot: int = -1  # its buffer's slot in the shared arena; -1: private memory

    @property
    def filled(self) -> np.ndarray:
        """The buffer of a block past its reservation (committed, loading, demoting)."""
        if self.buffer is None:
            raise RuntimeError(f"block {self.block_hash:x} has no buffer yet")
        return self.buffer

    def reader(self) -> BlockRef:
        """A read-only ref to its bytes (its views made on the first read that needs them
        and kept, so a hot block's framed gets do not slice its buffer again)."""
        return BlockRef(
            self.block_hash, self.layout, self.filled, False, self, self.slot, self.checksum
        )

    def layer_views(self) -> tuple[memoryview, ...]:
        # NOTE: outside the store's lock: two readers may both make them, alike
        if not self.read_views:
            self.read_views = layer_views(self.filled, self.layout, writable=False)
        return self.read_views


@dataclass(frozen=True, eq=False)
class BlockRef:
    """A pinned block's bytes: writable for a reservation, read-only for an acquired block.

    The memory stays valid and unchanged until the ref is committed, abandoned or released;
    after that its views must not be used.
    """

    block_hash: int
    layout: BlockLayout
    buffer: np.ndarray
    writable: bool
    block: DramBlock | None = None  # a read ref's block, which keeps its views
    slot: int = -1  # where the buffer lies in the shared arena; -1: private memory
    checksum: int = UNKNOWN_CHECKSUM  # of a committed arena block (a worker checks it)

    @cached_property
    def views(self) -> tuple[memoryview, ...]:
        """`view`'s answers, made on first use (a block placed or read in place needs none)."""
        if self.block is not None:
            return self.block.layer_views()
        return layer_views(self.buffer, self.layout, self.writable)

    def view(self, layer: int, half: int) -> memoryview:
        """Layer `layer`'s K (half 0) or V (half 1) bytes, `layout.half_bytes` long."""
        return self.views[2 * layer + half]

    def layer_views(self, layer: int) -> tuple[memoryview, memoryview]:
        return self.view(layer, 0), self.view(layer, 1)

    def data(self) -> memoryview:
        """The whole block, `layout.block_bytes` long."""
        return self._sliced(0, self.layout.block_bytes)

    def _sliced(self, start: int, stop: int) -> memoryview:
        view = self.buffer.data[start:stop]
        return view if self.writable else view.toreadonly()


def layer_views(buffer: np.ndarray, layout: BlockLayout, writable: bool) -> tuple[memoryview, ...]:
    """Every layer's K then V of a block's buffer, in `BlockRef.view`'s order."""
    data = buffer.data if writable else buffer.data.toreadonly()
    half = layout.half_bytes
    return tuple(data[at : at + half] for at in range(0, layout.block_bytes, half))


def new_buffer(num_bytes: int) -> np.ndarray:
    # NOTE: np.empty skips the zero fill a bytearray pays for; every byte is overwritten.
    return np.empty(num_bytes, dtype=np.uint8)


class DramTier:
    """Blocks in DRAM. `used_bytes` counts every block (reserved, loading, committed,
    evicting) at `layout.block_bytes` and never exceeds `capacity`. Buffers come from the
    shared arena where it has a slot for them, else from private memory."""

    def __init__(self, capacity: int, arena: BlockArena | None = None) -> None:
        self.capacity = capacity
        self.arena = arena
        self.used_bytes = 0
        self.num_committed = 0
        self.blocks: dict[int, DramBlock] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # unpinned committed, oldest first

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.used_bytes

    def get(self, block_hash: int) -> DramBlock | None:
        return self.blocks.get(block_hash)

    def holds(self, block_hash: int) -> bool:
        """True when the block's content is (or is about to be) here: committed or loading."""
        block = self.blocks.get(block_hash)
        return block is not None and block.state is not BlockState.RESERVED

    def try_add(self, block_hash: int, layout: BlockLayout, state: BlockState) -> DramBlock | None:
        """Account a new pinned block (its buffer still to be allocated); None if no room."""
        if block_hash in self.blocks or layout.block_bytes > self.free_bytes:
            return None
        block = DramBlock(block_hash, layout, state)
        self.blocks[block_hash] = block
        self.used_bytes += layout.block_bytes
        return block

    def allocate(self, block: DramBlock) -> np.ndarray:
        """A buffer for a block just added (outside the lock: the arena locks itself)."""
        found = None if self.arena is None else self.arena.allocate(block.layout.block_bytes)
        if found is None:
            block.buffer = new_buffer(block.layout.block_bytes)
        else:
            block.slot, block.buffer = found
        return block.buffer

    def commit(self, block: DramBlock, checksum: int, pins: int) -> None:
        """Make a reserved or loading block visible, keeping `pins` readers on it."""
        block.state, block.checksum, block.pins = BlockState.COMMITTED, checksum, pins
        self.num_committed += 1
        if pins == 0:
            self._lru[block.block_hash] = None

    def committed_oldest_first(self) -> list[DramBlock]:
        """Committed blocks, least recently used first (the ones in use now last)."""
        idle = [self.blocks[block_hash] for block_hash in self._lru]
        busy = [
            b
            for b in self.blocks.values()
            if b.state is BlockState.COMMITTED and b.block_hash not in self._lru
        ]
        return idle + busy

    def pin(self, block: DramBlock) -> None:
        block.pins += 1
        self._lru.pop(block.block_hash, None)

    def unpin(self, block: DramBlock) -> None:
        """Drop one reader; the last one puts the block at the young end of the LRU."""
        block.pins -= 1
        if block.pins == 0 and not block.evicting:
            self._lru[block.block_hash] = None

    def drop(self, block: DramBlock) -> None:
        """Forget a block; its arena slot is free again (nobody may use its buffer now)."""
        if block.slot >= 0 and self.arena is not None:
            self.arena.free(block.slot)
            block.slot = -1
        del self.blocks[block.block_hash]
        self._lru.pop(block.block_hash, None)
        self.used_bytes -= block.layout.block_bytes
        self.num_committed -= block.state is BlockState.COMMITTED

    def take_victims(self, num_bytes: int) -> list[DramBlock] | None:
        """Mark the oldest unpinned blocks as evicting until `num_bytes` would be free.

        Returns [] when there is room already, None (marking nothing) when even every
        unpinned block would not make room. Victims leave the LRU; the caller must
        `drop` them or `spare` them.
        """
        if num_bytes > self.capacity:
            return None
        victims, freed = [], self.free_bytes
        for block_hash in self._lru:
            if freed >= num_bytes:
                break
            victims.append(self.blocks[block_hash])
            freed += victims[-1].layout.block_bytes
        if freed < num_bytes:
            return None
        for victim in victims:
            victim.evicting = True
            del self._lru[victim.block_hash]
        return victims

    def spare(self, victim: DramBlock) -> None:
        """Keep a victim that a reader pinned while it was being demoted."""
        victim.evicting = False
        if victim.pins == 0:
            self._lru[victim.block_hash] = None
