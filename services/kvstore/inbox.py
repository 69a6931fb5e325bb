"""Blocks being put into the kvstore: the data plane's sink on a kvstore instance.

A put reserves one store buffer per block (a *slot*); frames land layer by layer; at
the sender's END each block whose every layer arrived intact is committed, the rest
abandoned. Nothing half-written ever becomes visible, and a put that expires while a frame
is landing in its blocks gives them back only once that frame is over: a block's memory
may be a slot of the shared arena, soon another block's.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from services.kvstore.dram import UNKNOWN_CHECKSUM
from services.kvstore.runs import halves
from services.kvstore.store import BlockRef, BlockStore
from shared.transfer.base import BlockSpan

Pieces = tuple[memoryview, ...]


@dataclass
class _Put:
    refs: list[BlockRef | None]  # by slot; None: the sender was told to skip it
    expires: float
    layers_ok: list[set[int]] = field(default_factory=list)
    bad: set[int] = field(default_factory=set)  # slots with a refused or damaged frame
    writing: bool = False  # a frame is landing in its blocks (between destinations and on_frames)
    checksums: dict[int, int] = field(default_factory=dict)  # by slot: of blocks placed whole

    def slots(self, span: BlockSpan) -> range:
        """The slots a span covers: one, or a run of consecutive ones."""
        block_size = next((r.layout.block_size for r in self.refs if r is not None), 1)
        first = max(0, span.block_id)
        return range(first, min(len(self.refs), first + max(1, span.num_tokens // block_size)))

    def run(self, span: BlockSpan) -> list[BlockRef] | None:
        """The blocks a span covers, if it is whole blocks and every one is open."""
        refs = [self.refs[s] for s in self.slots(span)]
        open_refs = [r for r in refs if r is not None]
        if not open_refs or len(open_refs) != len(refs):
            return None
        whole = span.num_tokens == len(open_refs) * open_refs[0].layout.block_size
        return open_refs if span.offset == 0 and whole else None


class PutInbox:
    def __init__(self, store: BlockStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._puts: dict[str, _Put] = {}
        self._closing: dict[str, _Put] = {}  # dropped while a frame was landing in them
        self.num_committed = 0
        self.num_abandoned = 0

    def __len__(self) -> int:
        """Puts still open (bytes on their way)."""
        with self._lock:
            return len(self._puts)

    def open(self, transfer_id: str, refs: list[BlockRef | None], ttl: float) -> None:
        with self._lock:
            self._puts[transfer_id] = _Put(refs, time.time() + ttl, [set() for _ in refs])

    def expire(self, now: float) -> int:
        with self._lock:
            stale = [t for t, p in self._puts.items() if p.expires < now]
        return sum(self._close(t, committed=False) for t in stale)

    # -- KVSink (receiver threads) ---------------------------------------------------------

    def destination(
        self, request_id: str, layer: int, span: BlockSpan, nbytes: int
    ) -> tuple[Pieces, Pieces] | None:
        """The blocks' own buffers: a run's bytes are scattered into them as they land."""
        found = self.destinations(request_id, range(layer, layer + 1), span, nbytes)
        return None if found is None else found[0]

    def destinations(
        self, request_id: str, layers: range, span: BlockSpan, nbytes: int
    ) -> list[tuple[Pieces, Pieces]] | None:
        """`destination` in each of `layers` (one check for all of them)."""
        with self._lock:
            put = self._puts.get(request_id)
            if put is None:
                return None
            refs = put.run(span)
            put.writing = put.writing or refs is not None
        if refs is None or nbytes != len(refs) * refs[0].layout.half_bytes:
            return None
        if not (layers and layers.start >= 0 and layers.stop <= refs[0].layout.num_layers):
            return None
        return [(halves(refs, layer, 0), halves(refs, layer, 1)) for layer in layers]

    def block_buffer(
        self, request_id: str, slot: int, nbytes: int, checksum: int
    ) -> memoryview | None:
        """A slot's whole block, where a put's block placed whole lands (`tcp.placed`);
        `checksum` is what it hashes to when it lands intact, kept for its commit."""
        with self._lock:
            put = self._puts.get(request_id)
            ref = put.refs[slot] if put is not None and 0 <= slot < len(put.refs) else None
            if put is None or ref is None or ref.layout.block_bytes != nbytes:
                return None
            put.writing = True
            put.checksums[slot] = checksum
        return ref.data()

    def on_frame(
        self, request_id: str, layer: int, spans: tuple[BlockSpan, ...], ok: bool, error: str
    ) -> None:
        self.on_frames(request_id, range(layer, layer + 1), spans, ok, error)

    def on_frames(
        self, request_id: str, layers: range, spans: tuple[BlockSpan, ...], ok: bool, error: str
    ) -> None:
        """`on_frame` of each of `layers` (a frame of many layers, reported at once)."""
        with self._lock:
            closing = self._closing.pop(request_id, None)
            put = self._puts.get(request_id)
            if put is not None:
                put.writing = False
                for span in spans:
                    for slot in put.slots(span):
                        (put.layers_ok[slot].update(layers) if ok else put.bad.add(slot))
        if closing is not None:  # expired while this frame landed: given back now
            self._abandon(closing)

    def on_end(self, request_id: str, num_frames: int) -> None:
        self._close(request_id, committed=True)

    def on_lost(self, request_ids: list[str], error: str) -> None:
        """Its connection is gone, so nothing lands any more: every block goes back."""
        for transfer_id in request_ids:
            with self._lock:
                put = self._closing.pop(transfer_id, None) or self._puts.pop(transfer_id, None)
            if put is not None:
                self._abandon(put)

    def _close(self, transfer_id: str, committed: bool) -> int:
        with self._lock:
            put = self._puts.pop(transfer_id, None)
            if put is None:
                return 0
            if not committed and put.writing:  # NOTE: given back once the frame is over
                self._closing[transfer_id] = put
                return 1
        if not committed:
            self._abandon(put)
            return 1
        for slot, ref in enumerate(put.refs):
            if ref is None:
                continue
            whole = len(put.layers_ok[slot]) == ref.layout.num_layers and slot not in put.bad
            if whole:
                self.store.commit(ref, put.checksums.get(slot, UNKNOWN_CHECKSUM))
                self.num_committed += 1
            else:
                self.store.abandon(ref)
                self.num_abandoned += 1
        return 1

    def _abandon(self, put: _Put) -> None:
        for ref in put.refs:
            if ref is not None:
                self.store.abandon(ref)
                self.num_abandoned += 1
