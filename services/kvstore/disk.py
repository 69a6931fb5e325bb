"""The SSD tier: one file per block in a directory, a hard byte budget, LRU by last use.

Nothing here locks: `BlockStore` holds its lock around every call. Payload writes and
reads (the slow part) happen outside the lock through `blockfile`; this class keeps the
index and deletes files. Deleting under the store's lock is deliberate: a block evicted
here may be demoted again at once under the same name, and a late unlink would remove
the new file.
"""

from __future__ import annotations

import os
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from services.kvstore.blockfile import (
    HEADER_SIZE,
    TEMP_SUFFIX,
    BlockHeader,
    block_file_name,
    parse_block_file_name,
    read_header,
)


@dataclass(slots=True)
class ScanResult:
    """What a start-up scan found: blocks indexed, bad files deleted, temp files removed."""

    stored: list[int] = field(default_factory=list)
    bad: list[int] = field(default_factory=list)
    temp_files: int = 0


def max_file_bytes(block_bytes: int) -> int:
    """The most a block file can take: compression is dropped when it would not shrink."""
    return HEADER_SIZE + block_bytes


class DiskTier:
    """Block files indexed by hash. `used_bytes` counts indexed files plus space claimed
    for files being written, and never exceeds `capacity`."""

    def __init__(self, directory: Path, capacity: int) -> None:
        self.directory = directory
        self.capacity = capacity
        self.used_bytes = 0
        self.entries: OrderedDict[int, BlockHeader] = OrderedDict()  # oldest use first
        self._pins: Counter[int] = Counter()  # readers promoting the block right now

    def path(self, block_hash: int) -> Path:
        return self.directory / block_file_name(block_hash)

    def get(self, block_hash: int) -> BlockHeader | None:
        return self.entries.get(block_hash)

    def touch(self, block_hash: int) -> None:
        self.entries.move_to_end(block_hash)

    def pin(self, block_hash: int) -> None:
        self._pins[block_hash] += 1

    def unpin(self, block_hash: int) -> None:
        self._pins[block_hash] -= 1
        if self._pins[block_hash] <= 0:
            del self._pins[block_hash]

    def claim(self, num_bytes: int) -> list[int] | None:
        """Set aside room for a file about to be written, deleting the oldest unpinned files
        if needed. Returns the hashes deleted, or None (deleting nothing) when it cannot fit."""
        victims = self._victims(num_bytes)
        if victims is None:
            return None
        for block_hash in victims:
            self.remove(block_hash)
        self.used_bytes += num_bytes
        return victims

    def unclaim(self, num_bytes: int) -> None:
        self.used_bytes -= num_bytes

    def add(self, header: BlockHeader, claimed: int) -> None:
        """Index a file just written into space claimed for it (at least its size)."""
        self.entries[header.block_hash] = header
        self.used_bytes += header.file_bytes - claimed

    def remove(self, block_hash: int) -> bool:
        """Forget a block and delete its file; False when it was not indexed."""
        header = self.entries.pop(block_hash, None)
        if header is None:
            return False
        self.used_bytes -= header.file_bytes
        self.path(block_hash).unlink(missing_ok=True)
        return True

    def scan(self) -> ScanResult:
        """Index the files a previous run left, oldest modification first, deleting temp
        files, files with a bad header or size, and the oldest files beyond capacity.
        Reads headers only; payloads are checked when a block is promoted."""
        self.directory.mkdir(parents=True, exist_ok=True)
        result, found = ScanResult(), list[tuple[int, BlockHeader]]()
        for entry in os.scandir(self.directory):
            self._scan_one(entry, result, found)
        for _, header in sorted(found, key=lambda item: (item[0], item[1].block_hash)):
            self.entries[header.block_hash] = header
            self.used_bytes += header.file_bytes
        while self.used_bytes > self.capacity:
            self.remove(next(iter(self.entries)))
        result.stored = list(self.entries)
        return result

    def _scan_one(
        self, entry: os.DirEntry, result: ScanResult, found: list[tuple[int, BlockHeader]]
    ) -> None:
        if entry.name.endswith(TEMP_SUFFIX):
            os.unlink(entry.path)
            result.temp_files += 1
            return
        block_hash = parse_block_file_name(entry.name)
        if block_hash is None:
            return  # not ours; leave it alone
        header = read_header(Path(entry.path))
        if header is None or header.block_hash != block_hash:
            os.unlink(entry.path)
            result.bad.append(block_hash)
            return
        found.append((entry.stat().st_mtime_ns, header))

    def _victims(self, num_bytes: int) -> list[int] | None:
        if num_bytes > self.capacity:
            return None
        victims, free = [], self.capacity - self.used_bytes
        for block_hash, header in self.entries.items():
            if free >= num_bytes:
                break
            if block_hash not in self._pins:
                victims.append(block_hash)
                free += header.file_bytes
        return victims if free >= num_bytes else None
