"""Frames of several requests land byte-exact in a receiver-side KVStorage, END last (over
each transport)."""

from __future__ import annotations

import pytest
import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.base import BlockSpan
from shared.transfer.tensor_bytes import tensor_bytes
from tests.shared.transfer.sinks import (
    MOVES,
    Done,
    RecordingSink,
    random_storage,
    send_request,
    source_spans,
)


def as_ints(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def check_requests_land_byte_exact(
    make_receiver, make_sender, dtype, part_bytes, **receiver_options
) -> None:
    source = random_storage(dtype)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8, dtype))
    receiver, address = make_receiver(sink, **receiver_options)
    sender, done = make_sender(part_bytes=part_bytes), Done()
    for layer in range(3):  # requests interleave, as concurrent prefills would
        for rid, moves in MOVES.items():
            sender.send(address, rid, layer, source_spans(source, layer, moves))
    for rid in MOVES:
        sender.finish(address, rid, done.callback(rid))
    sink.wait_ends(*MOVES)

    for rid, moves in MOVES.items():
        assert done.wait(rid) == (True, 3, "")
        frames = sink.frames(rid)
        assert [(f[2], f[3], f[4]) for f in frames] == [
            (layer, tuple(span for _, span in moves), True) for layer in range(3)
        ]
        assert sink.events.index(("end", rid, 3)) > sink.events.index(frames[-1])
        for src, span in moves:
            tokens = slice(span.offset, span.offset + span.num_tokens)
            assert torch.equal(
                as_ints(sink.storage.kv[:, :, span.block_id, tokens]),
                as_ints(source.kv[:, :, src, tokens]),
            )
    assert not any(e[0] == "lost" for e in sink.events)
    expected_bytes = (
        3
        * 2
        * sum(span.num_tokens for moves in MOVES.values() for _, span in moves)
        * 2
        * 8
        * source.kv.element_size()
    )
    assert sender.bytes_sent == receiver.bytes_received == expected_bytes
    assert sender.frames_sent == receiver.frames_received == 9
    assert receiver.frames_rejected == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("part_bytes", [64, 1 << 20])  # a part per span, or one per frame
def test_requests_land_byte_exact(make_receiver, make_sender, dtype, part_bytes) -> None:
    check_requests_land_byte_exact(make_receiver, make_sender, dtype, part_bytes)


class OrderSink(RecordingSink):
    """Also records every destination call."""

    def destination(self, request_id, layer, span, nbytes):
        self._record("destination", request_id, layer)
        return super().destination(request_id, layer, span, nbytes)


def test_sink_sees_one_frame_at_a_time(make_receiver, make_sender) -> None:
    """The next frame's destinations are not asked for before this one is reported (a sink
    may track one frame in flight per request, as shared.transfer.inbox does)."""
    source = random_storage(torch.float32)
    sink = OrderSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink)
    sender = make_sender()
    for rid, moves in MOVES.items():
        send_request(sender, address, source, rid, moves)
    sink.wait_ends(*MOVES)
    placed = None
    for kind, rid, *rest in sink.events:
        if kind == "destination":
            assert placed in (None, (rid, rest[0]))
            placed = (rid, rest[0])
        elif kind == "frame":
            assert placed == (rid, rest[0])
            placed = None


def test_slots_outside_the_spans_stay_untouched(make_receiver, make_sender) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink)
    send_request(make_sender(), address, source, "r", [(2, BlockSpan(7, 1, 2))], layers=[1])
    sink.wait_ends("r")
    written = torch.zeros(sink.storage.kv.shape, dtype=torch.bool)
    written[1, :, 7, 1:3] = True
    assert torch.all(sink.storage.kv[~written] == 0)
    assert torch.equal(sink.storage.kv[1, :, 7, 1:3], source.kv[1, :, 2, 1:3])


def test_end_without_frames_reports_zero(make_receiver, make_sender) -> None:
    sink = RecordingSink(KVStorage(1, 1, 4, 1, 1))
    _, address = make_receiver(sink)
    sender, done = make_sender(), Done()
    sender.finish(address, "empty", done.callback("empty"))
    sink.wait_ends("empty")
    assert done.wait("empty") == (True, 0, "")
    assert sink.events == [("end", "empty", 0)]


def test_tensor_bytes_shares_memory_for_bfloat16() -> None:
    tensor = torch.zeros(2, 3, dtype=torch.bfloat16)
    view = tensor_bytes(tensor)
    assert view.nbytes == 12 and view.format == "B"
    view[0:2] = torch.tensor([1.5], dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes()
    assert tensor[0, 0].item() == 1.5
    with pytest.raises(ValueError):
        tensor_bytes(torch.zeros(4, 4)[:, 1])
