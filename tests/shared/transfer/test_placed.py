"""Gets answered where the blocks lie (tcp.placed): on one host an asker maps the
answering side's arena and copies the blocks out itself, byte for byte, into a sink that
names a span of blocks as one array or layer by layer; a block damaged in the arena, or one
placed outside it, is never used; an arena the asker cannot see (another host, a foreign
cookie) leaves the answer to its frames; the blocks stay pinned until the asker is done;
the mapping is shared by an asker's connections and goes with the last of them. Puts go
the other way, whole blocks through the asker's own ring, in parts, each block checked
where it landed: a bad one is never kept; without a ring, as frames."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import threading

import numpy as np
import pytest
import torch
import xxhash

from services.kvstore.arena import BlockArena
from services.kvstore.inbox import PutInbox
from services.kvstore.store import BlockStore
from shared.kvblocks import BlockLayout
from shared.kvcache.storage import KVStorage
from shared.kvpool.kvstore_client import blocks_out
from shared.transfer.base import BlockSpan
from shared.transfer.common.frames import checked_frame
from shared.transfer.tcp import TcpKVReceiver, placed_puts, ring
from shared.transfer.tcp.arena_view import ArenaView
from shared.transfer.tcp.asker import Asker
from shared.transfer.tcp.asking import Answer
from shared.transfer.tcp.placed import ArenaOffer, encode_placed
from tests.shared.transfer.sinks import RecordingSink, random_storage
from tests.shared.transfer.transports import stalled_asker

DEST_BLOCKS = (4, 5)  # where the asker wants the two blocks: one run of consecutive ids
APART = (6, 2)  # two runs of one block (the RecordingSink names one block a span)
pytestmark = pytest.mark.skipif(
    not hasattr(__import__("os"), "memfd_create"), reason="no memfd here"
)


def new_storage() -> KVStorage:
    return KVStorage(3, 8, 4, 2, 8)  # float32: 256 bytes a layer's K, 1,536 a block


class PlacingServer:
    """Holds two random blocks in a real arena and answers `give <id>` with them placed
    there (its frames carry the same bytes, for an asker that cannot map the arena)."""

    def __init__(self, layout: BlockLayout, dest_blocks: tuple[int, ...] = DEST_BLOCKS) -> None:
        self.layout = layout
        self.dest_blocks = dest_blocks
        self.blocks = BlockArena(8 * layout.block_bytes)
        rng = np.random.default_rng(7)
        self.slots: list[tuple[int, np.ndarray]] = []
        for _ in dest_blocks:
            found = self.blocks.allocate(layout.block_bytes)
            assert found is not None
            found[1][:] = rng.integers(0, 256, layout.block_bytes, np.uint8)
            self.slots.append(found)
        self.checksums = [xxhash.xxh3_64_intdigest(buf.data) for _, buf in self.slots]
        self.offer: ArenaOffer | None = None
        self.done: list[bool] = []
        self.answered = 0
        self.frames_made = 0
        self.entries_slots: list[int] | None = None  # overrides the slots named

    def arena(self) -> ArenaOffer | None:
        return self.offer if self.offer is not None else self.blocks.offer()

    def answer(self, question: bytes) -> Answer:
        request_id = question.decode().partition(" ")[2]
        self.answered += 1
        slots = self.entries_slots or [slot for slot, _ in self.slots]
        entries = list(zip(self.dest_blocks, slots, self.checksums))
        layout = self.layout
        message = encode_placed(
            request_id, layout.num_layers, layout.block_bytes, layout.block_size, entries
        )
        return Answer(b"yes", request_id, self._frames(request_id), self.done.append, message)

    def _frames(self, request_id: str):
        for layer in range(self.layout.num_layers):
            self.frames_made += 1
            spans = [
                (BlockSpan(dest, 0, self.layout.block_size), *self._halves(buf, layer))
                for dest, (_, buf) in zip(self.dest_blocks, self.slots)
            ]
            yield checked_frame(request_id, layer, spans)

    def _halves(self, buf: np.ndarray, layer: int) -> tuple[memoryview, memoryview]:
        half = self.layout.half_bytes
        at = 2 * layer * half
        return buf.data[at : at + half], buf.data[at + half : at + 2 * half]

    def expected(self) -> np.ndarray:
        """The two blocks as the asker's storage holds them: [layer, K or V, block, byte]."""
        layers, half = self.layout.num_layers, self.layout.half_bytes
        return np.stack([buf.reshape(layers, 2, half) for _, buf in self.slots], axis=2)


