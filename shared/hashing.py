"""The block-hash contract shared by prefill caches, kvstore, KV events and the conductor.

Token ids are cut into blocks of `block_size`; only full blocks are hashed, and each
hash chains the previous one: h_i = xxh3_64(h_{i-1} || tokens of block i). A block hash
therefore names the whole prefix up to the end of its block. The chain starts from a
root derived from a namespace (model and KV layout), so blocks of different models
never share a name.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

ROOT_NAMESPACE = "kvstack"


def root_hash(namespace: str = ROOT_NAMESPACE) -> int:
    return xxhash.xxh3_64_intdigest(namespace.encode())


def chain_hash(parent: int, block_token_ids: Sequence[int]) -> int:
    tokens = np.asarray(block_token_ids, dtype=np.int64).tobytes()
    return xxhash.xxh3_64_intdigest(parent.to_bytes(8, "little") + tokens)


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    namespace: str = ROOT_NAMESPACE,
    start: int = 0,
    parent: int | None = None,
) -> list[int]:
    """Hashes of the full blocks of `token_ids`, from block index `start` on.

    `parent` is the hash of block `start - 1` (or the root when `start` is 0), so a
    caller that already holds the first hashes extends the chain without redoing it.
    """
    h = root_hash(namespace) if parent is None else parent
    hashes = []
    for begin in range(start * block_size, len(token_ids) - block_size + 1, block_size):
        h = chain_hash(h, token_ids[begin : begin + block_size])
        hashes.append(h)
    return hashes
