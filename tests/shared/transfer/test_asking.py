"""Asks on the data connection (tcp.asking, tcp.asker): an answer's frames land in the
asker's own sink through the receiving side's checks; a refusal lands nothing and keeps
the connection; damage, a cut and an abort each fail the request; a kept connection the
receiver closed is replaced; a receiver that serves no asks drops the connection. On one
host the answers' payload comes through a ring the asker offers, with the same checks."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.common.frames import checked_frame
from shared.transfer.common.limits import ConnectionLimits
from shared.transfer.tcp import TcpKVReceiver, ring
from shared.transfer.tcp.asker import Asker
from shared.transfer.tcp.asking import Answer
from tests.e2e.proxy import CuttingProxy
from tests.shared.transfer.proxy import FlipProxy
from tests.shared.transfer.sinks import (
    TWO_BLOCKS,
    RecordingSink,
    random_storage,
    source_spans,
)
from tests.shared.transfer.transports import damage_first_placed_part, stalled_asker

LAYERS = range(3)
needs_shm = pytest.mark.skipif(not os.path.isdir(ring.SHM_DIR), reason="no /dev/shm here")


class Server:
    """Answers `give <id>` with TWO_BLOCKS of its storage, every layer a frame, and
    anything else with a refusal; counts the answers whose frames all went out."""

    def __init__(self) -> None:
        self.source = random_storage(torch.float32)
        self.sent: list[bool] = []

    def answer(self, question: bytes) -> Answer:
        verb, _, request_id = question.decode().partition(" ")
        if verb != "give":
            return Answer(b"no")
        frames = [
            checked_frame(request_id, layer, source_spans(self.source, layer, TWO_BLOCKS))
            for layer in LAYERS
        ]
        return Answer(b"yes", request_id, frames, self.sent.append)

    def arena(self) -> None:
        return None  # its blocks lie in no shared memory (see test_placed)


class Replies:
    def __init__(self) -> None:
        self.got: list[bytes | None] = []

    def __call__(self, reply: bytes | None) -> None:
        self.got.append(reply)


@pytest.fixture
def served():
    """A receiver that answers asks (the kvstore's side), and its Server."""
    started = []

    def start(limits: ConnectionLimits = ConnectionLimits(), server=None):
        server = server if server is not None else Server()
        sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
        receiver = TcpKVReceiver(sink, "127.0.0.1", 0, "tok", limits=limits, server=server)
        started.append(receiver)
        return receiver, receiver.start(), server

    yield start
    for receiver in started:
        receiver.stop()


@pytest.fixture
def asking():
    """An asker, its own receiver's sink (where answers land) and that receiver; without
    `shared_memory` it offers no ring (a proxy that stands for a network link then sees
    the answers' payload)."""
    askers = []

    def start(shared_memory: bool = True):
        sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
        own = TcpKVReceiver(sink, "127.0.0.1", 0, "tok", shared_memory=shared_memory)
        askers.append(Asker(own, read_timeout_s=5.0))
        return askers[-1], sink, own

    yield start
    for asker in askers:
        asker.close()


def eventually(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def landed(sink: RecordingSink, server: Server) -> bool:
    dest = [span for _, span in TWO_BLOCKS]
    src = [src for src, _ in TWO_BLOCKS]
    return all(
        torch.equal(sink.storage.kv[:, :, d.block_id], server.source.kv[:, :, s])
        for d, s in zip(dest, src)
    )


def test_an_answer_lands_its_frames_in_the_askers_sink(served, asking) -> None:
    _receiver, address, server = served()
    asker, sink, own = asking()
    replies = Replies()
    asker.ask(address, "r1", b"give r1", replies)
    assert replies.got == [b"yes"]
    assert [(e[2], e[4]) for e in sink.frames("r1")] == [(layer, True) for layer in LAYERS]
    assert ("end", "r1", len(LAYERS)) in sink.events
    assert landed(sink, server)
    eventually(lambda: server.sent == [True])  # `done` runs on the kvstore's thread after END
    assert own.bytes_received == len(LAYERS) * 2 * sum(s.num_tokens for _, s in TWO_BLOCKS) * 64


def test_a_refusal_lands_nothing_and_the_connection_is_kept(served, asking) -> None:
    receiver, address, _server = served()
    asker, sink, _ = asking()
    replies = Replies()
    asker.ask(address, "r1", b"keep it", replies)
    asker.ask(address, "r2", b"give r2", replies)
    assert replies.got == [b"no", b"yes"]
    assert not sink.frames("r1") and len(sink.frames("r2")) == len(LAYERS)
    assert receiver.connections_accepted == 1


def test_a_damaged_answer_is_refused_by_the_checksum(served, asking) -> None:
    _, address, _server = served()
    proxy = FlipProxy(address, flip_at=300, answers=True)  # in the first frame's payload
    asker, sink, _ = asking(shared_memory=False)
    try:
        asker.ask(proxy.address, "r1", b"give r1", Replies())
    finally:
        proxy.close()
    frames = sink.frames("r1")
    assert [e[4] for e in frames] == [False, True, True] and "checksum" in frames[0][5]


def test_an_answer_cut_mid_frame_loses_its_request(served, asking) -> None:
    _, address, _ = served()
    port = int(address.rsplit(":", 1)[1])
    proxy = CuttingProxy(port, cut_after=1_500, on_cut=lambda: None, answers=True)
    asker, sink, _ = asking(shared_memory=False)
    replies = Replies()
    try:
        asker.ask(f"127.0.0.1:{proxy.port}", "r1", b"give r1", replies)
    finally:
        proxy.close()
    assert proxy.cut and replies.got == [b"yes"]
    assert [e[:2] for e in sink.events if e[0] == "lost"] == [("lost", ("r1",))]
    assert not any(e[0] == "end" for e in sink.events)


def test_abort_cuts_an_ask_that_stalls_mid_answer(served, asking) -> None:
    _, address, _ = served()
    port = int(address.rsplit(":", 1)[1])
    proxy = CuttingProxy(port, cut_after=1_500, on_cut=lambda: None, hold=True, answers=True)
    asker, sink, _ = asking(shared_memory=False)
    replies = Replies()
    thread = threading.Thread(
        target=asker.ask, args=(f"127.0.0.1:{proxy.port}", "r1", b"give r1", replies)
    )
    try:
        thread.start()
        sink.wait_for(lambda: proxy.cut)  # stalled inside the answer's frames
        asker.abort("r1")
        thread.join(5)
        assert not thread.is_alive()  # well before the 5 s read timeout
    finally:
        proxy.close()
    assert [e[:2] for e in sink.events if e[0] == "lost"] == [("lost", ("r1",))]


def test_a_kept_connection_the_receiver_closed_is_replaced(served, asking) -> None:
    receiver, address, _ = served(ConnectionLimits(idle_timeout_s=0.2))
    asker, sink, _ = asking()
    replies = Replies()
    asker.ask(address, "r1", b"give r1", replies)
    eventually(lambda: receiver.open_connections == 0)  # it idled out
    asker.ask(address, "r2", b"give r2", replies)
    assert replies.got == [b"yes", b"yes"] and receiver.connections_accepted == 2
    assert len(sink.frames("r2")) == len(LAYERS)


class FailingServer(Server):
    def answer(self, question: bytes) -> Answer:
        raise RuntimeError("a bug in the server")


@pytest.mark.parametrize("server", [None, FailingServer()], ids=["no server", "a failing one"])
def test_an_ask_nobody_answers_gets_no_reply_and_nothing_lands(served, asking, server) -> None:
    receiver, address, _ = served()
    receiver.server = server
    asker, sink, _ = asking()
    replies = Replies()
    asker.ask(address, "r1", b"give r1", replies)
    assert replies.got == [None] and sink.events == []


# --- same host: the answers' payload through the asker's ring ------------------------------


def _rings() -> set[str]:
    return {name for name in os.listdir(ring.SHM_DIR) if name.startswith(ring.PREFIX)}


PAYLOAD = len(LAYERS) * 2 * sum(s.num_tokens for _, s in TWO_BLOCKS) * 64  # bytes an answer


@needs_shm
def test_on_one_host_answers_come_through_the_askers_ring(served, asking, monkeypatch) -> None:
    """Byte-exact, ask after ask on one connection, the ring (two of an answer's three
    parts fill it) wrapping and its writer waiting for room; the socket carries headers
    and span tables only, and no file stays in /dev/shm."""
    monkeypatch.setattr(ring, "ANSWER_RING_BYTES", 2048)
    before = _rings()
    receiver, address, server = served()
    proxy = FlipProxy(address, answers=True)  # flips nothing: counts what came back
    asker, sink, _ = asking()
    replies = Replies()
    try:
        for i in range(5):
            asker.ask(proxy.address, f"r{i}", f"give r{i}".encode(), replies)
        # NOTE: the server's answer ends once the asker's word that it read the last part
        # has come back through the proxy
        eventually(lambda: server.sent == [True] * 5)
    finally:
        proxy.close()
    assert replies.got == [b"yes"] * 5 and receiver.connections_accepted == 1
    for i in range(5):
        assert [e[4] for e in sink.frames(f"r{i}")] == [True] * len(LAYERS)
    assert landed(sink, server)
    assert len(proxy.sent) < 5 * PAYLOAD / 4
    assert _rings() == before


@needs_shm
def test_a_receiver_that_takes_no_rings_answers_over_the_socket(served, asking) -> None:
    receiver, address, server = served()
    receiver.shared_memory = False
    proxy = FlipProxy(address, answers=True)
    asker, sink, _ = asking()
    try:
        asker.ask(proxy.address, "r1", b"give r1", Replies())
    finally:
        proxy.close()
    assert landed(sink, server) and [e[4] for e in sink.frames("r1")] == [True] * len(LAYERS)
    assert len(proxy.sent) > PAYLOAD


@needs_shm
def test_a_byte_damaged_in_the_answer_ring_is_a_bad_frame(served, asking, monkeypatch) -> None:
    damage_first_placed_part(monkeypatch)
    _, address, _ = served()
    asker, sink, _ = asking()
    asker.ask(address, "r1", b"give r1", Replies())
    frames = sink.frames("r1")
    assert [e[4] for e in frames] == [False, True, True] and frames[0][5] == "checksum mismatch"


class HeldSink(RecordingSink):
    """Holds the first destination asked until `go` is set (the ring's reader stalls)."""

    def __init__(self, storage: KVStorage) -> None:
        super().__init__(storage)
        self.asked, self.go = threading.Event(), threading.Event()

    def destination(self, request_id, layer, span, nbytes):
        self.asked.set()
        self.go.wait(5)
        return super().destination(request_id, layer, span, nbytes)


@needs_shm
def test_an_abort_ends_an_answer_waiting_for_room_in_the_ring(served, asking, monkeypatch) -> None:
    monkeypatch.setattr(ring, "ANSWER_RING_BYTES", 2048)  # two parts fill it
    _, address, server = served()
    asker, _, own = asking()
    sink = HeldSink(KVStorage(3, 8, 4, 2, 8))
    own.sink = sink
    thread = threading.Thread(target=asker.ask, args=(address, "r1", b"give r1", Replies()))
    thread.start()
    try:
        assert sink.asked.wait(5)
        time.sleep(0.2)  # the server has placed two parts and waits for room for the third
        assert server.sent == []  # its answer is still going
        asker.abort("r1")
        eventually(lambda: server.sent == [False])  # the wait ended with the connection
    finally:
        sink.go.set()
        thread.join(5)
    assert not thread.is_alive()
    assert [e[:2] for e in sink.events if e[0] == "lost"] == [("lost", ("r1",))]


@needs_shm
def test_an_asker_killed_while_the_answer_waits_for_room_ends_the_answer(
    served, monkeypatch
) -> None:
    """A real asking process whose sink stalls: the server fills its ring and waits for
    room; SIGKILL of the asker ends that wait (the answer's blocks are let go)."""
    placed: list[int] = []
    real_place = ring.RingWriter.place

    def counted(self, sock, spans, nbytes):
        found = real_place(self, sock, spans, nbytes)
        placed.append(found[0])
        return found

    monkeypatch.setattr(ring.RingWriter, "place", counted)
    _, address, server = served()
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=stalled_asker, args=(child, address), daemon=True)
    process.start()
    try:
        assert parent.recv() == "asking"
        eventually(lambda: len(placed) == 2, timeout=10)
        time.sleep(0.2)
        assert len(placed) == 2 and server.sent == []  # the third part waits for room
        os.kill(process.pid, signal.SIGKILL)
        eventually(lambda: server.sent == [False])
    finally:
        process.kill()
        process.join(10)