class WholeSpanSink(RecordingSink):
    """A sink that names a span of whole blocks as one array, as the worker's inbox does."""

    def __init__(self, storage: KVStorage, gate: threading.Event | None = None) -> None:
        super().__init__(storage)
        self.gate = gate
        self.asked = threading.Event()

    def span_array(self, request_id, span):
        self.asked.set()
        if self.gate is not None:
            assert self.gate.wait(5)
        count = span.num_tokens // self.storage.block_size
        return self.storage.blocks_array(span.block_id, count)

    def on_frames(self, request_id, layers, spans, ok, error) -> None:
        for layer in layers:
            self.on_frame(request_id, layer, spans, ok, error)


@pytest.fixture
def serve():
    receivers, askers = [], []

    def start(server: PlacingServer, sink: RecordingSink) -> tuple[Asker, str]:
        receiver = TcpKVReceiver(RecordingSink(new_storage()), "127.0.0.1", 0, "tok", server=server)
        receivers.append(receiver)
        own = TcpKVReceiver(sink, "127.0.0.1", 0, "tok")
        askers.append(Asker(own, read_timeout_s=5.0))
        return askers[-1], receiver.start()

    yield start
    for asker in askers:
        asker.close()
    for receiver in receivers:
        receiver.stop()


needs_shm = pytest.mark.skipif(
    not __import__("os").path.isdir(ring.SHM_DIR), reason="no /dev/shm here"
)


def landed(sink: RecordingSink, server: PlacingServer) -> np.ndarray:
    blocks = [sink.storage.blocks_array(block, 1) for block in server.dest_blocks]
    return np.concatenate(blocks, axis=2)


def wait_done(server: PlacingServer) -> None:
    deadline = threading.Event()
    for _ in range(500):
        if server.done:
            return
        deadline.wait(0.01)
    raise AssertionError("the answer never finished")


@needs_shm
@pytest.mark.parametrize("sink_kind", ["whole span", "layer by layer"])
def test_a_placed_get_lands_byte_exact_without_frames(serve, sink_kind) -> None:
    storage = new_storage()
    whole = sink_kind == "whole span"
    sink = WholeSpanSink(storage) if whole else RecordingSink(storage)
    server = PlacingServer(BlockLayout.of(storage), DEST_BLOCKS if whole else APART)
    asker, address = serve(server, sink)
    replies: list = []
    assert asker.ask(address, "r1", b"give r1", replies.append)
    assert replies == [b"yes"]
    assert np.array_equal(landed(sink, server), server.expected())
    assert [(e[2], e[4]) for e in sink.frames("r1")] == [(0, True), (1, True), (2, True)]
    assert ("end", "r1", 3) in sink.events
    assert server.frames_made == 0  # nothing went through the ring or the socket
    assert asker.receiver.bytes_placed == 2 * server.layout.block_bytes
    wait_done(server)
    assert server.done == [True]


@needs_shm
def test_a_block_damaged_in_the_arena_is_never_used(serve) -> None:
    storage = new_storage()
    sink = WholeSpanSink(storage)
    server = PlacingServer(BlockLayout.of(storage))
    server.slots[1][1][100] ^= 0xFF  # after its checksum was taken
    asker, address = serve(server, sink)
    assert asker.ask(address, "r1", b"give r1", lambda reply: None)
    frames = sink.frames("r1")
    assert frames and all(not e[4] and e[5] == "checksum mismatch" for e in frames)


@needs_shm
def test_an_arena_the_asker_cannot_see_leaves_the_answer_to_its_frames(serve) -> None:
    storage = new_storage()
    sink = RecordingSink(storage)
    layout = BlockLayout.of(storage)
    server = PlacingServer(layout, APART)
    real = server.blocks.offer()
    server.offer = ArenaOffer(real.pid, real.fd, real.size, bytes(16))  # a foreign cookie
    asker, address = serve(server, sink)
    assert asker.ask(address, "r1", b"give r1", lambda reply: None)
    assert server.frames_made == layout.num_layers
    assert np.array_equal(landed(sink, server), server.expected())
    assert all(e[4] for e in sink.frames("r1")) and not ArenaView._mapped


@needs_shm
def test_a_block_placed_outside_the_arena_loses_the_request(serve) -> None:
    storage = new_storage()
    sink = RecordingSink(storage)
    server = PlacingServer(BlockLayout.of(storage))
    server.entries_slots = [0, 10_000]
    asker, address = serve(server, sink)
    assert not asker.ask(address, "r1", b"give r1", lambda reply: None)
    assert [e[:2] for e in sink.events if e[0] == "lost"] == [("lost", ("r1",))]
    assert not sink.frames("r1")
    wait_done(server)
    assert server.done == [False]  # its blocks were let go when the connection dropped


