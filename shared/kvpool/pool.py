"""The KV pool a prefill or decode worker reads prompt prefixes from and writes finished
blocks to, whichever backend holds them (`--kv-pool`):

- `kvstore` (default): kvstack's own kvstore instances, found by their heartbeats, each
  owning a share of the hash ring (shared/kvpool/kvstore_client.py: `KvstorePool`);
- `mooncake`: Mooncake Store, a `mooncake_master` and the segments its clients lend it
  (shared/kvpool/mooncake_pool.py: `MooncakePool`).

Both key a block by its chain hash (shared/hashing.py) and keep the same promises: a
block the pool lacks, or cannot reach, is a miss, never an error; a block is served only
whole and verified; a write-back is best effort (a block the pool already holds is not
sent again).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from shared.kvblocks import BlockLayout
from shared.messages import Heartbeat
from shared.transfer.inbox import Expected

KV_POOLS = ("kvstore", "mooncake")
Done = Callable[[], None]  # a put's bytes were read: the caller may free its blocks


class KVPool(Protocol):
    layout: BlockLayout

    def observe(self, hb: Heartbeat) -> None:
        """A heartbeat was heard (the kvstore pool learns its members from them)."""

    def num_members(self) -> int:
        """How many instances make up the pool now; 0: there is no pool to use."""
        ...

    async def longest_prefix(self, block_hashes: Sequence[int]) -> int:
        """How many leading blocks of `block_hashes` the pool holds."""
        ...

    async def get(
        self, transfer_id: str, block_hashes: Sequence[int], dest_block_ids: Sequence[int]
    ) -> list[Expected] | None:
        """Fetch blocks into `dest_block_ids` of the worker's KV storage. Returns the
        inbox expectations that gate each layer (KVInbox), or None: a miss, nothing will
        land (the blocks may hold garbage; the caller computes them)."""
        ...

    async def cancel(self, expected: Expected) -> None:
        """Stop what may still land of a get (cutting its connection where that is the
        pool's to cut) and wait until nothing is landing: `expected.idle` is then set, and
        its blocks may be reused (unset: a frame never finished landing, they must not)."""

    async def put(
        self, transfer_id: str, block_hashes: Sequence[int], block_ids: Sequence[int], on_sent: Done
    ) -> int:
        """Offer blocks; the pool keeps those it lacks. `on_sent` runs (on any thread) once
        the blocks' bytes were read, so the caller may free them. Returns how many blocks
        are being stored."""
        ...

    async def report(self) -> None:
        """Tell the conductor what it should know of the pool (called every heartbeat)."""

    async def close(self) -> None:
        """Release the pool's connections (the worker is stopping)."""
