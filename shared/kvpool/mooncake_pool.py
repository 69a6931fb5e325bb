"""The Mooncake Store KV pool (`--kv-pool mooncake`, shared/kvpool/pool.py).

Every call into the store client runs on the pool's own single thread (the client is
synchronous C++, and one thread keeps its staging buffers safe), never on the event loop.
A fetch lands in the worker's KV storage through its KVInbox, as a data-plane receiver
would land it: the expectation gates the layers, and a cancelled fetch writes nothing
more.

The conductor learns what the pool holds from this worker's reports: the pool beats as a
"kvstore" instance named `<worker id>-mooncake` (no data address, so no kvstore client
takes it for a ring member) and publishes the blocks this worker stored as its KV events.
Mooncake's evictions are not reported: the conductor's view of the pool may run ahead of
it, which costs a worse placement, never a wrong answer (the worker looks up the store
itself before it fetches).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from shared import subjects
from shared.kvblocks import BlockLayout
from shared.kvcache.storage import KVStorage
from shared.kvpool.events import publish_kv_events
from shared.kvpool.mooncake_store import MooncakeBlockStore, MooncakeStoreConfig
from shared.kvpool.pool import Done
from shared.messages import Heartbeat
from shared.runtime.bus import Bus
from shared.transfer.base import BlockSpan
from shared.transfer.inbox import Expected, KVInbox

T = TypeVar("T")
log = logging.getLogger("kvstack.mooncake_pool")
GET_TIMEOUT = 30.0  # NOTE: only bounds the inbox entry; the fetch has ended before it is used


class MooncakePool:
    def __init__(
        self,
        bus: Bus,
        storage: KVStorage,
        inbox: KVInbox,
        store: MooncakeBlockStore,
        thread: ThreadPoolExecutor,
        worker_id: str,
        heartbeat_interval: float = 1.0,
    ) -> None:
        self.bus, self.storage, self.inbox = bus, storage, inbox
        self.layout = store.layout
        self.store, self.thread = store, thread
        self.source = f"{worker_id}-mooncake"  # the pool as the conductor sees it
        self.instance = uuid.uuid4().hex[:12]
        self.interval = heartbeat_interval
        self.unreported: list[int] = []  # stored since the last report
        self.bytes_sent = self.bytes_received = 0

    @classmethod
    async def open(
        cls,
        bus: Bus,
        storage: KVStorage,
        inbox: KVInbox,
        config: MooncakeStoreConfig,
        worker_id: str,
        heartbeat_interval: float = 1.0,
    ) -> MooncakePool:
        """Connect to the store (on the pool's thread: setup blocks)."""
        thread = ThreadPoolExecutor(1, thread_name_prefix="mooncake-store")
        layout = BlockLayout.of(storage)
        loop = asyncio.get_running_loop()
        store = await loop.run_in_executor(thread, MooncakeBlockStore, config, layout)
        return cls(bus, storage, inbox, store, thread, worker_id, heartbeat_interval)

    def observe(self, hb: Heartbeat) -> None:
        """Membership is Mooncake's business (its master knows every segment)."""

    def num_members(self) -> int:
        return 1

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.thread, fn, *args)

    async def longest_prefix(self, block_hashes: Sequence[int]) -> int:
        try:
            present = await self._call(self.store.present, list(block_hashes))
        except Exception as e:  # NOTE: a store that fails is a miss, never an error
            log.warning("Mooncake Store lookup failed: %s", e)
            return 0
        return next((i for i, there in enumerate(present) if not there), len(present))

    # -- get ------------------------------------------------------------------------------

    async def get(
        self, transfer_id: str, block_hashes: Sequence[int], dest_block_ids: Sequence[int]
    ) -> list[Expected] | None:
        expected = self.inbox.expect(
            transfer_id, list(dest_block_ids), self.layout.num_layers, GET_TIMEOUT
        )
        landed = await self._call(self._land, transfer_id, list(block_hashes), dest_block_ids)
        if landed:
            return [expected]
        await self.cancel(expected)
        return None

    async def cancel(self, expected: Expected) -> None:
        """Nothing lands once `get` returned: only the expectation goes."""
        if self.inbox.retire(expected.transfer_id) is not None:
            await expected.idle.wait()  # NOTE: set at once: nothing lands once _land returned

    def _land(self, transfer_id: str, hashes: list[int], dest_ids: Sequence[int]) -> bool:
        """(store thread) Fetch, verify and write the blocks into the inbox's storage;
        then every layer is announced as one frame. False: a miss, nothing announced."""
        spans = [BlockSpan(d, 0, self.layout.block_size, h) for d, h in zip(dest_ids, hashes)]
        try:
            whole = self.store.get(
                hashes, lambda i, payload: self._write(transfer_id, spans[i], payload)
            )
        except _Refused:
            whole = False
        except Exception as e:  # NOTE: a store that fails is a miss, never an error
            log.warning("Mooncake Store get failed: %s", e)
            whole = False
        if not whole:
            self.inbox.on_lost([transfer_id], "a block is missing from Mooncake Store")
            return False
        for layer in range(self.layout.num_layers):
            self.inbox.on_frame(transfer_id, layer, tuple(spans), True, "")
        self.inbox.on_end(transfer_id, self.layout.num_layers)
        self.bytes_received += len(hashes) * self.layout.block_bytes
        return True

    def _write(self, transfer_id: str, span: BlockSpan, payload: memoryview) -> None:
        layout = self.layout
        for layer in range(layout.num_layers):
            dest = self.inbox.destination(transfer_id, layer, span, layout.half_bytes)
            if dest is None:  # cancelled (the request went away)
                raise _Refused
            k, v = dest
            k[:] = payload[layout.offset(layer, 0) : layout.offset(layer, 1)]
            v[:] = payload[layout.offset(layer, 1) : layout.offset(layer + 1, 0)]

    # -- put ------------------------------------------------------------------------------

    async def put(
        self, transfer_id: str, block_hashes: Sequence[int], block_ids: Sequence[int], on_sent: Done
    ) -> int:
        hashes, ids = list(block_hashes), list(block_ids)
        try:
            stored = await self._call(
                self.store.put, hashes, lambda i, into: self._read(ids[i], into)
            )
        except Exception as e:  # NOTE: best effort: the blocks are simply not pooled
            log.warning("Mooncake Store put failed: %s", e)
            on_sent()
            return 0
        on_sent()  # NOTE: the bytes are in the store by now
        self.unreported += hashes
        self.bytes_sent += stored * self.layout.block_bytes
        return stored

    def _read(self, block_id: int, into: memoryview) -> None:
        layout = self.layout
        for layer in range(layout.num_layers):
            self.storage.to_host(layer, block_id, 0, layout.block_size)
            k, v = self.storage.span_bytes(layer, block_id, 0, layout.block_size)
            into[layout.offset(layer, 0) : layout.offset(layer, 1)] = k
            into[layout.offset(layer, 1) : layout.offset(layer + 1, 0)] = v

    # -- the conductor's view -------------------------------------------------------------

    async def report(self) -> None:
        beat = Heartbeat("kvstore", self.source, time.time(), self.interval, instance=self.instance)
        await self.bus.publish(subjects.heartbeat("kvstore", self.source), beat)
        stored, self.unreported = self.unreported, []
        if stored:
            await publish_kv_events(self.bus, self.source, "kvstore", stored)

    async def close(self) -> None:
        """Leave the store (its segment's blocks go with it); waits for calls in flight."""
        await self._call(self.store.close)
        self.thread.shutdown(wait=False)


class _Refused(Exception):
    """The inbox took no more bytes for this fetch."""