@needs_shm
def test_the_blocks_stay_pinned_until_the_asker_has_copied_them(serve) -> None:
    storage, gate = new_storage(), threading.Event()
    sink = WholeSpanSink(storage, gate)
    server = PlacingServer(BlockLayout.of(storage))
    asker, address = serve(server, sink)
    asking = threading.Thread(target=asker.ask, args=(address, "r1", b"give r1", lambda r: None))
    asking.start()
    try:
        assert sink.asked.wait(5)  # copying now
        threading.Event().wait(0.2)
        assert server.done == []  # the answering side still holds them
    finally:
        gate.set()
        asking.join(5)
    wait_done(server)
    assert server.done == [True]


@needs_shm
def test_an_asker_killed_mid_copy_lets_its_blocks_go(serve) -> None:
    """SIGKILL of a real asking process while it copies a placed get (its sink stalls):
    the blocks stay pinned while it lives, and are let go when it dies."""
    storage = new_storage()
    server = PlacingServer(BlockLayout.of(storage))
    store = TcpKVReceiver(RecordingSink(new_storage()), "127.0.0.1", 0, "tok", server=server)
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=stalled_asker, args=(child, store.start()), daemon=True)
    process.start()
    try:
        assert parent.recv() == "asking"
        for _ in range(1000):
            if server.answered:
                break
            threading.Event().wait(0.01)
        threading.Event().wait(0.3)
        assert server.answered == 1 and server.done == []  # in flight: pinned, no DONE yet
        os.kill(process.pid, signal.SIGKILL)
        wait_done(server)
        assert server.done == [False] and server.frames_made == 0  # it was placed, not framed
    finally:
        process.kill()
        process.join(10)
        store.stop()


@needs_shm
def test_one_mapping_per_arena_goes_with_the_last_connection(serve) -> None:
    storage = new_storage()
    server = PlacingServer(BlockLayout.of(storage))
    asker, address = serve(server, WholeSpanSink(storage))
    gate = threading.Event()
    stalled = WholeSpanSink(new_storage(), gate)  # a second asker, stalled mid-copy
    other, _ = serve(PlacingServer(BlockLayout.of(storage)), stalled)
    assert asker.ask(address, "r1", b"give r1", lambda r: None)
    thread = threading.Thread(target=other.ask, args=(address, "r2", b"give r2", lambda r: None))
    thread.start()
    try:
        assert stalled.asked.wait(5)
        (view,) = ArenaView._mapped.values()
        assert view.users == 2  # both connections, one mapping
    finally:
        gate.set()
        thread.join(5)
    asker.close()
    assert view.users == 1 and ArenaView._mapped
    other.close()
    assert not ArenaView._mapped


@needs_shm
def test_a_stopped_stores_arena_is_unmapped_by_the_pruner_without_another_ask() -> None:
    storage = new_storage()
    server = PlacingServer(BlockLayout.of(storage))
    store = TcpKVReceiver(RecordingSink(new_storage()), "127.0.0.1", 0, "tok", server=server)
    asker = Asker(
        TcpKVReceiver(WholeSpanSink(storage), "127.0.0.1", 0, "tok"), prune_interval_s=0.05
    )
    try:
        assert asker.ask(store.start(), "r1", b"give r1", lambda r: None)
        assert ArenaView._mapped  # kept, with its connection
        store.stop()  # its connections close
        for _ in range(200):
            if not ArenaView._mapped:
                break
            threading.Event().wait(0.01)
        assert not ArenaView._mapped  # no ask came, the mapping went anyway
    finally:
        asker.close()
        store.stop()


@needs_shm
@pytest.mark.parametrize("big", [False, True], ids=["small: landed first", "big: answer first"])
def test_a_big_get_is_handed_on_before_it_lands_a_small_one_after(serve, monkeypatch, big):
    from shared.transfer.tcp import asker as asking_side

    if big:  # a get past the bound: its first layers may be in use while the rest copy
        monkeypatch.setattr(asking_side, "LAND_FIRST_BYTES", 0)
    storage = new_storage()
    sink = WholeSpanSink(storage)
    server = PlacingServer(BlockLayout.of(storage))
    asker, address = serve(server, sink)
    frames_when_answered: list[int] = []
    assert asker.ask(
        address, "r1", b"give r1", lambda r: frames_when_answered.append(len(sink.events))
    )
    assert frames_when_answered == ([0] if big else [len(sink.events)])
    assert ("end", "r1", 3) in sink.events


# -- puts: the asker's blocks whole through its own ring ---------------------------------------


