"""BlockStore with an SSD tier: demotion, promotion, restart, damaged files, lz4."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from services.kvstore import tiers
from services.kvstore.blockfile import HEADER_SIZE, block_file_name
from services.kvstore.store import BlockStore
from shared.kvblocks import BlockLayout
from tests.services.kvstore.blocks import BLOCK, LAYOUT, content, put, read

FILE = HEADER_SIZE + BLOCK  # an uncompressed block file


def two_tier(path: Path, dram_blocks: int = 2, disk_blocks: int = 4, **kwargs) -> BlockStore:
    return BlockStore(dram_blocks * BLOCK, path, disk_blocks * FILE, **kwargs)


def block_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_eviction_demotes_and_acquire_promotes_identical_bytes(tmp_path):
    store = two_tier(tmp_path)
    for block_hash in (1, 2, 3):
        put(store, block_hash)
    assert block_files(tmp_path) == [block_file_name(1)]
    assert store.lookup([1, 2, 3]) == [True, True, True]
    assert read(store, 1) == content(1)  # promoted; 2 demoted to make room
    stats = store.stats()
    assert (stats["promotions"], stats["disk_hits"], stats["demotions"]) == (1, 1, 2)
    assert stats["dram_blocks"] == 2 and stats["disk_blocks"] == 2
    assert read(store, 2) == content(2)
    assert store.take_events() == ([1, 2, 3], [])  # moving between tiers is no event


def test_both_capacities_hold_under_a_stream_of_puts(tmp_path):
    store = two_tier(tmp_path, dram_blocks=3, disk_blocks=5)
    for block_hash in range(60):
        assert put(store, block_hash)
        stats = store.stats()
        assert stats["dram_bytes"] <= stats["dram_capacity"]
        assert stats["disk_bytes"] <= stats["disk_capacity"]
        on_disk = sum(p.stat().st_size for p in tmp_path.iterdir())
        assert on_disk == stats["disk_bytes"] <= stats["disk_capacity"]
    assert store.lookup(range(60)) == [False] * 52 + [True] * 8
    assert store.stats()["disk_evictions"] == 60 - 8


def test_ssd_lru_deletes_the_least_recently_used_file(tmp_path):
    store = two_tier(tmp_path, dram_blocks=1, disk_blocks=3)
    for block_hash in (1, 2, 3):  # 1, 2 on SSD; 3 in DRAM
        put(store, block_hash)
    assert read(store, 1) == content(1)  # promoted (3 demoted): SSD use 2, 3, 1
    put(store, 4)  # demotes 1, already on SSD
    put(store, 5)  # demotes 4: SSD full, 2 goes
    assert store.lookup([1, 2, 3, 4, 5]) == [True, False, True, True, True]
    assert store.take_events()[1] == [2]
    assert store.stats()["disk_evictions"] == 1


def test_restart_keeps_the_ssd_tier_and_reports_it_stored(tmp_path):
    store = two_tier(tmp_path, disk_blocks=4)
    for block_hash in range(6):  # 0..3 on SSD, 4 and 5 in DRAM
        put(store, block_hash)
    del store
    again = two_tier(tmp_path, disk_blocks=4)
    stored, removed = again.take_events()
    assert sorted(stored) == [0, 1, 2, 3] and removed == []
    assert again.lookup(range(6)) == [True] * 4 + [False] * 2  # DRAM did not survive
    assert [read(again, h) for h in range(4)] == [content(h) for h in range(4)]


def test_restart_orders_the_ssd_lru_by_mtime(tmp_path):
    store = two_tier(tmp_path, dram_blocks=1, disk_blocks=3)
    for block_hash in (1, 2, 3, 4):
        put(store, block_hash)
    past = time.time() - 100
    for age, block_hash in enumerate((2, 1, 3)):  # 2 oldest, then 1, then 3
        os.utime(tmp_path / block_file_name(block_hash), (past + age, past + age))
    again = two_tier(tmp_path, dram_blocks=1, disk_blocks=3)
    assert again.take_events()[0] == [2, 1, 3]
    put(again, 10)
    put(again, 11)  # demotes 10: SSD full, 2 goes
    assert again.lookup([1, 2, 3]) == [True, False, True]


def test_restart_with_a_smaller_ssd_drops_the_oldest_files(tmp_path):
    store = two_tier(tmp_path, dram_blocks=1, disk_blocks=4)
    for block_hash in range(5):  # 0..3 on SSD
        put(store, block_hash)
    past = time.time() - 100
    for block_hash in range(4):  # NOTE: mtimes are too coarse to rely on
        os.utime(tmp_path / block_file_name(block_hash), (past + block_hash,) * 2)
    again = two_tier(tmp_path, dram_blocks=1, disk_blocks=2)
    assert sorted(again.take_events()[0]) == [2, 3]
    assert len(block_files(tmp_path)) == 2


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[(HEADER_SIZE + len(data)) // 2] ^= 0x40  # the middle of the payload
    elif how == "truncate":
        data = data[:-10]
    elif how == "header":
        data[3] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_corrupted_payload_is_deleted_and_never_served(tmp_path):
    store = two_tier(tmp_path)
    for block_hash in (1, 2, 3):
        put(store, block_hash)
    store.take_events()
    damage(tmp_path / block_file_name(1), "flip")
    assert store.acquire([1], LAYOUT) == [None]
    assert not (tmp_path / block_file_name(1)).exists()
    assert store.lookup([1]) == [False]
    assert store.take_events() == ([], [1])
    stats = store.stats()
    assert stats["corrupt_dropped"] == 1
    assert stats["dram_pending_blocks"] == 0  # the failed promotion left nothing
    assert stats["dram_bytes"] == stats["dram_blocks"] * BLOCK


@pytest.mark.parametrize("how", ["truncate", "header"])
def test_a_truncated_or_torn_file_is_discarded(tmp_path, how):
    store = two_tier(tmp_path)
    for block_hash in (1, 2, 3):
        put(store, block_hash)
    store.take_events()
    damage(tmp_path / block_file_name(1), how)
    assert store.acquire([1], LAYOUT) == [None]  # while running: at promotion
    assert store.take_events() == ([], [1])
    damage(tmp_path / block_file_name(2), how)  # demoted to make room for that try
    again = two_tier(tmp_path)  # at restart: at the scan
    assert again.take_events() == ([], [2])
    assert again.stats()["corrupt_dropped"] == 1
    assert block_files(tmp_path) == []


def test_leftover_temp_files_are_removed_at_start(tmp_path):
    store = two_tier(tmp_path)
    for block_hash in (1, 2, 3):
        put(store, block_hash)
    final = tmp_path / block_file_name(1)
    (tmp_path / f"{final.stem}.deadbeef.tmp").write_bytes(final.read_bytes()[:50])
    (tmp_path / "notes.txt").write_text("not ours")
    again = two_tier(tmp_path)
    assert again.take_events() == ([1], [])
    assert block_files(tmp_path) == [block_file_name(1), "notes.txt"]


def test_a_file_named_for_another_block_is_discarded(tmp_path):
    store = two_tier(tmp_path)
    for block_hash in (1, 2, 3):
        put(store, block_hash)
    os.replace(tmp_path / block_file_name(1), tmp_path / block_file_name(9))
    again = two_tier(tmp_path)
    assert again.take_events() == ([], [9])
    assert again.lookup([1, 9]) == [False, False]


def test_layout_mismatch_on_ssd_is_a_miss_and_keeps_the_file(tmp_path):
    store = two_tier(tmp_path)
    for block_hash in (1, 2, 3):
        put(store, block_hash)
    other = BlockLayout(num_layers=1, block_size=4, half_bytes=512)
    assert store.acquire([1], other) == [None]
    assert store.lookup([1]) == [True]
    assert read(store, 1) == content(1)


def test_a_block_on_ssd_is_not_reserved_again(tmp_path):
    store = two_tier(tmp_path)
    for block_hash in (1, 2, 3):
        put(store, block_hash)
    assert store.reserve(1, LAYOUT) is None


def test_no_room_on_ssd_drops_the_block(tmp_path):
    store = BlockStore(2 * BLOCK, tmp_path, FILE - 1)
    for block_hash in (1, 2, 3):
        put(store, block_hash)
    assert store.lookup([1, 2, 3]) == [False, True, True]
    assert store.take_events()[1] == [1]
    assert block_files(tmp_path) == []


def test_a_failed_write_drops_the_block_and_frees_its_claim(tmp_path, monkeypatch):
    monkeypatch.setattr(tiers, "write_block_file", lambda directory, header, payload: False)
    store = two_tier(tmp_path)
    for block_hash in (1, 2, 3):
        put(store, block_hash)
    stats = store.stats()
    assert (stats["disk_write_errors"], stats["demotions"], stats["disk_bytes"]) == (1, 0, 0)
    assert store.lookup([1]) == [False]
    assert store.take_events()[1] == [1]


def test_lz4_round_trip_shrinks_compressible_blocks(tmp_path):
    pytest.importorskip("lz4")
    store = two_tier(tmp_path, compress=True)
    for block_hash in (1, 2, 3):
        put(store, block_hash, compressible=True)
    assert (tmp_path / block_file_name(1)).stat().st_size < FILE // 4
    assert store.stats()["disk_bytes"] < FILE // 4
    assert read(store, 1, LAYOUT) == content(1, compressible=True)
    again = two_tier(tmp_path)  # read back without compress set
    assert read(again, 1) == content(1, compressible=True)


def test_lz4_keeps_incompressible_blocks_raw(tmp_path):
    pytest.importorskip("lz4")
    store = two_tier(tmp_path, compress=True)
    for block_hash in (1, 2, 3):
        put(store, block_hash)  # random bytes
    assert (tmp_path / block_file_name(1)).stat().st_size == FILE
    assert read(store, 1) == content(1)


def test_a_corrupted_compressed_file_is_discarded(tmp_path):
    pytest.importorskip("lz4")
    store = two_tier(tmp_path, compress=True)
    for block_hash in (1, 2, 3):
        put(store, block_hash, compressible=True)
    store.take_events()
    damage(tmp_path / block_file_name(1), "flip")
    assert store.acquire([1], LAYOUT) == [None]
    assert store.take_events() == ([], [1])


def test_a_snapshot_lists_both_tiers_once_and_supersedes_pending_events(tmp_path):
    store = two_tier(tmp_path)
    for block_hash in (1, 2, 3, 4):
        put(store, block_hash)  # two demoted to SSD, two in DRAM
    assert sorted(store.snapshot()) == [1, 2, 3, 4]
    assert store.take_events() == ([], [])


def test_a_flush_keeps_what_dram_holds_for_the_next_start(tmp_path):
    store = two_tier(tmp_path, dram_blocks=3, disk_blocks=4)
    for block_hash in (1, 2, 3):
        put(store, block_hash)
    assert block_files(tmp_path) == []  # nothing was evicted: DRAM only
    assert store.flush() == 3
    assert store.flush() == 0  # already there
    assert store.stats()["dram_blocks"] == 3  # still served from DRAM
    again = two_tier(tmp_path, dram_blocks=3, disk_blocks=4)
    assert [read(again, h) for h in (1, 2, 3)] == [content(h) for h in (1, 2, 3)]


def test_a_flush_without_an_ssd_tier_writes_nothing():
    store = BlockStore(2 * BLOCK)
    put(store, 1)
    assert store.flush() == 0
