"""A receiver never reports corrupted, refused or mis-sized spans as good."""
from __future__ import annotations

import pytest
import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.base import BlockSpan
from shared.transfer.tcp import HEADER, SPAN
from tests.shared.transfer.proxy import FlipProxy
from tests.shared.transfer.sinks import Done, RecordingSink, random_storage, source_spans

MOVES = [(0, BlockSpan(4, 0, 4)), (1, BlockSpan(5, 0, 4))]


@pytest.fixture
def proxies():
    made = []
    yield lambda *args: made.append(FlipProxy(*args)) or made[-1]
    for proxy in made:
        proxy.close()


def test_flipped_payload_byte_is_reported_bad(make_receiver, make_sender, proxies) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(sink)
    # No auth, so the sender's stream starts with the first frame: flip a byte of its 2nd span.
    first_payload = HEADER.size + len(b"req") + len(MOVES) * SPAN.size
    proxy = proxies(address, first_payload + 4 * 2 * 8 * 4 * 2 + 77)
    sender, done = make_sender(), Done()
    for layer in range(3):
        sender.send(proxy.address, "req", layer, source_spans(source, layer, MOVES))
    sender.finish(proxy.address, "req", done.callback("req"))
    sink.wait_ends("req")

    oks = [frame[4] for frame in sink.frames("req")]
    assert oks == [False, True, True]
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
        sender.send(address, rid, 0, source_spans(source, 0, MOVES))
        sender.finish(address, rid, lambda *_: None)
    sink.wait_ends("unknown", "known")

    assert [(f[4], f[5]) for f in sink.frames("unknown")] == \
        [(False, "destination refused or wrong size")]
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
    sender = make_sender()
    sender.send(address, "r", 0, source_spans(source, 0, MOVES))
    sender.finish(address, "r", lambda *_: None)
    sink.wait_ends("r")
    assert [f[4] for f in sink.frames("r")] == [False]
    assert torch.all(sink.storage.kv == 0)  # nothing was written into the short buffers


@pytest.mark.parametrize("span, k_bytes, layer", [
    (BlockSpan(0, 0, 1), 4, 0),  # K and V of different sizes
    (BlockSpan(-1, 0, 1), 8, 0),  # negative block id
    (BlockSpan(0, 0, 1, block_hash=1 << 64), 8, 0),  # hash wider than 64 bits
    (BlockSpan(0, 0, 1), 8, -1),  # negative layer
])
def test_sender_rejects_what_the_wire_cannot_carry(make_sender, span, k_bytes, layer) -> None:
    k, v = memoryview(bytearray(k_bytes)), memoryview(bytearray(8))
    with pytest.raises(ValueError):
        make_sender().send("127.0.0.1:1", "r", layer, [(span, k, v)])
