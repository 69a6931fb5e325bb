"""Helpers for the kvstore tests: blocks whose bytes follow from their hash."""

from __future__ import annotations

import numpy as np

from services.kvstore.store import BlockRef, BlockStore
from shared.kvblocks import BlockLayout

LAYOUT = BlockLayout(num_layers=2, block_size=4, half_bytes=256)  # 1 KiB blocks
BLOCK = LAYOUT.block_bytes


def content(block_hash: int, layout: BlockLayout = LAYOUT, compressible: bool = False) -> bytes:
    """The bytes block `block_hash` holds in these tests."""
    if compressible:
        pattern = np.arange(layout.block_bytes, dtype=np.uint32) // 64 + block_hash
        return (pattern % 7).astype(np.uint8).tobytes()
    return (
        np.random.default_rng(block_hash)
        .integers(0, 256, layout.block_bytes, dtype=np.uint8)
        .tobytes()
    )


def fill(ref: BlockRef, data: bytes) -> None:
    """Write a block the way the receiver does: layer by layer, K then V."""
    layout = ref.layout
    for layer in range(layout.num_layers):
        for half in (0, 1):
            start = layout.offset(layer, half)
            ref.view(layer, half)[:] = data[start : start + layout.half_bytes]


def put(
    store: BlockStore, block_hash: int, layout: BlockLayout = LAYOUT, compressible: bool = False
) -> bool:
    """Reserve, fill and commit one block; False when the store refused it."""
    ref = store.reserve(block_hash, layout)
    if ref is None:
        return False
    fill(ref, content(block_hash, layout, compressible))
    return store.commit(ref)


def read(store: BlockStore, block_hash: int, layout: BlockLayout = LAYOUT) -> bytes | None:
    """Acquire one block, copy its bytes layer by layer, release it; None on a miss."""
    (ref,) = store.acquire([block_hash], layout)
    if ref is None:
        return None
    data = b"".join(
        bytes(ref.view(layer, half)) for layer in range(layout.num_layers) for half in (0, 1)
    )
    store.release([ref])
    return data
