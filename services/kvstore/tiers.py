"""The two tiers and the books they share: counters, events, and demotion between them.

Not thread-safe: every method runs under `BlockStore`'s lock, except `write_files`, which
runs outside it on victims that are pinned against change (marked evicting).
"""

from __future__ import annotations

from dataclasses import dataclass

import xxhash

from services.kvstore.blockfile import BlockHeader, encode_payload, write_block_file
from services.kvstore.disk import DiskTier, max_file_bytes
from services.kvstore.dram import BlockState, DramBlock, DramTier
from shared.kvpool.net_events import NetEvents


@dataclass(slots=True)
class Counters:
    dram_hits: int = 0  # acquires served from DRAM
    dram_misses: int = 0  # acquires DRAM could not serve (= disk_hits + disk_misses)
    disk_hits: int = 0  # ... served by promoting from SSD
    disk_misses: int = 0  # ... not served at all
    dram_evictions: int = 0  # blocks that left DRAM to make room
    demotions: int = 0  # ... of which stayed on SSD
    disk_evictions: int = 0  # files deleted to make room
    promotions: int = 0  # blocks read back from SSD into DRAM
    corrupt_dropped: int = 0  # files deleted for a bad header, size or checksum
    disk_write_errors: int = 0  # demotions that failed to write (the block was dropped)
    no_room: int = 0  # reservations and promotions refused for lack of DRAM


@dataclass(frozen=True, slots=True)
class PendingWrite:
    block: DramBlock
    claimed: int  # SSD bytes set aside for its file


class Tiers:
    def __init__(self, dram: DramTier, disk: DiskTier | None, compress: bool) -> None:
        self.dram = dram
        self.disk = disk
        self.compress = compress
        self.counters = Counters()
        self.events = NetEvents()

    @property
    def ssd(self) -> DiskTier:
        """The SSD tier, for the paths that only run with one (a block on disk, a demotion)."""
        if self.disk is None:
            raise RuntimeError("this kvstore has no SSD tier")
        return self.disk

    def load_disk(self) -> None:
        """Index what a previous run left on SSD and report it as stored."""
        scan = self.ssd.scan()
        self.events.removed(scan.bad)
        self.events.stored(scan.stored)
        self.counters.corrupt_dropped += len(scan.bad)

    # ---- questions ----

    def on_disk(self, block_hash: int) -> bool:
        return self.disk is not None and block_hash in self.disk.entries

    def is_stored(self, block_hash: int) -> bool:
        """Committed in DRAM or on SSD: what lookups report."""
        block = self.dram.get(block_hash)
        committed = block is not None and block.state is BlockState.COMMITTED
        return committed or self.on_disk(block_hash)

    def taken(self, block_hash: int, state: BlockState) -> bool:
        """Whether a new DRAM block in `state` may not be made for this hash: a reservation
        needs the hash absent everywhere, a promotion absent from DRAM."""
        if block_hash in self.dram.blocks:
            return True
        return state is BlockState.RESERVED and self.on_disk(block_hash)

    def stored_hashes(self) -> list[int]:
        """Everything lookups report as stored, clearing pending events (superseded)."""
        self.events.take()
        on_disk = list(self.disk.entries) if self.disk is not None else []
        return list(
            dict.fromkeys(
                [h for h, b in self.dram.blocks.items() if b.state is BlockState.COMMITTED]
                + on_disk
            )
        )

    # ---- bookkeeping ----

    def forget_if_gone(self, block_hashes: list[int]) -> None:
        """Report as removed the blocks no tier holds any more."""
        self.events.removed(
            h for h in block_hashes if not self.dram.holds(h) and not self.on_disk(h)
        )

    def drop_corrupt(self, block_hash: int) -> None:
        if self.ssd.remove(block_hash):
            self.counters.corrupt_dropped += 1
            self.forget_if_gone([block_hash])

    def count_miss(self) -> None:
        self.counters.dram_misses += 1
        self.counters.disk_misses += 1

    # ---- demotion: plan (locked) -> write_files (unlocked) -> finish (locked) ----

    def plan_demotions(self, victims: list[DramBlock]) -> list[PendingWrite]:
        """Claim SSD room for the victims not on SSD yet; a victim that gets none is dropped."""
        if self.disk is None:
            return []
        writes = []
        for victim in victims:
            if victim.block_hash in self.disk.entries:
                self.disk.touch(victim.block_hash)
                continue
            claimed = max_file_bytes(victim.layout.block_bytes)
            evicted = self.disk.claim(claimed)
            if evicted is None:
                continue
            self.counters.disk_evictions += len(evicted)
            self.forget_if_gone(evicted)
            writes.append(PendingWrite(victim, claimed))
        return writes

    def write_files(self, writes: list[PendingWrite]) -> dict[int, BlockHeader]:
        """Write the victims' files; returns the headers of those written. Unlocked."""
        written = {}
        for write in writes:
            block = write.block
            flags, payload = encode_payload(block.filled.data, self.compress)
            checksum = block.checksum or xxhash.xxh3_64_intdigest(block.filled.data)
            header = BlockHeader(block.block_hash, block.layout, flags, len(payload), checksum)
            if write_block_file(self.ssd.directory, header, payload):
                written[block.block_hash] = header
        return written

    def index_files(self, writes: list[PendingWrite], written: dict[int, BlockHeader]) -> None:
        """Index the files written; give back the room of those that failed."""
        for write in writes:
            header = written.get(write.block.block_hash)
            if header is None:
                self.ssd.unclaim(write.claimed)
                self.counters.disk_write_errors += 1
            else:
                self.ssd.add(header, write.claimed)

    def finish_demotions(
        self, victims: list[DramBlock], writes: list[PendingWrite], written: dict[int, BlockHeader]
    ) -> None:
        """Index the files written, then drop the victims no reader pinned meanwhile."""
        self.index_files(writes, written)
        for victim in victims:
            if victim.pins > 0:
                self.dram.spare(victim)  # NOTE: a reader pinned it meanwhile; it stays
                continue
            self.dram.drop(victim)
            self.counters.dram_evictions += 1
            self.counters.demotions += self.on_disk(victim.block_hash)
            self.forget_if_gone([victim.block_hash])
