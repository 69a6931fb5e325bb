"""A get's spans: runs of consecutive destination blocks, each small enough to be one wire
part (hashed, then sent while still in cache)."""

from __future__ import annotations

from services.kvstore.inbox import PutInbox
from services.kvstore.runs import get_spans
from services.kvstore.store import BlockStore
from shared.kvblocks import BlockLayout
from shared.transfer.base import BlockSpan
from shared.transfer.tcp.wire import PART_BYTES, blocks_per_part

LAYOUT = BlockLayout(num_layers=30, block_size=16, half_bytes=6144)  # SmolLM2's, bf16


def pinned(store: BlockStore, hashes: list[int]):
    for block_hash in hashes:
        store.commit(store.reserve(block_hash, LAYOUT))
    return store.pin_resident(hashes, LAYOUT)


def test_a_long_run_travels_as_spans_of_at_most_a_part_each() -> None:
    refs = pinned(BlockStore(1 << 26, None, 0, False), list(range(1, 17)))
    layers = range(0, 11)
    spans = get_spans(layers, list(range(100, 116)), refs, LAYOUT)
    most = blocks_per_part(len(layers), LAYOUT.half_bytes)
    assert 1 < most < 16 and len(spans) == -(-16 // most)
    assert [s.block_id for s, _, _ in spans] == list(range(100, 116, most))
    assert sum(s.num_tokens for s, _, _ in spans) == 16 * LAYOUT.block_size
    for span, k, v in spans:
        assert sum(p.nbytes for p in (*k, *v)) <= PART_BYTES
        assert len(k) == len(layers) * span.num_tokens // LAYOUT.block_size  # a piece a block


def test_gaps_split_runs_and_a_lone_block_is_named_by_its_hash() -> None:
    refs = pinned(BlockStore(1 << 26, None, 0, False), [7, 8, 9])
    spans = get_spans(range(30), [4, 5, 9], refs, LAYOUT)
    assert [(s.block_id, s.num_tokens) for s, _, _ in spans] == [(4, 32), (9, 16)]
    assert [s.block_hash for s, _, _ in spans] == [0, 9]


def test_a_runs_pieces_are_each_layers_k_of_every_block_then_the_same_of_v() -> None:
    refs = pinned(BlockStore(1 << 26, None, 0, False), [7, 8, 9])
    ((_, k, v),) = get_spans(range(2, 5), [4, 5, 6], refs, LAYOUT)
    for half, pieces in ((0, k), (1, v)):
        expected = [ref.view(layer, half) for layer in range(2, 5) for ref in refs]
        assert len(pieces) == len(expected) and all(
            a is b for a, b in zip(pieces, expected, strict=True)
        )
    ((_, k, v),) = get_spans(range(2, 5), [4], refs[:1], LAYOUT)  # a lone block: its own views
    assert all(a is refs[0].view(layer, 0) for a, layer in zip(k, range(2, 5), strict=True))


def test_a_put_names_its_blocks_own_buffers_in_each_layer_asked_and_no_other() -> None:
    store = BlockStore(1 << 26, None, 0, False)
    inbox = PutInbox(store)
    refs = [store.reserve(h, LAYOUT) for h in (1, 2)]
    inbox.open("put", refs, 10.0)
    run = BlockSpan(0, 0, 2 * LAYOUT.block_size)
    many = inbox.destinations("put", range(3, 5), run, 2 * LAYOUT.half_bytes)
    assert many is not None and len(many) == 2
    for layer, (k, v) in zip(range(3, 5), many, strict=True):
        assert all(a is ref.view(layer, 0) for a, ref in zip(k, refs, strict=True))
        assert all(a is ref.view(layer, 1) for a, ref in zip(v, refs, strict=True))
    assert inbox.destinations("put", range(29, 31), run, 2 * LAYOUT.half_bytes) is None
    assert inbox.destinations("put", range(0, 2), run, LAYOUT.half_bytes) is None  # size
    assert inbox.destinations("other", range(0, 2), run, 2 * LAYOUT.half_bytes) is None
    inbox.on_frames("put", range(3, 5), (run,), True, "")
    inbox.on_frames("put", range(5, 6), (BlockSpan(1, 0, LAYOUT.block_size),), False, "bad")
    put = inbox._puts["put"]
    assert put.layers_ok == [{3, 4}, {3, 4}] and put.bad == {1}
