"""The DRAM tier in a shared arena: slots recycled, blocks of another size (or beyond the
arena) in private memory, arena blocks hashed when committed, gets of arena blocks placed
(and of any other, framed), and a put's slots never given back while a frame lands."""

from __future__ import annotations

import math
import os

import pytest
import xxhash

from services.kvstore.arena import BlockArena
from services.kvstore.gets import placed_message
from services.kvstore.inbox import PutInbox
from services.kvstore.store import BlockStore
from shared.kvblocks import BlockLayout
from shared.messages import BlockGet
from shared.transfer.base import BlockSpan
from shared.transfer.tcp.placed import parse_placed
from shared.transfer.tcp.wire import HEADER, check_header, unpack_layers
from tests.services.kvstore.blocks import BLOCK, LAYOUT, content, put

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd here")
OTHER = BlockLayout(num_layers=1, block_size=4, half_bytes=256)  # half the size


def store_in_arena(num_blocks: int) -> BlockStore:
    return BlockStore(num_blocks * BLOCK, arena=BlockArena.create(num_blocks * BLOCK))


def acquired(store: BlockStore, hashes, layout: BlockLayout = LAYOUT):
    refs = store.acquire(hashes, layout)
    assert None not in refs
    return refs


def test_an_evicted_blocks_slot_is_the_next_ones() -> None:
    store = store_in_arena(2)
    put(store, 1), put(store, 2)
    (one, two) = acquired(store, [1, 2])
    assert {one.slot, two.slot} == {0, 1}
    store.release([one, two])
    put(store, 3)  # evicts 1, the least recently used
    (three,) = acquired(store, [3])
    assert three.slot == one.slot and bytes(three.data()) == content(3)


def test_arena_blocks_are_hashed_when_committed() -> None:
    store = store_in_arena(2)
    put(store, 1)
    (ref,) = acquired(store, [1])
    assert ref.checksum == xxhash.xxh3_64_intdigest(content(1))


def test_a_block_of_another_size_lives_in_private_memory_and_goes_framed() -> None:
    store = BlockStore(4 * BLOCK, arena=BlockArena.create(4 * BLOCK))
    put(store, 1)  # the first block sets the slots' size
    put(store, 2, OTHER)
    (other,) = acquired(store, [2], OTHER)
    assert other.slot == -1 and bytes(other.data()) == content(2, OTHER)
    (first,) = acquired(store, [1])
    get = BlockGet("g", (1, 2), (0, 1), LAYOUT, "", math.inf)
    assert placed_message(get, [first, other]) == b""  # one block is not placed: framed
    assert placed_message(get, [first, first]) != b""


def test_a_get_of_arena_blocks_names_their_slots_and_checksums() -> None:
    store = store_in_arena(4)
    for block_hash in (7, 8, 9):
        put(store, block_hash)
    refs = acquired(store, [7, 8, 9])
    message = placed_message(BlockGet("g-1", (7, 8, 9), (5, 6, 2), LAYOUT, "", math.inf), refs)
    _, rid_len, layers, count, _ = check_header(message[: HEADER.size])
    placement = parse_placed(message[HEADER.size :], rid_len, unpack_layers(layers), count)
    assert placement.request_id == "g-1" and placement.slot_bytes == BLOCK
    assert placement.layers == range(LAYOUT.num_layers)
    assert placement.entries == tuple((d, r.slot, r.checksum) for d, r in zip((5, 6, 2), refs))


def test_blocks_beyond_the_arena_get_private_memory() -> None:
    store = BlockStore(3 * BLOCK, arena=BlockArena.create(2 * BLOCK))
    for block_hash in (1, 2, 3):
        assert put(store, block_hash)
    refs = acquired(store, [1, 2, 3])
    assert sorted(ref.slot for ref in refs) == [-1, 0, 1]
    assert [bytes(ref.data()) for ref in refs] == [content(h) for h in (1, 2, 3)]


@pytest.mark.parametrize("end", ["frame over", "connection lost"])
def test_a_put_expired_mid_frame_keeps_its_slots_until_the_frame_is_over(end) -> None:
    store = store_in_arena(2)
    inbox = PutInbox(store)
    refs = store.reserve_in_room([1], LAYOUT)
    inbox.open("put", refs, ttl=30.0)
    span = BlockSpan(0, 0, LAYOUT.block_size)
    assert inbox.destinations("put", range(2), span, LAYOUT.half_bytes) is not None  # landing
    assert inbox.expire(math.inf) == 1
    assert store.stats()["dram_pending_blocks"] == 1  # still reserved: the frame may write
    assert put(store, 2) and put(store, 3)  # 3 evicts 2: the expired put's slot is not free
    (three,) = acquired(store, [3])
    assert three.slot != refs[0].slot
    store.release([three])
    if end == "frame over":
        inbox.on_frames("put", range(2), (span,), True, "")
    else:
        inbox.on_lost(["put"], "connection closed")
    assert store.stats()["dram_pending_blocks"] == 0 and inbox.num_abandoned == 1
    assert put(store, 4) and store.lookup([1, 3, 4]) == [False, True, True]  # its slot, free


def test_an_expired_put_with_nothing_landing_gives_its_slots_back_at_once() -> None:
    store = store_in_arena(2)
    inbox = PutInbox(store)
    inbox.open("put", store.reserve_in_room([1, 2], LAYOUT), ttl=30.0)
    assert inbox.expire(math.inf) == 1
    assert store.stats()["dram_pending_blocks"] == 0 and inbox.num_abandoned == 2


def test_a_block_placed_whole_is_committed_with_the_checksum_it_was_checked_against() -> None:
    store = store_in_arena(2)
    inbox = PutInbox(store)
    inbox.open("put", store.reserve_in_room([1], LAYOUT), ttl=30.0)
    buffer = inbox.block_buffer("put", 0, BLOCK, checksum=0x1234)
    assert buffer is not None and inbox.block_buffer("put", 0, BLOCK - 1, 0) is None
    buffer[:] = content(1)
    span = BlockSpan(0, 0, LAYOUT.block_size)
    inbox.on_frames("put", range(LAYOUT.num_layers), (span,), True, "")
    inbox.on_end("put", LAYOUT.num_layers)
    (ref,) = acquired(store, [1])
    assert ref.checksum == 0x1234  # what the connection checked it against: not hashed again
