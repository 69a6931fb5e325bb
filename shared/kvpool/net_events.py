"""Stored/removed block events between two drains, reduced to each block's last change."""

from __future__ import annotations

from collections.abc import Iterable


class NetEvents:
    """The latest change per block hash since the last `take`.

    Events are netted because the service publishes the stored and removed lists as two
    batches: a block removed and stored again between drains must come out as stored
    only, or a subscriber applying "stored, then removed" would lose it. Not thread-safe.
    """

    def __init__(self) -> None:
        self._present: dict[int, bool] = {}  # insertion order = order of last change

    def stored(self, block_hashes: Iterable[int]) -> None:
        self._record(block_hashes, True)

    def removed(self, block_hashes: Iterable[int]) -> None:
        self._record(block_hashes, False)

    def take(self) -> tuple[list[int], list[int]]:
        """(stored, removed) since the last take, then forget them."""
        present, self._present = self._present, {}
        stored = [block_hash for block_hash, now in present.items() if now]
        removed = [block_hash for block_hash, now in present.items() if not now]
        return stored, removed

    def _record(self, block_hashes: Iterable[int], now_present: bool) -> None:
        for block_hash in block_hashes:
            self._present.pop(block_hash, None)
            self._present[block_hash] = now_present
