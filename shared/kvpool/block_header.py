"""A stored KV block's header: which block, in which layout, how long, and checksums of
its bytes and of itself. The kvstore's block files (services/kvstore/blockfile.py) and
the Mooncake Store pool's objects (shared/kvpool/mooncake_pool.py) both start with one, so a
block read back is served only when whole and intact.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

from shared.kvblocks import BlockLayout

MAGIC = b"KVSB"
VERSION = 1
FLAG_LZ4 = 1

# magic, version, flags, block_hash, num_layers, block_size, half_bytes, payload_len, checksum
_FIELDS = struct.Struct("<4sHHQIIQQQ")
_HEADER_CHECKSUM = struct.Struct("<Q")
HEADER_SIZE = _FIELDS.size + _HEADER_CHECKSUM.size


@dataclass(frozen=True, slots=True)
class BlockHeader:
    block_hash: int
    layout: BlockLayout
    flags: int
    payload_len: int  # bytes after the header (compressed size when FLAG_LZ4)
    checksum: int  # xxh3_64 of the uncompressed block bytes

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_LZ4)

    @property
    def file_bytes(self) -> int:
        return HEADER_SIZE + self.payload_len

    def pack(self) -> bytes:
        layout = self.layout
        fields = _FIELDS.pack(
            MAGIC,
            VERSION,
            self.flags,
            self.block_hash,
            layout.num_layers,
            layout.block_size,
            layout.half_bytes,
            self.payload_len,
            self.checksum,
        )
        return fields + _HEADER_CHECKSUM.pack(xxhash.xxh3_64_intdigest(fields))

    @classmethod
    def unpack(cls, data: bytes) -> BlockHeader | None:
        """The header in `data`, or None when it is short, foreign or damaged."""
        if len(data) < HEADER_SIZE:
            return None
        fields = data[: _FIELDS.size]
        (stored_checksum,) = _HEADER_CHECKSUM.unpack_from(data, _FIELDS.size)
        if stored_checksum != xxhash.xxh3_64_intdigest(fields):
            return None
        magic, version, flags, block_hash, layers, size, half, payload_len, checksum = (
            _FIELDS.unpack(fields)
        )
        if magic != MAGIC or version != VERSION or min(layers, size, half) < 1:
            return None
        return cls(block_hash, BlockLayout(layers, size, half), flags, payload_len, checksum)
