"""BlockStore with DRAM only: capacity, LRU, pins, visibility, events."""

from __future__ import annotations

import pytest

from services.kvstore.store import BlockStore
from shared.kvblocks import BlockLayout
from tests.services.kvstore.blocks import BLOCK, LAYOUT, content, fill, put, read


def test_capacity_never_exceeded_under_a_stream_of_puts():
    store = BlockStore(dram_bytes=5 * BLOCK + BLOCK // 2)
    for block_hash in range(100):
        assert put(store, block_hash)
        stats = store.stats()
        assert stats["dram_bytes"] <= stats["dram_capacity"]
        assert stats["dram_blocks"] == min(block_hash + 1, 5)
    assert store.lookup(range(100)) == [False] * 95 + [True] * 5


def test_lru_evicts_the_least_recently_used_block():
    store = BlockStore(dram_bytes=3 * BLOCK)
    for block_hash in (1, 2, 3):
        put(store, block_hash)
    assert read(store, 1) == content(1)  # 1 is now the youngest; 2 the oldest
    put(store, 4)
    assert store.lookup([1, 2, 3, 4]) == [True, False, True, True]
    put(store, 5)
    assert store.lookup([1, 3, 4, 5]) == [True, False, True, True]


def test_lookup_does_not_change_lru_order():
    store = BlockStore(dram_bytes=2 * BLOCK)
    put(store, 1)
    put(store, 2)
    assert store.lookup([1]) == [True]
    put(store, 3)
    assert store.lookup([1, 2, 3]) == [False, True, True]


def test_pinned_blocks_are_never_evicted():
    store = BlockStore(dram_bytes=3 * BLOCK)
    refs = [store.reserve(block_hash, LAYOUT) for block_hash in (1, 2, 3)]
    assert all(refs)
    assert store.reserve(4, LAYOUT) is None  # all reserved: no room, no exception
    for ref in refs:
        fill(ref, content(ref.block_hash))
        store.commit(ref)
    held = store.acquire([1, 2, 3], LAYOUT)
    assert store.reserve(4, LAYOUT) is None  # all being read: still no room
    assert store.stats()["no_room"] == 2
    store.release(held[:1])
    assert put(store, 4)
    assert store.lookup([1, 2, 3, 4]) == [False, True, True, True]
    assert [read(store, h) for h in (2, 3)] == [content(2), content(3)]
    store.release(held[1:])


def test_a_block_larger_than_dram_is_refused():
    store = BlockStore(dram_bytes=BLOCK - 1)
    assert store.reserve(1, LAYOUT) is None
    assert store.stats()["dram_bytes"] == 0


def test_reservations_are_invisible_until_committed():
    store = BlockStore(dram_bytes=4 * BLOCK)
    ref = store.reserve(7, LAYOUT)
    assert store.lookup([7]) == [False]
    assert store.acquire([7], LAYOUT) == [None]
    assert store.reserve(7, LAYOUT) is None  # already being received: skip it
    fill(ref, content(7))
    assert store.commit(ref)
    assert not store.commit(ref)  # committing twice is refused
    assert store.lookup([7]) == [True]
    assert store.reserve(7, LAYOUT) is None  # stored: skip it
    assert read(store, 7) == content(7)


def test_abandon_frees_the_space_and_stores_nothing():
    store = BlockStore(dram_bytes=BLOCK)
    ref = store.reserve(1, LAYOUT)
    assert store.abandon(ref)
    assert not store.abandon(ref)
    assert store.stats()["dram_bytes"] == 0
    assert store.lookup([1]) == [False]
    assert store.take_events() == ([], [])
    assert put(store, 1)


def test_acquired_views_are_read_only_and_reserved_views_writable():
    store = BlockStore(dram_bytes=BLOCK)
    ref = store.reserve(1, LAYOUT)
    assert not ref.view(0, 0).readonly
    fill(ref, content(1))
    store.commit(ref)
    (acquired,) = store.acquire([1], LAYOUT)
    assert acquired.view(1, 1).readonly
    assert len(acquired.view(1, 1)) == LAYOUT.half_bytes
    assert bytes(acquired.data()) == content(1)
    store.release([acquired])


def test_layout_mismatch_is_a_miss():
    store = BlockStore(dram_bytes=4 * BLOCK)
    put(store, 1)
    other = BlockLayout(num_layers=4, block_size=4, half_bytes=128)  # same size, other shape
    assert store.acquire([1], other) == [None]
    assert store.stats()["dram_misses"] == 1
    assert read(store, 1) == content(1)


def test_without_an_ssd_eviction_drops_and_reports_removed():
    store = BlockStore(dram_bytes=2 * BLOCK)
    for block_hash in (1, 2, 3):
        put(store, block_hash)
    stored, removed = store.take_events()
    assert (stored, removed) == ([2, 3], [1])  # netted: 1 came and went
    assert store.stats()["dram_evictions"] == 1
    assert store.stats()["demotions"] == 0
    assert read(store, 1) is None


def test_events_report_stored_and_removed_then_reset():
    store = BlockStore(dram_bytes=BLOCK)
    put(store, 1)
    assert store.take_events() == ([1], [])
    put(store, 2)  # evicts 1
    assert store.take_events() == ([2], [1])
    assert store.take_events() == ([], [])


def test_a_block_removed_then_stored_again_nets_to_stored():
    store = BlockStore(dram_bytes=BLOCK)
    put(store, 1)
    store.take_events()
    put(store, 2)  # 1 removed
    put(store, 1)  # 2 removed, 1 stored again
    assert store.take_events() == ([1], [2])


def test_release_tolerates_misses_and_stale_refs():
    store = BlockStore(dram_bytes=BLOCK)
    put(store, 1)
    refs = store.acquire([1, 2], LAYOUT)
    assert refs[1] is None
    store.release(refs)
    put(store, 3)  # 1 is unpinned, so it can go
    store.release(refs)  # a stale ref is ignored
    assert store.lookup([1, 3]) == [False, True]


@pytest.mark.parametrize("dram_bytes", [-1])
def test_negative_capacity_is_rejected(dram_bytes):
    with pytest.raises(ValueError):
        BlockStore(dram_bytes=dram_bytes)


def test_a_hot_blocks_views_are_made_once_and_read_only():
    store = BlockStore(dram_bytes=2 * BLOCK)
    put(store, 1)
    (first,), (second,) = store.acquire([1], LAYOUT), store.acquire([1], LAYOUT)
    assert first is not None and second is not None
    assert first.view(1, 0) is second.view(1, 0)  # the same view, not sliced again
    assert first.view(1, 0).readonly and bytes(first.view(1, 1)) == content(1)[768:1024]
    store.release([first, second])


def test_pin_resident_pins_what_dram_holds_and_leaves_the_rest_to_acquire():
    store = BlockStore(dram_bytes=2 * BLOCK)
    put(store, 1)
    refs = store.pin_resident([1, 2], LAYOUT)
    assert refs[0] is not None and refs[1] is None
    assert store.stats()["dram_hits"] == 1 and store.stats()["dram_misses"] == 0
    assert store.acquire([1, 2], LAYOUT, refs) == [refs[0], None]  # no second pin of 1
    store.release(refs)
    assert read(store, 1) == content(1)
    assert store.stats()["dram_misses"] == 1  # block 2, counted once


def test_reserve_in_room_reserves_all_or_nothing_and_evicts_nothing():
    store = BlockStore(dram_bytes=5 * BLOCK)
    put(store, 1)
    put(store, 2)
    assert store.reserve_in_room([3, 4, 5, 6], LAYOUT) is None  # room for 3: none reserved
    assert store.stats()["dram_blocks"] == 2 and store.lookup([1, 2]) == [True, True]
    refs = store.reserve_in_room([2, 3, 3], LAYOUT)  # 2 is stored, 3 asked twice
    assert refs is not None and refs[0] is None and refs[2] is None
    fill(refs[1], content(3))
    assert store.lookup([3]) == [False]  # invisible until committed, as reserve's
    store.commit(refs[1])
    assert read(store, 3) == content(3) and store.lookup([1, 2, 3]) == [True, True, True]
