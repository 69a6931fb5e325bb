"""The kvstore pool (`--kv-pool kvstore`, shared/kvpool/pool.py): who owns a block, is it
there, get it, put it.

Membership comes from kvstore heartbeats; a block's owner is its place on the hash ring
of live instances. A kvstore that does not answer is a cache miss, never an error.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shared import subjects
from shared.codec import MessageError, decode, encode
from shared.engine.loop import EngineLoop
from shared.kvblocks import BlockLayout
from shared.kvcache.storage import KVStorage
from shared.kvpool.block_fetch import AskingFetcher, BlockFetcher, answer_within, settle
from shared.kvpool.hash_ring import HashRing
from shared.kvpool.pool import Done, KVPool
from shared.messages import BlockLookup, BlockPresence, BlockPut, Heartbeat, PutSlots
from shared.runtime.bus import Bus, ServiceUnavailable
from shared.transfer.base import BlockSpan, KVSender, SpanBytes, coalesce, layer_groups
from shared.transfer.common.frames import Frame, checked_frame
from shared.transfer.inbox import Expected, KVInbox
from shared.transfer.tcp.asker import Asker
from shared.transfer.tcp.placed_puts import BlocksOut

log = logging.getLogger("kvstack.kvstore_client")
MISSED_BEATS = 3
LOOKUP_TIMEOUT = 1.0


@dataclass
class _Member:
    data_addr: str
    seen: float
    interval: float


class KvstorePool:
    def __init__(
        self,
        bus: Bus,
        sender: KVSender,
        storage: KVStorage,
        inbox: KVInbox,
        data_addr: str,
        timeout: float = 10.0,
        asker: Asker | None = None,
    ) -> None:
        """With an `asker`, gets go out on the kvstores' data connections (`tcp.asking`),
        else over the bus with the blocks sent to `data_addr`."""
        self.bus, self.sender, self.storage, self.inbox = bus, sender, storage, inbox
        self.layout = BlockLayout.of(storage)
        self.timeout = timeout
        self.asker = asker
        self.fetcher: AskingFetcher | BlockFetcher = (
            AskingFetcher(asker, inbox, self.layout, timeout)
            if asker is not None
            else BlockFetcher(bus, inbox, self.layout, data_addr, timeout)
        )
        self._members: dict[str, _Member] = {}
        self._ring = HashRing()

    # -- membership --------------------------------------------------------------------

    def observe(self, hb: Heartbeat) -> None:
        if hb.service != "kvstore":
            return
        if hb.stopped:
            self._members.pop(hb.worker_id, None)
        elif hb.data_addr and not hb.draining:
            self._members[hb.worker_id] = _Member(hb.data_addr, time.monotonic(), hb.interval)

    def ring(self) -> HashRing:
        now = time.monotonic()
        live = {w for w, m in self._members.items() if now - m.seen <= MISSED_BEATS * m.interval}
        if set(self._ring.members) != live:
            self._ring = HashRing(live)
        return self._ring

    def num_members(self) -> int:
        return len(self.ring().members)

    async def report(self) -> None:
        """Nothing to say: each kvstore instance beats and publishes its own KV events."""

    async def close(self) -> None:
        """The asker's connections; the rest goes over the worker's bus and sender."""
        if self.asker is not None:
            self.asker.close()

    # -- lookup ------------------------------------------------------------------------

    async def longest_prefix(self, block_hashes: Sequence[int]) -> int:
        """How many leading blocks of `block_hashes` the pool holds."""
        groups = self.ring().group(block_hashes)
        answers = await asyncio.gather(*(self._lookup(w, hs) for w, hs in groups.items()))
        present = {h for hs, flags in zip(groups.values(), answers) for h, f in zip(hs, flags) if f}
        return next((i for i, h in enumerate(block_hashes) if h not in present), len(block_hashes))

    async def _lookup(self, worker_id: str, block_hashes: list[int]) -> tuple[bool, ...]:
        try:
            reply = await self.bus.request(
                subjects.kvstore_op(worker_id, "lookup"),
                BlockLookup(tuple(block_hashes)),
                LOOKUP_TIMEOUT,
                expected=BlockPresence,
            )
            return reply.present
        except (ServiceUnavailable, MessageError):
            return (False,) * len(block_hashes)

    # -- get: blocks into my storage, layer by layer -----------------------------------

    async def get(
        self, transfer_id: str, block_hashes: Sequence[int], dest_block_ids: Sequence[int]
    ) -> list[Expected] | None:
        """Start fetching from each owner; the expectations gate each layer. None: a miss."""
        groups = self.ring().group(block_hashes)
        dest = dict(zip(block_hashes, dest_block_ids))
        fetch = self.fetcher.fetch
        started = await asyncio.gather(
            *(
                fetch(self._source(worker), f"{transfer_id}:{i}", hashes, [dest[h] for h in hashes])
                for i, (worker, hashes) in enumerate(groups.items())
            )
        )
        if None in started or sum(map(len, groups.values())) != len(block_hashes):
            await asyncio.gather(*(self.fetcher.cancel(e) for e in started if e is not None))
            return None
        return [e for e in started if e is not None]

    async def cancel(self, expected: Expected) -> None:
        await self.fetcher.cancel(expected)

    def _source(self, worker_id: str) -> str:
        """Where a get goes: the kvstore's data address (asked there), or its bus subject."""
        if self.asker is not None:
            return self._members[worker_id].data_addr
        return subjects.kvstore_op(worker_id, "get")

    # -- put: my blocks out to their owners ----------------------------------------------

    async def put(
        self, transfer_id: str, block_hashes: Sequence[int], block_ids: Sequence[int], on_sent: Done
    ) -> int:
        """Offer blocks to their owners and send those they lack; `on_sent` runs (from a
        sender thread) once every byte is out, so the caller may then free the blocks.
        Returns how many blocks are being sent."""
        groups = self.ring().group(block_hashes)
        src = dict(zip(block_hashes, block_ids))
        if self.asker is not None:
            done = _Countdown(len(groups), on_sent)
            counts = await asyncio.gather(
                *(
                    self._put_asking(w, f"{transfer_id}:{i}", hs, src, done.tick)
                    for i, (w, hs) in enumerate(groups.items())
                )
            )
            return sum(counts)
        plans = await asyncio.gather(
            *(self._slots(w, f"{transfer_id}:{i}", hs) for i, (w, hs) in enumerate(groups.items()))
        )
        sends = [
            (reply, [(h, src[h], slot) for h, slot in zip(hs, reply.slots) if slot >= 0])
            for hs, reply in zip(groups.values(), plans)
            if reply is not None
        ]
        sends = [(reply, blocks) for reply, blocks in sends if blocks]
        done = _Countdown(len(sends), on_sent)
        for reply, blocks in sends:
            self._send_blocks(reply.data_addr, reply.request_id, blocks, done.tick)
        return sum(len(blocks) for _, blocks in sends)

    async def _put_asking(
        self,
        worker_id: str,
        transfer_id: str,
        block_hashes: list[int],
        src: dict[int, int],
        finished: Callable[[], None],
    ) -> int:
        """Ask the owner for slots on its data connection and send the blocks it lacks on
        the same connection, from the asker's thread; `finished` runs when that is over
        (whatever happened). Returns how many blocks are being sent."""
        loop = asyncio.get_running_loop()
        sending: asyncio.Future[int] = loop.create_future()

        def answered(reply: bytes | None) -> BlocksOut | None:  # the asker's thread
            blocks = _slotted(reply, block_hashes, src)
            loop.call_soon_threadsafe(settle, sending, len(blocks or ()))
            if blocks is None:
                return None
            return blocks_out(self.storage, transfer_id, [(s, i, h) for h, i, s in blocks])

        message = self._put_message(transfer_id, block_hashes)
        data_addr = self._members[worker_id].data_addr
        asked = self.asker.submit(data_addr, transfer_id, encode(message), answered)  # type: ignore[union-attr]
        asked.add_done_callback(lambda _: finished())
        return await answer_within(sending, self.timeout) or 0

    def _put_message(self, transfer_id: str, block_hashes: list[int]) -> BlockPut:
        return BlockPut(transfer_id, tuple(block_hashes), self.layout, time.time() + self.timeout)

    async def _slots(
        self, worker_id: str, transfer_id: str, block_hashes: list[int]
    ) -> PutSlots | None:
        message = self._put_message(transfer_id, block_hashes)
        try:
            reply = await self.bus.request(
                subjects.kvstore_op(worker_id, "put"), message, self.timeout, expected=PutSlots
            )
        except (ServiceUnavailable, MessageError):
            return None
        return reply if reply.ok and len(reply.slots) == len(block_hashes) else None

    def _send_blocks(
        self,
        peer: str,
        transfer_id: str,
        blocks: list[tuple[int, int, int]],
        on_done: Callable[[], None],
    ) -> None:
        send_blocks(
            self.sender,
            self.storage,
            peer,
            transfer_id,
            [(slot, src, h) for h, src, slot in blocks],
            lambda *_: on_done(),
        )


