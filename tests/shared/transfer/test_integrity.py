"""A receiver never reports corrupted, refused or mis-sized spans as good (over each
transport)."""

from __future__ import annotations

import ctypes

import pytest
import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.base import BlockSpan
from shared.transfer.mooncake.engine import Engine
from shared.transfer.tcp import HEADER, SPAN
from tests.shared.transfer.proxy import FlipProxy
from tests.shared.transfer.sinks import (
    TWO_BLOCKS,
    RecordingSink,
    random_storage,
    send_request,
)

# No auth, so the TCP sender's stream starts with the first frame: a byte of its 2nd span.
FLIP_AT = HEADER.size + len(b"req") + len(TWO_BLOCKS) * SPAN.size + 4 * 2 * 8 * 4 * 2 + 77


def flip_first_landing(monkeypatch) -> None:
    """Flips one byte of the first batch the engine writes, after it landed."""
    real_start = Engine.start_writes

    def start_writes(self, session, copies):
        wait = real_start(self, session, copies)
        if start_writes.flipped:
            return wait

        def wait_then_flip() -> bool:
            landed = wait()
            ctypes.c_ubyte.from_address(copies[-1].target + 77).value ^= 0xFF
            return landed

        start_writes.flipped = True
        return wait_then_flip

    start_writes.flipped = False
    monkeypatch.setattr(Engine, "start_writes", start_writes)


@pytest.fixture
def corrupted(transport, monkeypatch):
    """`corrupted(address)`: where to send so that a byte of the first frame changes after
    the sender hashed it, on the wire (tcp) or where the engine wrote it (mooncake)."""
    if transport == "mooncake":
        flip_first_landing(monkeypatch)
        yield lambda address: address
        return
    proxies = []

    def through_proxy(address: str) -> str:
        proxies.append(FlipProxy(address, FLIP_AT))
        return proxies[-1].address

    yield through_proxy
    for proxy in proxies:
        proxy.close()


def test_flipped_byte_is_reported_bad(make_receiver, make_sender, corrupted) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(sink)
    done = send_request(make_sender(), corrupted(address), source, "req", TWO_BLOCKS)
    sink.wait_ends("req")

    assert [f[4] for f in sink.frames("req")] == [False, True, True]
    assert sink.frames("req")[0][5] == "checksum mismatch"
    assert receiver.frames_rejected == 1 and receiver.frames_received == 3
    assert not torch.equal(sink.storage.kv[0, :, 4:6], source.kv[0, :, 0:2])  # it did land...
    assert torch.equal(sink.storage.kv[1:, :, 4:6], source.kv[1:, :, 0:2])  # ...but was flagged
    assert done.wait("req") == (True, 3, "")  # the sender cannot know; the receiver does


def test_refused_request_does_not_break_the_connection(make_receiver, make_sender) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8), refused=frozenset({"unknown"}))
    receiver, address = make_receiver(sink)
    sender = make_sender()
    for rid in ("unknown", "known"):
        send_request(sender, address, source, rid, TWO_BLOCKS, layers=[0])
    sink.wait_ends("unknown", "known")

    assert [(f[4], f[5]) for f in sink.frames("unknown")] == [
        (False, "destination refused or wrong size")
    ]
    assert [f[4] for f in sink.frames("known")] == [True]
    assert torch.equal(sink.storage.kv[0, :, 4:6], source.kv[0, :, 0:2])
    assert not any(e[0] == "lost" for e in sink.events)
    assert receiver.frames_rejected == 1


class WrongSizeSink(RecordingSink):
    def destination(self, request_id, layer, span, nbytes):
        k, v = super().destination(request_id, layer, span, nbytes)
        return k, v[:-1]


def test_destination_of_the_wrong_size_is_reported_bad(make_receiver, make_sender) -> None:
    source = random_storage(torch.float32)
    sink = WrongSizeSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink)
    send_request(make_sender(), address, source, "r", TWO_BLOCKS, layers=[0])
    sink.wait_ends("r")
    assert [f[4] for f in sink.frames("r")] == [False]
    assert torch.all(sink.storage.kv == 0)  # nothing was written into the short buffers


@pytest.mark.parametrize(
    "span, k_bytes, layer",
    [
        (BlockSpan(0, 0, 1), 4, 0),  # K and V of different sizes
        (BlockSpan(-1, 0, 1), 8, 0),  # negative block id
        (BlockSpan(0, 0, 1, block_hash=1 << 64), 8, 0),  # hash wider than 64 bits
        (BlockSpan(0, 0, 1), 8, -1),  # negative layer
    ],
)
def test_sender_rejects_what_the_wire_cannot_carry(make_sender, span, k_bytes, layer) -> None:
    k, v = memoryview(bytearray(k_bytes)), memoryview(bytearray(8))
    with pytest.raises(ValueError):
        make_sender().send("127.0.0.1:1", "r", layer, [(span, k, v)])
