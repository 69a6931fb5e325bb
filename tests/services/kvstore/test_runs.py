"""A get's spans: runs of consecutive destination blocks, each small enough to be one wire
part (hashed, then sent while still in cache)."""

from __future__ import annotations

from services.kvstore.runs import get_spans
from services.kvstore.store import BlockStore
from shared.kvblocks import BlockLayout
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