class PutServer:
    """The kvstore's side of a put: `put <id>` reserves TWO slots in a real store, its
    PutInbox (the receiver's sink) commits what lands whole at the END."""

    def __init__(self, layout: BlockLayout) -> None:
        self.layout = layout
        self.store = BlockStore(
            8 * layout.block_bytes, arena=BlockArena.create(8 * layout.block_bytes)
        )
        self.inbox = PutInbox(self.store)

    def arena(self) -> None:
        return None

    def answer(self, question: bytes) -> Answer:
        request_id = question.decode().partition(" ")[2]
        refs = self.store.reserve_in_room(PUT_HASHES, self.layout)
        self.inbox.open(request_id, refs, 30.0)
        return Answer(b"slots")

    def stored(self, block_hash: int) -> np.ndarray | None:
        (ref,) = self.store.acquire([block_hash], self.layout)
        if ref is None:
            return None
        data = np.frombuffer(ref.data(), np.uint8).copy()
        self.store.release([ref])
        return data


PUT_HASHES = [0xA1, 0xA2, 0xA3]
PUT_SOURCES = (5, 6, 2)  # the asker's blocks: a run of two, then one


@pytest.fixture
def put_served():
    started = []

    def start(shared_memory: bool = True) -> tuple[PutServer, Asker, KVStorage, str]:
        storage = random_storage(torch.float32)
        server = PutServer(BlockLayout.of(storage))
        receiver = TcpKVReceiver(server.inbox, "127.0.0.1", 0, "tok", server=server)
        own = TcpKVReceiver(
            RecordingSink(new_storage()), "127.0.0.1", 0, "tok", shared_memory=shared_memory
        )
        started.append((receiver, Asker(own, read_timeout_s=5.0)))
        return server, started[-1][1], storage, receiver.start()

    yield start
    for receiver, asker in started:
        asker.close()
        receiver.stop()


def put_blocks(storage: KVStorage, made: list[str]):
    """What a worker's put answers with: its blocks whole, or frames (noted in `made`)."""
    moves = [(slot, src, h) for slot, (src, h) in enumerate(zip(PUT_SOURCES, PUT_HASHES))]
    out = blocks_out(storage, "p1", moves)

    def frames():
        made.append("frames")
        return out.frames()

    return lambda reply: dataclasses.replace(out, frames=frames)


def source_block(storage: KVStorage, block: int) -> np.ndarray:
    return storage.blocks_array(block, 1)[:, :, 0].reshape(-1)


def committed(server: PutServer, storage: KVStorage) -> list[bool]:
    for _ in range(500):
        if server.store.lookup(PUT_HASHES) == [True] * 3 or not len(server.inbox):
            break
        threading.Event().wait(0.01)
    return [
        (got := server.stored(h)) is not None and np.array_equal(got, source_block(storage, src))
        for src, h in zip(PUT_SOURCES, PUT_HASHES)
    ]


@needs_shm
@pytest.mark.parametrize("ring_bytes", [ring.ANSWER_RING_BYTES, 4096], ids=["one part", "parts"])
def test_a_put_goes_whole_through_the_askers_ring(put_served, monkeypatch, ring_bytes) -> None:
    monkeypatch.setattr(ring, "ANSWER_RING_BYTES", ring_bytes)  # 4 KiB: a block a part
    server, asker, storage, address = put_served()
    made: list[str] = []
    for attempt in range(2):  # twice on one connection: the second wraps a small ring
        assert asker.ask(
            address, f"p{attempt}", f"put p{attempt}".encode(), put_blocks(storage, made)
        )
        assert committed(server, storage) == [True, True, True]
        server.store = BlockStore(8 * server.layout.block_bytes)  # empty again
        server.inbox.store = server.store
    assert made == []  # no frame was made: the blocks went whole


@needs_shm
def test_a_block_that_fails_its_checksum_in_the_ring_is_not_kept(put_served, monkeypatch) -> None:
    real = placed_puts.encode_placed

    def damaged(request_id, num_layers, slot_bytes, block_tokens, entries):
        (slot, index, digest), *rest = entries
        return real(
            request_id, num_layers, slot_bytes, block_tokens, [(slot, index, digest ^ 1), *rest]
        )

    monkeypatch.setattr(placed_puts, "encode_placed", damaged)
    server, asker, storage, address = put_served()
    assert asker.ask(address, "p1", b"put p1", put_blocks(storage, []))
    assert committed(server, storage) == [False, False, False]  # the part's blocks: none kept
    assert server.inbox.num_abandoned == 3


def test_without_a_ring_a_put_goes_as_frames(put_served) -> None:
    server, asker, storage, address = put_served(shared_memory=False)
    made: list[str] = []
    assert asker.ask(address, "p1", b"put p1", put_blocks(storage, made))
    assert committed(server, storage) == [True, True, True] and made == ["frames"]
