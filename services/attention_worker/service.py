"""The attention worker (Lamina): holds a shard (whole KV heads) of the KV of a decode
worker's offloaded requests and computes their attention, layer by layer, for the q, k, v
the decode worker sends over the attention link. It never loads model weights."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import torch

from services.attention_worker.shard import AttentionShard
from services.attention_worker.slot import ShardSlot
from shared import subjects
from shared.errors import KvstackError
from shared.messages import (
    Ack,
    AttentionAttach,
    AttentionAttached,
    AttentionStats,
    Heartbeat,
    KVExpect,
    KVSettle,
    StatsRequest,
)
from shared.runtime.bus import Bus
from shared.runtime.service import Service, ServiceConfig
from shared.transfer.address import advertised
from shared.transfer.attention.server import AttentionServer
from shared.transfer.factory import refuse_encryption
from shared.transfer.tcp import TcpKVReceiver

log = logging.getLogger("kvstack.attention")


@dataclass(frozen=True)
class AttentionWorkerConfig(ServiceConfig):
    kv_cache_bytes: int = 1 << 30
    num_threads: int | None = None
    data_host: str = "127.0.0.1"  # KV from prefill workers, and the attention link
    data_port: int = 0
    link_port: int = 0
    advertise_host: str = ""  # what peers should dial, if not the bound host
    data_token: str = ""
    data_encrypt: bool = False  # refused: the attention link does not encrypt
    request_timeout: float = 10.0

    def __post_init__(self) -> None:
        refuse_encryption(self.data_encrypt, "an attention worker's link")


class AttentionWorkerService(Service):
    name = "attention-worker"

    def __init__(self, config: AttentionWorkerConfig) -> None:
        super().__init__(config)
        self.config: AttentionWorkerConfig = config
        self.slot = ShardSlot()
        self.decode_id = ""
        self.running = self.metrics.gauge(
            "num_requests_running", "requests whose KV shard this worker holds"
        )
        self.kv_usage = self.metrics.gauge(
            "kv_cache_usage_ratio", "share of KV blocks in use (0 to 1)"
        )

    async def start(self, bus: Bus) -> None:
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        token = self.config.data_token or None
        host = self.config.data_host
        self.receiver = TcpKVReceiver(self.slot, host, self.config.data_port, token)
        self.link = AttentionServer(self.slot, host, self.config.link_port, token)
        self.data_addr = self._advertised(self.receiver.start())
        self.link_addr = self._advertised(self.link.start())
        for op, handler, kind in (
            ("attach", self._attach, AttentionAttach),
            ("expect", self._expect, KVExpect),
            ("settle", self._settle, KVSettle),
        ):
            await bus.serve(subjects.attention_op(self.worker_id, op), handler, expected=kind)
        await bus.serve(
            subjects.worker_stats(self.name, self.worker_id), self._stats, expected=StatsRequest
        )
        self.tasks.every(1.0, self._expire, "expiring unsettled KV")
        self.metrics.counter_of(
            "data_sent_bytes", "attention outputs sent back", lambda: self.link.bytes_sent
        )
        self.metrics.counter_of(
            "data_received_bytes",
            "data-plane bytes received: q/k/v over the link, KV from prefill",
            lambda: self.link.bytes_received + self.receiver.bytes_received,
        )

    def _advertised(self, bound: str) -> str:
        host = self.config.advertise_host
        return advertised(bound, f"{host}:{bound.rpartition(':')[2]}" if host else "")

    async def drain(self) -> None:
        """Keep serving attention until the decode worker released every request (new
        ones are refused meanwhile, so it places them elsewhere)."""
        while self.slot.shard is not None and self.slot.shard.request_blocks:
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self.link.stop()
        self.receiver.stop()

    def heartbeat(self) -> Heartbeat:
        shard = self.slot.shard
        used = shard.used_blocks if shard else 0
        total = shard.storage.num_blocks if shard else 0
        self.kv_usage.set(used / total if total else 0.0)
        self.running.set(len(shard.request_blocks) if shard else 0)
        return Heartbeat(
            self.name,
            self.worker_id,
            time.time(),
            self.config.heartbeat_interval,
            http_addr=self.http_addr,
            data_addr=self.data_addr,
            num_running=len(shard.request_blocks) if shard else 0,
            free_blocks=total - used,
            total_blocks=total,
            draining=self.draining,
        )

    async def _attach(self, msg: AttentionAttach) -> AttentionAttached:
        if self.draining:
            return AttentionAttached(False, error="attention worker is draining")
        loop = asyncio.get_running_loop()
        try:  # NOTE: allocating the pool takes seconds on a busy machine: off the loop
            shard = await asyncio.to_thread(AttentionShard, msg, self.config.kv_cache_bytes, loop)
        except KvstackError as e:
            return AttentionAttached(False, error=str(e))
        if self.decode_id and self.decode_id != msg.decode_id:
            log.warning(
                "decode worker %s takes this attention worker over from %s",
                msg.decode_id,
                self.decode_id,
            )
        self.slot.shard, self.decode_id = shard, msg.decode_id
        log.info(
            "shard %d/%d of %s: KV heads %s, %d blocks",
            msg.shard,
            msg.group_size,
            msg.decode_id,
            shard.kv_heads,
            shard.storage.num_blocks,
        )
        return AttentionAttached(
            True, shard.storage.num_blocks, self.link_addr, self.data_addr, instance=self.instance
        )

    async def _expect(self, msg: KVExpect) -> Ack:
        shard = self.slot.shard
        if shard is None:
            return Ack(msg.request_id, False, "attention worker is not attached", 503)
        if self.draining:
            return Ack(msg.request_id, False, "attention worker is draining", 503)
        try:
            shard.hold(msg.request_id, msg.block_ids)
        except ValueError as e:
            return Ack(msg.request_id, False, str(e), 400)
        shard.inbox.expect(msg.request_id, list(msg.block_ids), msg.num_layers, msg.ttl)
        return Ack(msg.request_id, True)

    async def _settle(self, msg: KVSettle) -> Ack:
        shard = self.slot.shard
        expected = shard.inbox.get(msg.request_id) if shard else None
        if shard is None or expected is None:
            return Ack(msg.request_id, False, "no KV expected for this request (expired?)", 503)
        problem = "" if not msg.ok else await self._verdict(expected, msg.num_frames)
        if msg.ok and not problem:
            shard.inbox.take(msg.request_id)
            return Ack(msg.request_id, True)
        await self._drop(shard, msg.request_id)
        return Ack(msg.request_id, not msg.ok, problem, 503 if problem else 200)

    async def _verdict(self, expected, num_frames: int) -> str:
        try:
            await asyncio.wait_for(expected.settled.wait(), self.config.request_timeout)
        except TimeoutError:
            return "the end of the transfer never arrived"
        return expected.verdict(num_frames)

    async def _drop(self, shard: AttentionShard, request_id: str) -> None:
        """Refuse further bytes of a transfer and forget the request once none is landing."""
        expected = shard.inbox.retire(request_id)
        if expected is not None:
            try:
                await asyncio.wait_for(expected.idle.wait(), self.config.request_timeout)
            except TimeoutError:
                log.error("request %s: a KV frame never finished landing", request_id)
        shard.release([request_id])

    async def _expire(self) -> None:
        shard = self.slot.shard
        if shard is None:
            return
        for request_id in shard.inbox.expired(time.time()):
            log.warning("request %s: KV never settled; dropping it", request_id)
            await self._drop(shard, request_id)

    async def _stats(self, _: StatsRequest) -> AttentionStats:
        shard = self.slot.shard
        if shard is None:
            return AttentionStats(self.worker_id, "", 0, 0, 0)
        return AttentionStats(
            self.worker_id,
            self.decode_id,
            len(shard.request_blocks),
            shard.used_blocks,
            shard.storage.num_blocks,
            shard.kv_heads,
            shard.num_calls,
            self.link.bytes_received,
            self.link.bytes_sent,
            self.receiver.bytes_received,
        )