def send_blocks(
    sender: KVSender,
    storage: KVStorage,
    peer: str,
    transfer_id: str,
    blocks: Sequence[tuple[int, int, int]],
    on_done,
    runs: bool = True,
) -> None:
    """Whole blocks of `storage` through `sender` (`block_spans`), then their END."""
    for layers, spans in block_spans(storage, blocks, runs):
        sender.send(peer, transfer_id, layers.start, spans, len(layers))
    sender.finish(peer, transfer_id, on_done)


def block_frames(
    storage: KVStorage, transfer_id: str, blocks: Sequence[tuple[int, int, int]]
) -> list[Frame]:
    """The frames of `block_spans`, checked, for a connection written without a sender."""
    return [
        checked_frame(transfer_id, layers.start, spans, layers=len(layers))
        for layers, spans in block_spans(storage, blocks)
    ]


def blocks_out(
    storage: KVStorage, transfer_id: str, blocks: Sequence[tuple[int, int, int]]
) -> BlocksOut:
    """A put's blocks (dest id, source id, hash) as an asker sends them: as frames, or
    whole through its ring (`tcp.placed_puts`), made only when they go."""
    layout = BlockLayout.of(storage)
    return BlocksOut(
        lambda: block_frames(storage, transfer_id, blocks),
        lambda: whole_runs(storage, blocks),
        layout.num_layers,
        layout.block_bytes,
        layout.block_size,
    )


