"""The SSD tier's file format: one file per block, a small header, then the payload.

A file is `<block hash as 16 hex digits>.kvb`:

    header  magic "KVSB", version, flags, block hash, layout (num_layers, block_size,
            half_bytes), payload length, xxh3_64 of the *uncompressed* payload, and an
            xxh3_64 of the header fields themselves
    payload the block's bytes, lz4-block compressed when flags say so

Files are written under a temporary name and renamed into place, so a complete-looking
name never holds a half-written file. Nothing is fsynced: this is a cache, and a file torn
by a crash fails its size or checksum test and is dropped, never served.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import xxhash

from shared.kvpool.block_header import FLAG_LZ4, HEADER_SIZE, BlockHeader

BLOCK_SUFFIX = ".kvb"
TEMP_SUFFIX = ".tmp"


def block_file_name(block_hash: int) -> str:
    return f"{block_hash:016x}{BLOCK_SUFFIX}"


def parse_block_file_name(name: str) -> int | None:
    """The block hash a block file's name carries, or None for any other name."""
    stem = name.removesuffix(BLOCK_SUFFIX)
    if stem == name or len(stem) != 16:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None


def encode_payload(data: memoryview, compress: bool) -> tuple[int, bytes | memoryview]:
    """(flags, payload) for a block's bytes; compression is kept only when it saves bytes."""
    if not compress:
        return 0, data
    import lz4.block  # NOTE: imported only when compression is on; it is an optional package

    packed = lz4.block.compress(data, store_size=False)
    if len(packed) >= len(data):
        return 0, data
    return FLAG_LZ4, packed


def write_block_file(directory: Path, header: BlockHeader, payload: bytes | memoryview) -> bool:
    """Write a block file atomically (temporary name, then rename); False on any OS error,
    leaving no temporary file behind."""
    final = directory / block_file_name(header.block_hash)
    temp = directory / f"{final.stem}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}"
    try:
        with open(temp, "wb") as f:
            f.write(header.pack())
            f.write(payload)
        os.replace(temp, final)
        return True
    except OSError:
        temp.unlink(missing_ok=True)
        return False


def read_header(path: Path) -> BlockHeader | None:
    """The header of a block file whose size matches it; None for a bad or torn file."""
    try:
        with open(path, "rb") as f:
            header = BlockHeader.unpack(f.read(HEADER_SIZE))
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return None
    if header is None or size != header.file_bytes:
        return None
    return header


def read_block_file(path: Path, expected: BlockHeader, into: memoryview) -> bool:
    """Fill `into` (layout.block_bytes long) with the block stored at `path`.

    True only when the file still carries `expected`'s header, has exactly its payload
    and the uncompressed bytes match its checksum; on False `into` holds garbage.
    """
    try:
        with open(path, "rb") as f:
            if BlockHeader.unpack(f.read(HEADER_SIZE)) != expected:
                return False
            if not _read_payload(f, expected, into):
                return False
    except OSError:
        return False
    return xxhash.xxh3_64_intdigest(into) == expected.checksum


def _read_payload(f, header: BlockHeader, into: memoryview) -> bool:
    if not header.compressed:
        return f.readinto(into) == len(into) == header.payload_len and not f.read(1)
    packed = f.read(header.payload_len + 1)
    if len(packed) != header.payload_len:
        return False
    try:
        import lz4.block
    except ImportError:
        return False
    try:
        raw = lz4.block.decompress(packed, uncompressed_size=len(into))
    except lz4.block.LZ4BlockError:
        return False
    if len(raw) != len(into):
        return False
    into[:] = raw
    return True
