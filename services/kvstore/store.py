"""`BlockStore`: the kvstore's blocks in DRAM with an optional SSD tier behind it.

Blocks are named by their chained block hash (shared/hashing.py) and laid out as
shared/kvblocks.py says. A block arrives through `reserve` -> (receiver writes each
layer into `ref.view`) -> `commit` or `abandon`, and leaves through `acquire` -> (sender
reads each layer) -> `release`. DRAM eviction is LRU over unpinned blocks and demotes to
SSD when there is an SSD tier; SSD eviction is LRU by last use and deletes files. Both
byte budgets are hard limits.

The SSD tier exists when `disk_dir` is set and `disk_bytes` > 0. It is inclusive: a
promoted block keeps its file, so demoting it again costs no write.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import xxhash

from services.kvstore.arena import BlockArena
from services.kvstore.blockfile import BlockHeader, read_block_file
from services.kvstore.disk import DiskTier
from services.kvstore.dram import (
    UNKNOWN_CHECKSUM,
    BlockRef,
    BlockState,
    DramBlock,
    DramTier,
)
from services.kvstore.tiers import Tiers
from shared.kvblocks import BlockLayout

# NOTE: making room drops the lock while victims are written to SSD; other threads may
# take the space meanwhile, so the search is retried a few times before giving up.
ROOM_ATTEMPTS = 4


class BlockStore:
    """Thread-safe two-tier block store.

    Locking: one lock (a Condition) guards all bookkeeping. Buffer allocation, checksums,
    compression and file reads/writes run outside it; only file deletions (unlink) run
    under it. Pinned blocks (being written or read) are never evicted or deleted.
    """

    def __init__(
        self,
        dram_bytes: int,
        disk_dir: Path | None = None,
        disk_bytes: int = 0,
        compress: bool = False,
        arena: BlockArena | None = None,
    ) -> None:
        if dram_bytes < 0 or disk_bytes < 0:
            raise ValueError("capacities must not be negative")
        if compress and importlib.util.find_spec("lz4") is None:
            raise ValueError("compress=True needs the lz4 package")
        self._cond = threading.Condition()
        disk = DiskTier(Path(disk_dir), disk_bytes) if disk_dir and disk_bytes else None
        self._tiers = Tiers(DramTier(dram_bytes, arena), disk, compress)
        if disk is not None:
            self._tiers.load_disk()

    # ---- queries ----

    def lookup(self, block_hashes: Sequence[int]) -> list[bool]:
        """Whether each block is stored (committed in DRAM, or on SSD) in any layout.

        Changes nothing, LRU order included: a lookup is a question, not a use. Blocks
        still being received are not stored yet.
        """
        with self._cond:
            return [self._tiers.is_stored(block_hash) for block_hash in block_hashes]

    def take_events(self) -> tuple[list[int], list[int]]:
        """(stored, removed) hashes since the last call, each block's latest change only.

        Stored: committed, or found on SSD at start. Removed: gone from both tiers
        (evicted from the last tier holding it, or found corrupt).
        """
        with self._cond:
            return self._tiers.events.take()

    def snapshot(self) -> list[int]:
        """Every stored block hash (for a conductor's resync); pending events are dropped."""
        with self._cond:
            return self._tiers.stored_hashes()

    def stats(self) -> dict[str, int]:
        with self._cond:
            dram, disk = self._tiers.dram, self._tiers.disk
            return {
                "dram_blocks": dram.num_committed,
                "dram_pending_blocks": len(dram.blocks) - dram.num_committed,
                "dram_bytes": dram.used_bytes,
                "dram_capacity": dram.capacity,
                "disk_blocks": len(disk.entries) if disk else 0,
                "disk_bytes": disk.used_bytes if disk else 0,
                "disk_capacity": disk.capacity if disk else 0,
                **asdict(self._tiers.counters),
            }

    def flush(self) -> int:
        """Write every committed DRAM block the SSD tier lacks, oldest first, so that a
        clean stop keeps them for the next start (as far as the SSD budget goes); they stay
        in DRAM too. Returns how many were written. Does disk I/O: off the event loop."""
        with self._cond:
            tiers = self._tiers
            if tiers.disk is None:
                return 0
            blocks = [
                b for b in tiers.dram.committed_oldest_first() if not tiers.on_disk(b.block_hash)
            ]
            for block in blocks:
                tiers.dram.pin(block)
            writes = tiers.plan_demotions(blocks)
        written = tiers.write_files(writes)
        with self._cond:
            tiers.index_files(writes, written)
            for block in blocks:
                tiers.dram.unpin(block)
        return len(written)

    # ---- the write path: reserve -> commit | abandon ----

    def reserve(self, block_hash: int, layout: BlockLayout) -> BlockRef | None:
        """A pinned, writable DRAM buffer for an incoming block, invisible until `commit`.

        None when the block is stored or already being received (skip it), or when it does
        not fit even after evicting every unpinned block. May evict, and so may write
        files when demoting: call it off the event loop.
        """
        block = self._make_room(block_hash, layout, BlockState.RESERVED)
        return None if block is None else self._writable(block)

    def reserve_in_room(
        self, block_hashes: Sequence[int], layout: BlockLayout
    ) -> list[BlockRef | None] | None:
        """`reserve` of every hash without evicting anything, or None (nothing reserved)
        unless DRAM has room for them all now. No I/O and no waiting beyond the lock: a put
        that fits needs no worker thread."""
        tiers = self._tiers
        with self._cond:
            if tiers.dram.free_bytes < len(block_hashes) * layout.block_bytes:
                return None
            blocks = [
                None
                if tiers.taken(block_hash, BlockState.RESERVED)
                else tiers.dram.try_add(block_hash, layout, BlockState.RESERVED)
                for block_hash in block_hashes
            ]
        return [None if block is None else self._writable(block) for block in blocks]

    def commit(self, ref: BlockRef, checksum: int = UNKNOWN_CHECKSUM) -> bool:
        """Make a reservation visible, unpinned (the caller verified every layer, and may
        know its checksum). False when `ref` is no live reservation. A block in the shared
        arena is hashed now if its checksum is not known (a worker that reads it in place
        checks it); another's checksum for the SSD tier is taken when (if ever) it is
        demoted: its bytes never change."""
        if ref.slot >= 0 and checksum == UNKNOWN_CHECKSUM:
            checksum = xxhash.xxh3_64_intdigest(ref.buffer.data)
        with self._cond:
            block = self._owned(ref, BlockState.RESERVED)
            if block is None:
                return False
            self._tiers.dram.commit(block, checksum, pins=0)
            self._tiers.events.stored([ref.block_hash])
            return True

    def abandon(self, ref: BlockRef) -> bool:
        """Drop a reservation (a bad frame, a vanished sender); False when it is not one."""
        with self._cond:
            block = self._owned(ref, BlockState.RESERVED)
            if block is None:
                return False
            self._tiers.dram.drop(block)
            return True

    # ---- the read path: acquire -> release ----

    def pin_resident(
        self, block_hashes: Sequence[int], layout: BlockLayout
    ) -> list[BlockRef | None]:
        """`acquire`'s first half: pin what DRAM holds committed with this layout, None for
        the rest (counting nothing for them). No I/O and no waiting beyond the lock: a get
        that DRAM serves whole needs no worker thread."""
        with self._cond:
            return [self._pin_resident(block_hash, layout) for block_hash in block_hashes]

    def acquire(
        self,
        block_hashes: Sequence[int],
        layout: BlockLayout,
        resident: Sequence[BlockRef | None] | None = None,
    ) -> list[BlockRef | None]:
        """Pin blocks for reading: a read-only ref per hash, None for a miss; `resident`,
        what `pin_resident` already pinned of them.

        A block only on SSD is first promoted: read into a new DRAM buffer (which may evict
        and demote others) and verified against its checksum; a torn or corrupt file is
        deleted and reported removed. A block stored with another layout is a miss. Does
        disk I/O and may wait for another thread's promotion of the same block: call it in
        a worker thread. Every non-None ref must be released once.
        """
        # NOTE: pin what DRAM holds first, so promoting the rest cannot evict it.
        if resident is None:
            resident = self.pin_resident(block_hashes, layout)
        return [
            ref if ref is not None else self._acquire_one(block_hash, layout)
            for ref, block_hash in zip(resident, block_hashes)
        ]

    def release(self, refs: Sequence[BlockRef | None]) -> None:
        """Unpin acquired blocks (None entries are skipped); the views must not be used after."""
        with self._cond:
            for ref in refs:
                if ref is None:
                    continue
                block = self._owned(ref, BlockState.COMMITTED)
                if block is not None and not ref.writable and block.pins > 0:
                    self._tiers.dram.unpin(block)

    def _acquire_one(self, block_hash: int, layout: BlockLayout) -> BlockRef | None:
        with self._cond:
            block = self._settled(block_hash)
            if block is not None:
                return self._pin_dram(block, layout)
            header = self._pin_disk(block_hash, layout)
            if header is None:
                return None
        return self._promote(header)

    def _pin_resident(self, block_hash: int, layout: BlockLayout) -> BlockRef | None:
        """Pin a block committed in DRAM with this layout; None (counting nothing) otherwise."""
        block = self._tiers.dram.get(block_hash)
        if block is None or block.state is not BlockState.COMMITTED or block.layout != layout:
            return None
        return self._pin_dram(block, layout)

    def _pin_dram(self, block: DramBlock, layout: BlockLayout) -> BlockRef | None:
        if block.state is not BlockState.COMMITTED or block.layout != layout:
            self._tiers.count_miss()
            return None
        self._tiers.dram.pin(block)
        self._tiers.counters.dram_hits += 1
        return block.reader()

    def _pin_disk(self, block_hash: int, layout: BlockLayout) -> BlockHeader | None:
        header = self._tiers.disk.get(block_hash) if self._tiers.disk else None
        if header is None or header.layout != layout:
            self._tiers.count_miss()
            return None
        self._tiers.ssd.pin(block_hash)
        return header

    def _promote(self, header: BlockHeader) -> BlockRef | None:
        block = self._make_room(header.block_hash, header.layout, BlockState.LOADING)
        if block is None:
            with self._cond:
                self._tiers.ssd.unpin(header.block_hash)
                raced = header.block_hash in self._tiers.dram.blocks
                if not raced:
                    self._tiers.count_miss()
            # NOTE: another thread began receiving or promoting it meanwhile; start over.
            return self._acquire_one(header.block_hash, header.layout) if raced else None
        ok = False
        try:
            ok = self._read_file(block, header)
        finally:
            with self._cond:
                ref = self._settle_promotion(block, header, ok)
        return ref

    def _read_file(self, block: DramBlock, header: BlockHeader) -> bool:
        buffer = self._tiers.dram.allocate(block)
        path = self._tiers.ssd.path(header.block_hash)
        if not read_block_file(path, header, buffer.data):
            return False
        try:
            os.utime(path)  # NOTE: mtime orders the SSD LRU after a restart
        except OSError:
            pass
        return True

    def _settle_promotion(self, block: DramBlock, header: BlockHeader, ok: bool) -> BlockRef | None:
        self._tiers.ssd.unpin(header.block_hash)
        self._cond.notify_all()
        if not ok:
            self._tiers.dram.drop(block)
            self._tiers.drop_corrupt(header.block_hash)
            self._tiers.count_miss()
            return None
        self._tiers.dram.commit(block, header.checksum, pins=1)
        self._tiers.ssd.touch(header.block_hash)
        self._tiers.counters.dram_misses += 1
        self._tiers.counters.disk_hits += 1
        self._tiers.counters.promotions += 1
        return block.reader()

    # ---- making room: eviction and demotion ----

    def _make_room(
        self, block_hash: int, layout: BlockLayout, state: BlockState
    ) -> DramBlock | None:
        """Add a pinned DRAM block (buffer not yet allocated) for `block_hash`, evicting
        unpinned LRU blocks as needed. None when the hash is taken or nothing makes room.
        Takes the lock itself and drops it while demoted blocks are written."""
        tiers = self._tiers
        for _ in range(ROOM_ATTEMPTS):
            with self._cond:
                if tiers.taken(block_hash, state):
                    return None
                block = tiers.dram.try_add(block_hash, layout, state)
                if block is not None:
                    return block
                victims = tiers.dram.take_victims(layout.block_bytes)
                if not victims:
                    break
                writes = tiers.plan_demotions(victims)
                if not writes:
                    tiers.finish_demotions(victims, writes, {})
                    continue
            written = tiers.write_files(writes)
            with self._cond:
                tiers.finish_demotions(victims, writes, written)
        with self._cond:
            tiers.counters.no_room += 1
        return None

    def _settled(self, block_hash: int) -> DramBlock | None:
        """The DRAM block for a hash once no promotion of it is in flight. Locked."""
        block = self._tiers.dram.get(block_hash)
        while block is not None and block.state is BlockState.LOADING:
            self._cond.wait()
            block = self._tiers.dram.get(block_hash)
        return block

    def _owned(self, ref: BlockRef, state: BlockState) -> DramBlock | None:
        """The block `ref` was handed out for, if it is still that block and in `state`."""
        block = self._tiers.dram.get(ref.block_hash)
        if block is None or block.buffer is not ref.buffer or block.state is not state:
            return None
        return block

    def _writable(self, block: DramBlock) -> BlockRef:
        """A reserved block's new buffer, as the writable ref its receiver fills."""
        buffer = self._tiers.dram.allocate(block)
        return BlockRef(block.block_hash, block.layout, buffer, True, slot=block.slot)
