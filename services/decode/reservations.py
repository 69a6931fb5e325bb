"""Blocks held for requests whose KV is on its way; the data plane's sink on a decode worker.

Data-plane callbacks arrive on receiver threads; everything else on the event loop.
One lock guards the table; waiting for a transfer's end is an asyncio event.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from shared.kvcache.storage import KVStorage
from shared.messages import KVReserve
from shared.transfer.base import BlockSpan, kv_span_bytes


@dataclass
class Reservation:
    request: KVReserve
    block_ids: frozenset[int]
    expires: float
    frames_ok: int = 0
    frames_bad: int = 0
    end_frames: int | None = None    # frames the sender says it sent, once its END arrived
    error: str = ""
    writing: bool = False            # a frame is landing in these blocks right now
    cancelled: bool = False          # no more bytes may land; blocks go back once idle
    settled: asyncio.Event = field(default_factory=asyncio.Event)   # END or connection lost
    idle: asyncio.Event = field(default_factory=asyncio.Event)      # safe to reuse the blocks

    def verdict(self, expected_frames: int) -> str:
        """Empty when every frame arrived intact; else why the KV must not be used."""
        if self.error:
            return self.error
        if self.frames_bad:
            return f"{self.frames_bad} KV frame(s) failed their checksum or size check"
        if self.end_frames != expected_frames or self.frames_ok != expected_frames:
            return (f"expected {expected_frames} KV frames, received {self.frames_ok} "
                    f"(sender reported {self.end_frames})")
        return ""


class Reservations:
    def __init__(self, storage: KVStorage, loop: asyncio.AbstractEventLoop) -> None:
        self.storage = storage
        self.loop = loop
        self._lock = threading.Lock()
        self._table: dict[str, Reservation] = {}

    def __len__(self) -> int:
        return len(self._table)

    def add(self, request: KVReserve, block_ids: list[int], ttl: float) -> None:
        with self._lock:
            self._table[request.request_id] = Reservation(
                request, frozenset(block_ids), time.time() + ttl)

    def get(self, request_id: str) -> Reservation | None:
        reservation = self._table.get(request_id)
        return None if reservation is None or reservation.cancelled else reservation

    def take(self, request_id: str) -> Reservation | None:
        """Remove a reservation whose transfer has ended (no frame can still arrive)."""
        with self._lock:
            return self._table.pop(request_id, None)

    def retire(self, request_id: str) -> Reservation | None:
        """Refuse further bytes; its `idle` event is set once no frame is landing."""
        with self._lock:
            reservation = self._table.get(request_id)
            if reservation is None or reservation.cancelled:
                return None
            reservation.cancelled = True
            if not reservation.writing:
                self._settle_retired(reservation)
            return reservation

    def expired(self, now: float) -> list[str]:
        with self._lock:
            return [rid for rid, r in self._table.items() if r.expires < now and not r.cancelled]

    def _settle_retired(self, reservation: Reservation) -> None:
        self._table.pop(reservation.request.request_id, None)
        self.loop.call_soon_threadsafe(reservation.idle.set)

    # -- KVSink (receiver threads) ---------------------------------------------------------

    def destination(self, request_id: str, layer: int, span: BlockSpan,
                    nbytes: int) -> tuple[memoryview, memoryview] | None:
        if span.offset + span.num_tokens > self.storage.block_size:
            return None
        with self._lock:
            reservation = self._table.get(request_id)
            if reservation is None or reservation.cancelled:
                return None
            if span.block_id not in reservation.block_ids:
                return None
            reservation.writing = True
        return kv_span_bytes(self.storage.kv, layer, span)

    def on_frame(self, request_id: str, layer: int, spans: tuple[BlockSpan, ...], ok: bool,
                 error: str) -> None:
        with self._lock:
            reservation = self._table.get(request_id)
            if reservation is None:
                return
            reservation.writing = False
            if reservation.cancelled:
                return self._settle_retired(reservation)
            if ok:
                reservation.frames_ok += 1
            else:
                reservation.frames_bad += 1

    def on_end(self, request_id: str, num_frames: int) -> None:
        with self._lock:
            reservation = self._table.get(request_id)
            if reservation is not None:
                reservation.end_frames = num_frames
                self.loop.call_soon_threadsafe(reservation.settled.set)

    def on_lost(self, request_ids: list[str], error: str) -> None:
        with self._lock:
            for rid in request_ids:
                reservation = self._table.get(rid)
                if reservation is None:
                    continue
                reservation.writing = False
                reservation.error = f"KV connection lost: {error}"
                self.loop.call_soon_threadsafe(reservation.settled.set)
                if reservation.cancelled:
                    self._settle_retired(reservation)
