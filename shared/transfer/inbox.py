"""Blocks a worker expects from the data plane, and the data plane's sink that fills them.

An *expectation* names a transfer (its data-plane request id), the local blocks it may
write and how many layers it carries. Frames land from receiver threads; a layer of an
expectation is *done* once every frame of that layer arrived intact. Waiting for a
layer (a prefill's engine thread, so it computes layer l while l + 1 still arrives) is a
threading event; waiting for the end of a transfer (on the event loop) is an asyncio one.
One lock guards the table.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from shared.kvcache.storage import KVStorage
    from shared.transfer.base import BlockSpan


@dataclass
class Expected:
    transfer_id: str
    block_ids: frozenset[int]
    num_layers: int
    expires: float
    payload: Any = None  # what the owner wants back (e.g. the KVReserve)
    frames_ok: int = 0
    frames_bad: int = 0
    end_frames: int | None = None  # frames the sender says it sent, once its END arrived
    error: str = ""
    writing: bool = False  # a frame is landing in these blocks right now
    cancelled: bool = False  # no more bytes may land; blocks go back once idle
    layers_done: set[int] = field(default_factory=set)
    closed: bool = False  # no more layers will land (ended, lost, refused or cancelled)
    landed_at: float = 0.0  # time.monotonic() of its latest frame that landed intact
    # NOTE: one condition for every layer, not an event each: a get of 30 layers made 30
    # locks before its request went out.
    landed: threading.Condition = field(default_factory=threading.Condition)
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # END or lost
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # safe to reuse blocks

    def verdict(self, expected_frames: int | None = None) -> str:
        """Empty when every frame arrived intact; else why the KV must not be used."""
        if self.error:
            return self.error
        if self.frames_bad:
            return f"{self.frames_bad} KV frame(s) failed their checksum or size check"
        want = self.end_frames if expected_frames is None else expected_frames
        if self.end_frames is None or self.end_frames != want or self.frames_ok != want:
            return (
                f"expected {want} KV frames, received {self.frames_ok} "
                f"(sender reported {self.end_frames})"
            )
        return ""


class KVInbox:
    def __init__(self, storage: KVStorage, loop: asyncio.AbstractEventLoop) -> None:
        self.storage = storage
        self.loop = loop
        self._lock = threading.Lock()
        self._table: dict[str, Expected] = {}

    def __len__(self) -> int:
        return sum(1 for e in self._table.values() if not e.cancelled)

    def expect(
        self,
        transfer_id: str,
        block_ids: list[int],
        num_layers: int,
        ttl: float,
        payload: Any = None,
    ) -> Expected:
        expected = Expected(
            transfer_id,
            frozenset(block_ids),
            num_layers,
            time.time() + ttl,
            payload,
        )
        with self._lock:
            self._table[transfer_id] = expected
        return expected

    def get(self, transfer_id: str) -> Expected | None:
        expected = self._table.get(transfer_id)
        return None if expected is None or expected.cancelled else expected

    def take(self, transfer_id: str) -> Expected | None:
        """Remove an expectation whose transfer has ended (no frame can still arrive)."""
        with self._lock:
            return self._table.pop(transfer_id, None)

    def retire(self, transfer_id: str) -> Expected | None:
        """Refuse further bytes; its `idle` event is set once no frame is landing."""
        with self._lock:
            expected = self._table.get(transfer_id)
            if expected is None or expected.cancelled:
                return None
            expected.cancelled = True
            self._fail_layers(expected, expected.error or "cancelled")
            if not expected.writing:
                self._settle_retired(expected)
            return expected

    def expired(self, now: float) -> list[str]:
        with self._lock:
            return [t for t, e in self._table.items() if e.expires < now and not e.cancelled]

    def wait_layer(self, expected: Expected, layer: int, timeout: float) -> bool:
        """Block (a worker thread) until `layer` landed intact; False on failure or timeout."""
        with expected.landed:
            expected.landed.wait_for(
                lambda: layer in expected.layers_done or expected.closed, timeout
            )
        return layer in expected.layers_done

    # -- KVSink (receiver threads) ---------------------------------------------------------

    def destination(
        self, request_id: str, layer: int, span: BlockSpan, nbytes: int
    ) -> tuple[memoryview, memoryview] | None:
        found = self.destinations(request_id, range(layer, layer + 1), span, nbytes)
        return None if found is None else found[0]

    def destinations(
        self, request_id: str, layers: range, span: BlockSpan, nbytes: int
    ) -> list[tuple[memoryview, memoryview]] | None:
        """Where a span lands in each of `layers` (one check for all of them)."""
        covered = span.block_ids(self.storage.block_size)
        if len(covered) > 1 and span.offset:
            return None  # a run of blocks starts at a block's first slot
        if not self._claim(request_id, covered):
            return None
        return self.storage.spans_of_layers(layers, span.block_id, span.offset, span.num_tokens)

    def span_array(self, request_id: str, span: BlockSpan) -> np.ndarray | None:
        """Where a span of whole blocks lands in every layer, as one array (`tcp.placed`)."""
        covered = span.block_ids(self.storage.block_size)
        if span.offset or span.num_tokens != len(covered) * self.storage.block_size:
            return None
        if not self._claim(request_id, covered):
            return None
        return self.storage.blocks_array(span.block_id, len(covered))

    def _claim(self, request_id: str, blocks: range) -> bool:
        """Whether a frame of the request may land in `blocks` now (then it is landing)."""
        with self._lock:
            expected = self._table.get(request_id)
            if expected is None or expected.cancelled:
                return False
            if not all(block in expected.block_ids for block in blocks):
                return False
            expected.writing = True
        return True

    def on_frame(
        self, request_id: str, layer: int, spans: tuple[BlockSpan, ...], ok: bool, error: str
    ) -> None:
        self.on_frames(request_id, range(layer, layer + 1), spans, ok, error)

    def on_frames(
        self, request_id: str, layers: range, spans: tuple[BlockSpan, ...], ok: bool, error: str
    ) -> None:
        """`on_frame` of each of `layers` (a frame of many layers, reported at once)."""
        if ok and self.storage.mirrored:  # onto the GPU before the layer counts as landed
            for layer in layers:
                for span in spans:
                    self.storage.to_device(layer, span.block_id, span.offset, span.num_tokens)
        with self._lock:
            expected = self._table.get(request_id)
            if expected is None:
                return
            expected.writing = False
            if expected.cancelled:
                return self._settle_retired(expected)
            self._count_frames(expected, layers, ok, error)

    def on_end(self, request_id: str, num_frames: int) -> None:
        with self._lock:
            expected = self._table.get(request_id)
            if expected is not None:
                expected.end_frames = num_frames
                self._fail_layers(expected, "the transfer ended without this layer")
                self.loop.call_soon_threadsafe(expected.settled.set)

    def on_lost(self, request_ids: list[str], error: str) -> None:
        with self._lock:
            for transfer_id in request_ids:
                expected = self._table.get(transfer_id)
                if expected is None:
                    continue
                expected.writing = False
                expected.error = f"KV connection lost: {error}"
                self._fail_layers(expected, expected.error)
                self.loop.call_soon_threadsafe(expected.settled.set)
                if expected.cancelled:
                    self._settle_retired(expected)

    def _count_frames(self, expected: Expected, layers: range, ok: bool, error: str) -> None:
        """A frame of each of `layers` landed (one wake-up of the layers' waiters)."""
        if not ok:
            expected.frames_bad += len(layers)
            expected.error = expected.error or f"KV frame refused: {error}"
            return self._fail_layers(expected, expected.error)
        expected.frames_ok += len(layers)
        expected.landed_at = time.monotonic()
        done = range(max(layers.start, 0), min(layers.stop, expected.num_layers))
        if done and not expected.frames_bad:
            with expected.landed:
                expected.layers_done.update(done)
                expected.landed.notify_all()

    @staticmethod
    def _fail_layers(expected: Expected, error: str) -> None:
        """Wake every waiter still waiting: the layers it waits for will not come."""
        with expected.landed:
            expected.closed = True
            expected.landed.notify_all()

    def _settle_retired(self, expected: Expected) -> None:
        self._table.pop(expected.transfer_id, None)
        self.loop.call_soon_threadsafe(expected.idle.set)
