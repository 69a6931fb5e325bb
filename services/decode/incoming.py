"""Requests whose KV is on its way from a prefill worker, held until they are committed.

Two homes for that KV with one interface: `LocalKV`, this worker's own blocks (filled over
the data plane), and `OffloadedKV`, the attention group's shards (each filled with its own
KV heads, into the same block ids). The decode service sees only this interface.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from services.decode.attention_group import AttentionGroup
from shared.transfer.inbox import KVInbox

log = logging.getLogger("kvstack.decode")


class LocalKV:
    def __init__(self, inbox: KVInbox, num_layers: int, timeout: float) -> None:
        self.inbox, self.num_layers, self.timeout = inbox, num_layers, timeout

    def __len__(self) -> int:
        return len(self.inbox)

    async def expect(self, request_id: str, block_ids: list[int], ttl: float, payload: Any) -> str:
        self.inbox.expect(request_id, block_ids, self.num_layers, ttl, payload=payload)
        return ""

    def payload(self, request_id: str) -> Any:
        expected = self.inbox.get(request_id)
        return None if expected is None else expected.payload

    async def verdict(self, request_id: str, num_frames: int) -> str:
        expected = self.inbox.get(request_id)
        if expected is None:
            return "no reservation for this request (expired?)"
        try:
            await asyncio.wait_for(expected.settled.wait(), self.timeout)
        except TimeoutError:
            return "the end of the transfer never arrived"
        return expected.verdict(num_frames)

    def take(self, request_id: str) -> None:
        self.inbox.take(request_id)

    async def retire(self, request_id: str) -> bool:
        """Refuse further bytes; True once its blocks may be reused (False: never was held,
        or a frame never finished landing and its blocks must leak)."""
        expected = self.inbox.retire(request_id)
        if expected is None:
            return False
        try:
            await asyncio.wait_for(expected.idle.wait(), self.timeout)
        except TimeoutError:
            log.error(
                "request %s: a KV frame never finished landing; leaking its blocks", request_id
            )
            return False
        return True

    def expired(self, now: float) -> list[str]:
        return self.inbox.expired(now)


@dataclass
class _Held:
    payload: Any
    expires: float


class OffloadedKV:
    def __init__(self, group: AttentionGroup, num_layers: int) -> None:
        self.group, self.num_layers = group, num_layers
        self._held: dict[str, _Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    async def expect(self, request_id: str, block_ids: list[int], ttl: float, payload: Any) -> str:
        self._held[request_id] = _Held(payload, time.time() + ttl)
        problem = await self.group.expect(request_id, block_ids, self.num_layers, ttl)
        if problem:
            await self.retire(request_id)
        return problem

    def payload(self, request_id: str) -> Any:
        held = self._held.get(request_id)
        return None if held is None else held.payload

    async def verdict(self, request_id: str, num_frames: int) -> str:
        return await self.group.settle(request_id, True, num_frames)

    def take(self, request_id: str) -> None:
        self._held.pop(request_id, None)

    async def retire(self, request_id: str) -> bool:
        if self._held.pop(request_id, None) is None:
            return False
        await self.group.settle(request_id, False)  # each shard drops what landed
        return True

    def expired(self, now: float) -> list[str]:
        return [rid for rid, held in self._held.items() if held.expires < now]

    def forget_all(self) -> list[str]:
        """The group was rebuilt: these reservations' KV went to shards that are gone."""
        ids = list(self._held)
        self._held.clear()
        return ids
