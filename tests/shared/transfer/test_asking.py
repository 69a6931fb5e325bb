"""Asks on the data connection (tcp.asking, tcp.asker): an answer's frames land in the
asker's own sink through the receiving side's checks; a refusal lands nothing and keeps
the connection; damage, a cut and an abort each fail the request; a kept connection the
receiver closed is replaced; a receiver that serves no asks drops the connection."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.common.frames import checked_frame
from shared.transfer.common.limits import ConnectionLimits
from shared.transfer.tcp import TcpKVReceiver
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

LAYERS = range(3)


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
    """An asker, its own receiver's sink (where answers land) and that receiver."""
    askers = []

    def start():
        sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
        own = TcpKVReceiver(sink, "127.0.0.1", 0, "tok")
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
    asker, sink, _ = asking()
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
    asker, sink, _ = asking()
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
    asker, sink, _ = asking()
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
    sink.wait_for(lambda: receiver.open_connections == 0)  # it idled out
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
