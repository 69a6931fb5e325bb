"""The attention workers a decode worker offloads attention to (Lamina): attaching them as
shards of whole KV heads, the KV hand-off from prefill (expect, settle), and each layer's
attention over the links, with the time it left the engine waiting."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import torch

from shared import subjects
from shared.attention_groups import kv_head_range
from shared.errors import KvstackError
from shared.messages import (
    Ack,
    AttentionAttach,
    AttentionAttached,
    Heartbeat,
    KVExpect,
    KVSettle,
    KVShard,
    StatsRequest,
)
from shared.model.config import ModelConfig
from shared.runtime.bus import Bus, ServiceUnavailable
from shared.transfer.attention.client import AttentionLink, AttentionLost

log = logging.getLogger("kvstack.decode")
# An attach allocates the worker's KV pool: seconds on a machine busy starting a dozen
# processes, so it gets far longer than a control round trip.
ATTACH_TIMEOUT = 120.0


class AttentionGroup:
    def __init__(
        self,
        bus: Bus,
        decode_id: str,
        worker_ids: Sequence[str],
        model: ModelConfig,
        dtype: str,
        block_size: int,
        auth_token: str | None,
        timeout: float,
    ) -> None:
        kv_head_range(model.num_kv_heads, len(worker_ids), 0)  # fail early with a clear error
        self.bus, self.decode_id, self.model = bus, decode_id, model
        self.configured_ids = tuple(worker_ids)
        self.worker_ids: tuple[str, ...] = ()
        self.dtype, self.block_size = dtype, block_size
        self.auth_token, self.timeout = auth_token, timeout
        self.links: list[AttentionLink] = []
        self.shards: tuple[KVShard, ...] = ()
        self.instances: dict[str, str] = {}  # worker id -> the process attached
        self.sent_at: dict[tuple[int, int], float] = {}
        self.blocked_seconds = self.roundtrip_seconds = 0.0

    # -- membership (event loop) -----------------------------------------------------------

    async def attach(self, worker_ids: Sequence[str] | None = None) -> int:
        """Make `worker_ids` (default: the configured ones) the group; returns the blocks
        every shard can hold. Raises KvstackError with the first worker's complaint."""
        ids = tuple(worker_ids or self.configured_ids)
        replies = await asyncio.gather(
            *(self._attach_one(w, i, len(ids)) for i, w in enumerate(ids))
        )
        await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: self.connect(
                ids, [r.link_addr for r in replies], [r.data_addr for r in replies]
            ),
        )
        self.instances = {w: r.instance for w, r in zip(ids, replies)}
        return min(r.num_blocks for r in replies)

    def lost_member(self, hb: Heartbeat) -> str:
        """Why this beat means a shard's KV is gone (it stopped, or another process now
        runs under its id and is not attached), or "" when it does not."""
        worker_id = hb.worker_id
        if worker_id not in self.worker_ids:
            return ""
        if hb.stopped:
            return f"attention worker {worker_id} stopped"
        attached = self.instances.get(worker_id, "")
        if attached and hb.instance and hb.instance != attached:
            return f"attention worker {worker_id} restarted"
        return ""

    def connect(
        self, worker_ids: Sequence[str], link_addrs: Sequence[str], data_addrs: Sequence[str]
    ) -> None:
        """Open the links to attached shards, in shard order (blocking)."""
        self.close()
        heads = self.model.num_heads // len(worker_ids)
        dtype = getattr(torch, self.dtype)
        self.links = [
            AttentionLink(addr, heads, self.model.head_dim, dtype, self.auth_token)
            for addr in link_addrs
        ]
        num_kv_heads = self.model.num_kv_heads
        self.shards = tuple(
            KVShard(addr, *kv_head_range(num_kv_heads, len(worker_ids), i))
            for i, addr in enumerate(data_addrs)
        )
        self.worker_ids = tuple(worker_ids)

    async def _attach_one(self, worker_id: str, shard: int, group_size: int) -> AttentionAttached:
        m = self.model
        msg = AttentionAttach(
            self.decode_id,
            group_size,
            shard,
            m.num_layers,
            m.num_heads,
            m.num_kv_heads,
            m.head_dim,
            self.block_size,
            self.dtype,
        )
        try:
            reply = await self.bus.request(
                subjects.attention_op(worker_id, "attach"),
                msg,
                max(self.timeout, ATTACH_TIMEOUT),
                expected=AttentionAttached,
            )
        except ServiceUnavailable as e:
            raise KvstackError(f"attention worker {worker_id}: {e}") from None
        if not reply.ok:
            raise KvstackError(f"attention worker {worker_id}: {reply.error}")
        return reply

    async def live_workers(self) -> list[str]:
        """The configured workers that answer now (a dead one has no responder)."""
        stats = await asyncio.gather(*(self._answers(w) for w in self.configured_ids))
        return [w for w, ok in zip(self.configured_ids, stats) if ok]

    async def wait_for_workers(self, timeout: float) -> None:
        """Until every configured worker answers (they may start after this decode worker)."""
        deadline = time.monotonic() + timeout
        while len(live := await self.live_workers()) < len(self.configured_ids):
            if time.monotonic() > deadline:
                missing = sorted(set(self.configured_ids) - set(live))
                raise KvstackError(
                    f"attention worker(s) {', '.join(missing)} did not answer within {timeout:g}s"
                )
            await asyncio.sleep(0.2)

    async def _answers(self, worker_id: str) -> bool:
        try:
            await self.bus.request(
                subjects.worker_stats("attention-worker", worker_id),
                StatsRequest(),
                min(self.timeout, 2.0),
            )
        except ServiceUnavailable:
            return False
        return True

    def close(self) -> None:
        for link in self.links:
            link.close()
        self.links = []

    # -- KV hand-off from prefill (event loop) ---------------------------------------------

    async def expect(
        self, request_id: str, block_ids: Sequence[int], num_layers: int, ttl: float
    ) -> str:
        msg = KVExpect(request_id, tuple(block_ids), num_layers, ttl)
        return await self._everyone("expect", msg)

    async def settle(self, request_id: str, ok: bool, num_frames: int = 0) -> str:
        return await self._everyone("settle", KVSettle(request_id, ok, num_frames))

    async def _everyone(self, op: str, msg) -> str:
        """Ask every shard; the first refusal, or "" when all agreed."""

        async def ask(worker_id: str) -> str:
            try:
                reply = await self.bus.request(
                    subjects.attention_op(worker_id, op), msg, self.timeout, expected=Ack
                )
            except ServiceUnavailable as e:
                return f"attention worker {worker_id}: {e}"
            return "" if reply.ok else f"attention worker {worker_id}: {reply.error}"

        problems = await asyncio.gather(*(ask(w) for w in self.worker_ids))
        return next((p for p in problems if p), "")

    # -- attention, layer by layer (engine thread) -----------------------------------------

    def begin_step(self, micro_batch: int, chunks: Sequence) -> None:
        for link in self._links():
            link.begin_step(micro_batch, chunks)

    def send(
        self, micro_batch: int, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        links = self._links()
        q_per, kv_per = q.shape[1] // len(links), k.shape[1] // len(links)
        for i, link in enumerate(links):
            qs, kvs = slice(i * q_per, (i + 1) * q_per), slice(i * kv_per, (i + 1) * kv_per)
            link.send_qkv(micro_batch, layer, q[:, qs], k[:, kvs], v[:, kvs])
        # The round trip starts once all is sent: sending is the engine's own work.
        self.sent_at[(micro_batch, layer)] = time.perf_counter()

    def wait(self, micro_batch: int, layer: int) -> torch.Tensor:
        """The attention output [T, H, D] of (micro-batch, layer), heads in order."""
        started = time.perf_counter()
        results = [link.result(micro_batch, layer) for link in self._links()]
        self.blocked_seconds += time.perf_counter() - started
        arrived = max(at for _, at in results)
        self.roundtrip_seconds += arrived - self.sent_at.pop((micro_batch, layer), arrived)
        outs = [out for out, _ in results]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    def release(self, request_ids: list[str]) -> None:
        for link in self.links:
            try:
                link.release(request_ids)
            except AttentionLost:
                pass  # its KV died with it

    def _links(self) -> list[AttentionLink]:
        if not self.links:
            raise AttentionLost("the attention group is not attached")
        return self.links

    # -- what the link carried -------------------------------------------------------------

    def counter(self, name: str) -> int:
        return sum(link.counters[name] for link in self.links)

    @property
    def hidden_share(self) -> float:
        """How much of the attention round trips the engine did not wait for (0..1)."""
        if self.roundtrip_seconds <= 0:
            return 0.0
        return max(0.0, 1.0 - self.blocked_seconds / self.roundtrip_seconds)
