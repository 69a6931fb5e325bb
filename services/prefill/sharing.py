"""A prefill worker's cache, shared: blocks served to peers on request (hot-spot
replication), and KV events so the conductor knows what this worker holds."""

from __future__ import annotations

import asyncio

from shared.engine.loop import EngineLoop
from shared.kvblocks import BlockLayout
from shared.kvpool.events import publish_kv_events
from shared.kvpool.kvstore_client import send_blocks
from shared.messages import Ack, BlockGet, KVResync
from shared.runtime.bus import Bus
from shared.transfer.base import KVSender

EVENT_INTERVAL = 0.2


class CacheSharing:
    def __init__(self, worker_id: str, bus: Bus, engine_loop: EngineLoop, sender: KVSender) -> None:
        self.worker_id, self.bus = worker_id, bus
        self.engine_loop, self.sender = engine_loop, sender
        self.layout = BlockLayout.of(engine_loop.engine.kv_storage)
        self.blocks_served = 0

    async def serve_get(self, msg: BlockGet) -> Ack:
        """Send blocks of my prefix cache; they stay pinned until the send is done."""
        if msg.layout != self.layout:
            return Ack(
                msg.request_id, False, "a different KV layout (model, dtype or block size)", 400
            )
        blocks = await self.engine_loop.call(lambda e: e.pin_cached_blocks(msg.block_hashes))
        if blocks is None:
            return Ack(msg.request_id, False, "some blocks are not cached here (any more)", 404)
        loop = asyncio.get_running_loop()
        unpin = lambda *_: loop.call_soon_threadsafe(
            lambda: self.engine_loop.call(lambda e: e.unpin_blocks(blocks))
        )
        send_blocks(
            self.sender,
            self.engine_loop.engine.kv_storage,
            msg.dest_addr,
            msg.request_id,
            list(zip(msg.dest_block_ids, blocks, msg.block_hashes)),
            unpin,
        )
        self.blocks_served += len(blocks)
        return Ack(msg.request_id, True)

    async def publish_events(self) -> None:
        """What the cache stored and removed since the last round (every EVENT_INTERVAL)."""
        events = await self.engine_loop.call(lambda e: e.take_kv_events())
        if events:
            await publish_kv_events(
                self.bus, self.worker_id, "prefill", events.stored, events.removed
            )

    async def resync(self, _: KVResync) -> None:
        """A (re)started conductor asks: all this worker caches, as one snapshot."""
        hashes = await self.engine_loop.call(lambda e: e.cached_block_hashes())
        await publish_kv_events(self.bus, self.worker_id, "prefill", hashes, snapshot=True)
