"""The two transports, by name, for tests that run the same scenario over each."""

from __future__ import annotations

import time

import pytest

from shared.transfer import mooncake
from shared.transfer.base import KVReceiver, KVSender, KVSink
from shared.transfer.mooncake import MooncakeKVReceiver, MooncakeKVSender
from shared.transfer.tcp import TcpKVReceiver, TcpKVSender

needs_mooncake = pytest.mark.skipif(
    not mooncake.available(),
    reason="mooncake.engine cannot be imported: pip install "
    "mooncake-transfer-engine-non-cuda (it needs Debian's libibverbs1 and librdmacm1)",
)
TRANSPORTS = ["tcp", pytest.param("mooncake", marks=needs_mooncake)]
RECEIVERS = {"tcp": TcpKVReceiver, "mooncake": MooncakeKVReceiver}
SENDERS = {"tcp": TcpKVSender, "mooncake": MooncakeKVSender}
OTHER = {"tcp": "mooncake", "mooncake": "tcp"}


def new_receiver(transport: str, sink: KVSink, **kwargs) -> KVReceiver:
    return RECEIVERS[transport](sink, host="127.0.0.1", **kwargs)


def new_sender(transport: str, **kwargs) -> KVSender:
    if transport == "tcp":  # NOTE: the socket's path; test_ring.py has shared memory's
        kwargs.setdefault("shared_memory", False)
    return SENDERS[transport](**kwargs)


class StalledSink:
    """Never returns a destination, so a sender's frame never gets through."""

    def destination(self, *args):
        time.sleep(60)

    def on_frame(self, *args): ...
    def on_end(self, *args): ...
    def on_lost(self, *args): ...


def stalled_receiver(conn, transport: str) -> None:
    """A receiver process's body: sends its address down `conn`, then stalls every sender."""
    conn.send(new_receiver(transport, StalledSink()).start())
    time.sleep(60)


def stalled_asker(conn, address: str) -> None:
    """An asking process's body: asks `address` for `give r1` with a small ring for the
    answers and a sink that stalls, so the answer waits for room; says "asking" first."""
    from shared.transfer.tcp import ring
    from shared.transfer.tcp.asker import Asker

    ring.ANSWER_RING_BYTES = 2048  # two of the answer's parts fill it
    asker = Asker(TcpKVReceiver(StalledSink(), "127.0.0.1", 0, "tok"))
    conn.send("asking")
    asker.ask(address, "r1", b"give r1", lambda reply: None)


def damage_first_placed_part(monkeypatch) -> None:
    """Flip a byte of the first part a ring's writer places, after the writer hashed it."""
    from shared.transfer.tcp import ring

    real_place = ring.RingWriter.place
    damaged: list[int] = []

    def place_then_damage(self, sock, spans, nbytes):
        start, digests = real_place(self, sock, spans, nbytes)
        if not damaged:
            damaged.append(start)
            self.data[start % self.size + 77] ^= 0xFF
        return start, digests

    monkeypatch.setattr(ring.RingWriter, "place", place_then_damage)