def whole_runs(
    storage: KVStorage, blocks: Sequence[tuple[int, int, int]]
) -> list[tuple[int, np.ndarray]]:
    """Runs of blocks consecutive on both sides, as (first dest id, the run's bytes as
    [layer, K or V, block, byte] in `storage`'s host bytes): what a put through a ring
    copies whole (blocks are (dest id, source id, hash))."""
    block_size = storage.block_size
    pieces = coalesce([(dest, src, 0, block_size) for dest, src, _ in blocks], block_size)
    runs = []
    for dest, src, _, num_tokens in pieces:
        for layer in range(storage.kv.shape[0]):
            storage.to_host(layer, src, 0, num_tokens)  # from a GPU, where the KV is there
        runs.append((dest, storage.blocks_array(src, num_tokens // block_size)))
    return runs


def block_spans(
    storage: KVStorage, blocks: Sequence[tuple[int, int, int]], runs: bool = True
) -> list[tuple[range, list[SpanBytes]]]:
    """Whole blocks of `storage`, a few layers a frame (`layer_groups`): each frame's
    layers and spans; blocks are (dest id, source id, hash).

    With `runs`, consecutive blocks on both sides travel as one span (a worker's KVInbox
    and a kvstore's put slots both take such spans)."""
    block_size = storage.block_size
    pieces = [(dest, src, 0, block_size) for dest, src, _ in blocks]
    pieces = coalesce(pieces, block_size) if runs else pieces
    hashes = {dest: block_hash for dest, _, block_hash in blocks}
    layout = BlockLayout.of(storage)
    frames = []
    for layers in layer_groups(layout.num_layers, 2 * layout.half_bytes * len(blocks)):
        spans: list[SpanBytes] = []
        for dest, src, _, n in pieces:
            halves = [_host_span(storage, layer, src, n) for layer in layers]
            span = BlockSpan(dest, 0, n, hashes[dest] if n == block_size else 0)
            spans.append((span, tuple(k for k, _ in halves), tuple(v for _, v in halves)))
        frames.append((layers, spans))
    return frames


def _host_span(storage: KVStorage, layer: int, block_id: int, num_tokens: int):
    storage.to_host(layer, block_id, 0, num_tokens)  # from a GPU, where the KV is there
    return storage.span_bytes(layer, block_id, 0, num_tokens)


def _slotted(
    reply: bytes | None, block_hashes: list[int], src: dict[int, int]
) -> list[tuple[int, int, int]] | None:
    """(hash, source block, slot) of each block a put's reply wants sent; None when the
    reply is no put's slots (nothing is sent, not even an END)."""
    try:
        slots = decode(reply, expected=PutSlots) if reply is not None else None
    except MessageError:
        return None
    if slots is None or not slots.ok or len(slots.slots) != len(block_hashes):
        return None
    return [(h, src[h], slot) for h, slot in zip(block_hashes, slots.slots) if slot >= 0]


class _Countdown:
    """Calls `done` once `count` ticks happened (at once when count is 0); ticks come from
    the sender threads of different peers."""

    def __init__(self, count: int, done: Callable[[], None]) -> None:
        self.count, self.done = count, done
        self.lock = threading.Lock()
        if count == 0:
            done()

    def tick(self) -> None:
        with self.lock:
            self.count -= 1
            finished = self.count == 0
        if finished:
            self.done()


async def write_back(
    pool: KVPool, engine_loop: EngineLoop, request_id: str, transfer_id: str
) -> None:
    """Offer a finished, held request's full blocks to the pool (it keeps what it lacks),
    then free them in the engine once every byte is out."""
    blocks = await engine_loop.call(lambda e: e.held_blocks(request_id))
    loop = asyncio.get_running_loop()

    def release() -> None:  # from any thread (the sender's, once the bytes are out)
        loop.call_soon_threadsafe(lambda: engine_loop.call(lambda e: e.release(request_id)))

    if not blocks or not pool.num_members():
        release()
        return
    ids, hashes = zip(*blocks)
    await pool.put(transfer_id, hashes, ids, release)
