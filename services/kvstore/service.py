"""The kvstore service: a content-addressed pool of KV blocks in DRAM and on SSD.

Control over NATS (lookup, put, and the gets of askers that encrypt); bytes over the data
plane, where a get asked on a worker's own connection is answered on it
(shared/transfer/tcp/asking.py); KV events so the conductor knows which blocks live here.
Several instances split the blocks by consistent hashing (shared/kvpool/hash_ring.py), which
their clients compute.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from services.kvstore.arena import BlockArena
from services.kvstore.gets import Gets
from services.kvstore.inbox import PutInbox
from services.kvstore.store import BlockRef, BlockStore
from shared import subjects
from shared.codec import MessageError, decode, encode
from shared.kvpool.events import publish_kv_events
from shared.messages import (
    Ack,
    BlockGet,
    BlockLookup,
    BlockPresence,
    BlockPut,
    Heartbeat,
    KVResync,
    PutSlots,
    StatsRequest,
    StoreStats,
)
from shared.runtime.bus import Bus
from shared.runtime.service import Service, ServiceConfig
from shared.transfer.address import advertised
from shared.transfer.common.encryption import require_token
from shared.transfer.tcp import TcpKVReceiver, TcpKVSender
from shared.transfer.tcp.asking import Answer
from shared.transfer.tcp.placed import ArenaOffer

log = logging.getLogger("kvstack.kvstore")
PUT_TTL = 30.0
PUT_DRAIN_WAIT = 5.0
EVENT_INTERVAL = 0.2


@dataclass(frozen=True)
class KvstoreConfig(ServiceConfig):
    dram_bytes: int = 4 << 30
    disk_dir: str = ""  # empty: DRAM only
    disk_bytes: int = 0
    compress: bool = False
    data_host: str = "127.0.0.1"
    data_port: int = 0
    advertise_data_addr: str = ""
    data_token: str = ""
    data_encrypt: bool = False  # encrypt KV bytes on the data plane (needs data_token)
    shared_memory: bool = True  # a ring in /dev/shm to a peer on this host (tcp.ring)

    def __post_init__(self) -> None:
        require_token(self.data_token, self.data_encrypt)


class KvstoreService(Service):
    name = "kvstore"

    def __init__(self, config: KvstoreConfig) -> None:
        super().__init__(config)
        self.config: KvstoreConfig = config
        disk_dir = Path(config.disk_dir) if config.disk_dir else None
        # NOTE: shared with workers on this host, who read gets in place (tcp.placed)
        self.blocks = (
            BlockArena.create(config.dram_bytes)
            if config.shared_memory and not config.data_encrypt
            else None
        )
        self.store = BlockStore(
            config.dram_bytes, disk_dir, config.disk_bytes, config.compress, self.blocks
        )
        self.inbox = PutInbox(self.store)
        served_bytes = self.metrics.counter("served_bytes", "block bytes sent to clients")
        self.gets = Gets(self.store, served_bytes)
        self.stored_bytes = self.metrics.gauge("stored_bytes", "block bytes held", ("tier",))
        self.metrics.counter_of("block_queries", "blocks clients asked to get", self._queries)
        self.metrics.counter_of(
            "block_hits",
            "blocks served, by the tier that held them (dram, or ssd: promoted first)",
            self._hits,
            label="tier",
        )

    async def start(self, bus: Bus) -> None:
        token, encrypt = self.config.data_token or None, self.config.data_encrypt
        ring = self.config.shared_memory
        self.receiver = TcpKVReceiver(
            self.inbox,
            self.config.data_host,
            self.config.data_port,
            token,
            encrypt=encrypt,
            shared_memory=ring,
            server=self,  # asks on a data connection: `answer`
        )
        bound = self.receiver.start()  # listen even when peers dial another address
        self.data_addr = advertised(bound, self.config.advertise_data_addr)
        self.sender = TcpKVSender(token, encrypt=encrypt, shared_memory=ring)
        for op, handler, kind in (
            ("lookup", self._lookup, BlockLookup),
            ("get", self._get, BlockGet),
            ("put", self._put, BlockPut),
        ):
            await bus.serve(subjects.kvstore_op(self.worker_id, op), handler, expected=kind)
        await bus.serve(
            subjects.worker_stats(self.name, self.worker_id), self._stats, expected=StatsRequest
        )
        await bus.subscribe(subjects.kv_resync(), self._resync, expected=KVResync)
        self.tasks.every(EVENT_INTERVAL, self._housekeeping, "housekeeping")
        self.metrics.counter_of(
            "data_sent_bytes",
            "data-plane bytes sent (gets)",
            lambda: self.sender.bytes_sent + self.gets.asked_bytes,
        )
        self.metrics.counter_of(
            "data_received_bytes",
            "data-plane bytes received (puts)",
            lambda: self.receiver.bytes_received,
        )

    def _queries(self) -> int:
        s = self.store.stats()
        return s["dram_hits"] + s["dram_misses"]  # a DRAM miss is an SSD hit or a miss

    def _hits(self) -> dict[str, int]:
        s = self.store.stats()
        return {"dram": s["dram_hits"], "ssd": s["disk_hits"]}

    async def drain(self) -> None:
        """Let puts in flight land (a few seconds: one whose sender died would wait for its
        TTL), then keep what DRAM holds on the SSD tier (if any), so the next start of this
        instance serves it."""
        deadline = time.monotonic() + PUT_DRAIN_WAIT
        while len(self.inbox) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.inbox.expire(math.inf)  # what has not landed by now is dropped, never half-kept
        written = await asyncio.to_thread(self.store.flush)
        if written:
            log.info(
                "%s: wrote %d blocks to the SSD tier for the next start", self.worker_id, written
            )

    async def stop(self) -> None:
        self.receiver.stop()
        self.sender.close()

    def heartbeat(self) -> Heartbeat:
        stats = self.store.stats()
        for tier in ("dram", "disk"):
            self.stored_bytes.labels(tier).set(stats.get(f"{tier}_bytes", 0))
        return Heartbeat(
            self.name,
            self.worker_id,
            time.time(),
            self.config.heartbeat_interval,
            http_addr=self.http_addr,
            data_addr=self.data_addr,
            draining=self.draining,
        )

    async def _stats(self, _: StatsRequest) -> StoreStats:
        s = self.store.stats()
        return StoreStats(
            self.worker_id,
            s["dram_blocks"],
            s["disk_blocks"],
            s["dram_bytes"],
            s["disk_bytes"],
            s["dram_hits"] + s["disk_hits"],
            self.gets.num_misses,
        )

    async def _lookup(self, msg: BlockLookup) -> BlockPresence:
        return BlockPresence(tuple(self.store.lookup(msg.block_hashes)))

    async def _get(self, msg: BlockGet) -> Ack:
        """A get over the bus: the blocks go to the asker's data address."""
        refused = self.gets.refused(msg)
        if refused is not None:
            return refused
        refs = self.store.pin_resident(msg.block_hashes, msg.layout)
        if None in refs:  # on SSD, or missing: promoting reads files
            refs = await asyncio.to_thread(self.store.acquire, msg.block_hashes, msg.layout, refs)
        ack = self.gets.counted(msg, refs)
        if ack.ok:
            self._send(msg, refs)
        return ack

    def _send(self, msg: BlockGet, refs: list) -> None:
        for frame in self.gets.frames(msg, refs):
            spans = frame.spans
            self.sender.send(msg.dest_addr, msg.request_id, frame.layer, spans, frame.layers)
        self.sender.finish(
            msg.dest_addr, msg.request_id, lambda ok, frames, error: self.store.release(refs)
        )

    async def _put(self, msg: BlockPut) -> PutSlots:
        """A put over the bus: its blocks come on a connection of the worker's sender."""
        refs = self.store.reserve_in_room(msg.block_hashes, msg.layout)
        if refs is None:  # room must be made: evicting may write files
            refs = await asyncio.to_thread(self._reserve, msg)
        return self._slots(msg, refs, self.data_addr)

    def _reserve(self, msg: BlockPut) -> list[BlockRef | None]:
        return [self.store.reserve(h, msg.layout) for h in msg.block_hashes]

    def _slots(self, msg: BlockPut, refs: list[BlockRef | None], data_addr: str) -> PutSlots:
        self.inbox.open(msg.request_id, refs, PUT_TTL)
        slots = tuple(slot if ref is not None else -1 for slot, ref in enumerate(refs))
        return PutSlots(msg.request_id, True, slots, data_addr)

    def arena(self) -> ArenaOffer | None:
        """Where the DRAM tier's blocks lie, for askers on this host (tcp.placed)."""
        return None if self.blocks is None else self.blocks.offer()

    def answer(self, question: bytes) -> Answer:
        """A get or a put asked on a data connection (shared/transfer/tcp/asking.py), on its
        thread: promoting or evicting may read or write files. A get's blocks go back on
        that connection; a put's come on it after the slots."""
        try:
            msg = decode(question, expected=(BlockGet, BlockPut))
        except MessageError as e:
            return Answer(encode(Ack("", False, f"neither a get nor a put: {e}", 400)))
        if isinstance(msg, BlockGet):
            return self.gets.answer(msg)
        refs = self.store.reserve_in_room(msg.block_hashes, msg.layout)
        slots = self._slots(msg, self._reserve(msg) if refs is None else refs, "")
        return Answer(encode(slots))

    async def _housekeeping(self) -> None:
        self.inbox.expire(time.time())
        stored, removed = self.store.take_events()
        await publish_kv_events(self.live_bus, self.worker_id, self.name, stored, removed)

    async def _resync(self, _: KVResync) -> None:
        """A (re)started conductor asks: all this instance stores, as one snapshot."""
        hashes = await asyncio.to_thread(self.store.snapshot)
        await publish_kv_events(self.live_bus, self.worker_id, self.name, hashes, snapshot=True)
