"""The SSD block file format: header round trip, damage detection, names."""

from __future__ import annotations

import pytest

from services.kvstore.blockfile import (
    HEADER_SIZE,
    BlockHeader,
    block_file_name,
    encode_payload,
    parse_block_file_name,
    read_block_file,
    read_header,
    write_block_file,
)
from tests.services.kvstore.blocks import LAYOUT, content

HEADER = BlockHeader(
    0xDEADBEEF12345678, LAYOUT, flags=0, payload_len=LAYOUT.block_bytes, checksum=42
)


def test_header_round_trip():
    packed = HEADER.pack()
    assert len(packed) == HEADER_SIZE
    assert BlockHeader.unpack(packed) == HEADER


@pytest.mark.parametrize("index", range(0, HEADER_SIZE, 7))
def test_any_flipped_header_byte_is_detected(index):
    packed = bytearray(HEADER.pack())
    packed[index] ^= 0x10
    assert BlockHeader.unpack(bytes(packed)) is None


def test_a_short_header_is_detected():
    assert BlockHeader.unpack(HEADER.pack()[:-1]) is None


def test_file_names_round_trip_and_foreign_names_are_ignored():
    name = block_file_name(2**64 - 1)
    assert name == "ffffffffffffffff.kvb"
    assert parse_block_file_name(name) == 2**64 - 1
    for foreign in ("notes.txt", "abc.kvb", "zzzzzzzzzzzzzzzz.kvb", "ffffffffffffffff.kvb.tmp"):
        assert parse_block_file_name(foreign) is None


def test_write_then_read_back(tmp_path):
    import xxhash

    data = content(5)
    flags, payload = encode_payload(memoryview(data), compress=False)
    header = BlockHeader(5, LAYOUT, flags, len(payload), xxhash.xxh3_64_intdigest(data))
    assert write_block_file(tmp_path, header, payload)
    path = tmp_path / block_file_name(5)
    assert read_header(path) == header
    into = bytearray(LAYOUT.block_bytes)
    assert read_block_file(path, header, memoryview(into))
    assert bytes(into) == data
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left
    path.write_bytes(path.read_bytes() + b"x")  # a longer file is damaged too
    assert read_header(path) is None
    assert not read_block_file(path, header, memoryview(into))


def test_a_failed_write_leaves_nothing(tmp_path):
    missing = tmp_path / "gone"
    assert not write_block_file(missing, HEADER, b"\0" * LAYOUT.block_bytes)
    assert not missing.exists()
