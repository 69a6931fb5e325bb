"""Where each KV block lives, kept from KV events: block hash -> the workers holding it.

A prompt's prefix match on a worker walks the prompt's block hashes until the first
miss, so a lookup costs time in the prompt's blocks, not in the size of the index.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from shared.messages import KVEvent
from services.conductor.snapshot import PrefixMatch

POOL = "kvstore"


class PrefixIndex:
    def __init__(self) -> None:
        self._holders: dict[int, set[str]] = {}      # block hash -> worker ids
        self._blocks: dict[str, set[int]] = {}       # worker id -> block hashes
        self._service: dict[str, str] = {}           # worker id -> service

    def __len__(self) -> int:
        return len(self._holders)

    def apply(self, event: KVEvent) -> None:
        self._service[event.source] = event.service
        blocks = self._blocks.setdefault(event.source, set())
        for block_hash in event.stored:
            self._holders.setdefault(block_hash, set()).add(event.source)
            blocks.add(block_hash)
        for block_hash in event.removed:
            self._drop(block_hash, event.source)
            blocks.discard(block_hash)

    def forget(self, worker_id: str) -> None:
        """A dead worker's blocks leave the index."""
        for block_hash in self._blocks.pop(worker_id, ()):
            self._drop(block_hash, worker_id)
        self._service.pop(worker_id, None)

    def match(self, block_hashes: Sequence[int], workers: Iterable[str]) -> PrefixMatch:
        """Leading blocks cached on each of `workers`, and in the kvstore pool as a whole."""
        by_worker = {w: 0 for w in workers}
        alive = set(by_worker)
        pool_blocks = None
        for i, block_hash in enumerate(block_hashes):
            holders = self._holders.get(block_hash, set())
            alive &= holders
            for worker in alive:
                by_worker[worker] = i + 1
            if pool_blocks is None and not any(self._service.get(h) == POOL for h in holders):
                pool_blocks = i
            if not alive and pool_blocks is not None:
                break
        return PrefixMatch(by_worker, len(block_hashes) if pool_blocks is None else pool_blocks)

    def _drop(self, block_hash: int, worker_id: str) -> None:
        holders = self._holders.get(block_hash)
        if holders is not None:
            holders.discard(worker_id)
            if not holders:
                del self._holders[block_hash]
