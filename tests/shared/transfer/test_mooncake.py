"""The TCP transport's round-trip, integrity, refusal and auth expectations, over the Mooncake
Transfer Engine transport (its `tcp` protocol, P2P handshake: no etcd, no RDMA NIC)."""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import socket
import time

import pytest
import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.base import BlockSpan
from shared.transfer.mooncake import MooncakeKVReceiver, MooncakeKVSender, available
from shared.transfer.mooncake.control import (
    KIND_PLACES,
    answer_hello,
    encode_ask,
    read_header,
    read_places,
)
from shared.transfer.mooncake.engine import Engine
from shared.transfer.tcp import TcpKVSender
from shared.transfer.tcp.wire import checked_frame
from tests.shared.transfer.proxy import FlipProxy
from tests.shared.transfer.sinks import Done, RecordingSink, random_storage, source_spans

pytestmark = pytest.mark.skipif(
    not available(), reason="mooncake.engine cannot be imported: pip install "
    "mooncake-transfer-engine-non-cuda (it needs Debian's libibverbs1 and librdmacm1)")

# request id -> (source block, destination span); offsets > 0 are partial blocks
MOVES = {
    "req-a": [(0, BlockSpan(5, 0, 4, block_hash=0xA1)), (1, BlockSpan(2, 0, 4, 0xA2)),
              (2, BlockSpan(7, 1, 2))],
    "req-b": [(3, BlockSpan(0, 0, 4, 0xB1)), (4, BlockSpan(1, 2, 1))],
    "req-c": [(6, BlockSpan(3, 3, 1))],
}
TWO_BLOCKS = [(0, BlockSpan(4, 0, 4)), (1, BlockSpan(5, 0, 4))]
TOKEN = "s3cret-token-for-kv"


# NOTE: named as conftest's TCP fixtures, which they override here, so that the test bodies read
# like their TCP counterparts.
@pytest.fixture
def make_receiver():
    receivers = []

    def make(sink, preregister: bool = True, **kwargs) -> tuple[MooncakeKVReceiver, str]:
        memory = [sink.storage.kv] if preregister else []
        receiver = MooncakeKVReceiver(sink, host="127.0.0.1", memory=memory, **kwargs)
        receivers.append(receiver)
        return receiver, receiver.start()
    yield make
    for receiver in receivers:
        receiver.stop()


@pytest.fixture
def make_sender():
    senders = []

    def make(**kwargs) -> MooncakeKVSender:
        senders.append(MooncakeKVSender(**kwargs))
        return senders[-1]
    yield make
    for sender in senders:
        sender.close()


def as_ints(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def send_request(sender, address, source, rid, moves, layers=range(3)) -> Done:
    done = Done()
    for layer in layers:
        sender.send(address, rid, layer, source_spans(source, layer, moves))
    sender.finish(address, rid, done.callback(rid))
    return done


# --- round trip ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("preregister", [True, False])  # memory given up front, or found lazily
@pytest.mark.parametrize("part_bytes", [64, 1 << 20])  # a part per span, or one per frame
def test_requests_land_byte_exact(make_receiver, make_sender, dtype, preregister,
                                  part_bytes) -> None:
    source = random_storage(dtype)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8, dtype))
    receiver, address = make_receiver(sink, preregister)
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
        assert [(f[2], f[3], f[4]) for f in frames] == \
            [(layer, tuple(span for _, span in moves), True) for layer in range(3)]
        assert sink.events.index(("end", rid, 3)) > sink.events.index(frames[-1])
        for src, span in moves:
            tokens = slice(span.offset, span.offset + span.num_tokens)
            assert torch.equal(as_ints(sink.storage.kv[:, :, span.block_id, tokens]),
                               as_ints(source.kv[:, :, src, tokens]))
    assert not any(e[0] == "lost" for e in sink.events)
    expected_bytes = 3 * 2 * sum(span.num_tokens for moves in MOVES.values()
                                 for _, span in moves) * 2 * 8 * source.kv.element_size()
    assert sender.bytes_sent == receiver.bytes_received == expected_bytes
    assert sender.frames_sent == receiver.frames_received == 9
    assert receiver.frames_rejected == 0


class OrderSink(RecordingSink):
    """Also records every destination call."""

    def destination(self, request_id, layer, span, nbytes):
        self._record("destination", request_id, layer)
        return super().destination(request_id, layer, span, nbytes)


def test_sink_sees_one_frame_at_a_time(make_receiver, make_sender) -> None:
    """The next frame's places are not handed out before this one is reported (a sink may
    track one frame in flight per request, as shared.kv_inbox does)."""
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


# --- integrity and refusal ------------------------------------------------------------------


@pytest.fixture
def flip_first_landing(monkeypatch):
    """Flips one byte of the first batch the engine writes, after it landed: the bytes are
    now not what the sender read."""
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


def test_flipped_byte_is_reported_bad(make_receiver, make_sender, flip_first_landing) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(sink)
    done = send_request(make_sender(), address, source, "req", TWO_BLOCKS)
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
    send_request(make_sender(), address, source, "r", TWO_BLOCKS, layers=[0])
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


# --- peers that go away, or speak the other transport ---------------------------------------


def test_unreachable_peer_fails_the_request(make_sender) -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        address = f"127.0.0.1:{placeholder.getsockname()[1]}"
    sender, done = make_sender(), Done()
    sender.send(address, "r", 0, [(BlockSpan(0, 0, 1), memoryview(b"k"), memoryview(b"v"))])
    sender.finish(address, "r", done.callback("r"))
    ok, num_frames, error = done.wait("r")
    assert (ok, num_frames) == (False, 0) and "cannot reach" in error


def test_stopping_the_receiver_reports_open_requests_lost(make_receiver, make_sender) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(sink)
    make_sender().send(address, "open", 0, source_spans(source, 0, TWO_BLOCKS))
    sink.wait_for(lambda: sink.frames("open"))
    receiver.stop()
    sink.wait_for(lambda: any(e[0] == "lost" for e in sink.events))
    assert sink.events[-1][:2] == ("lost", ("open",))


def test_sender_gone_mid_frame_reports_its_request_lost(make_receiver) -> None:
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink, settle_s=0.05)
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        answer_hello(sock, None)
        frame = checked_frame("gone", 0, source_spans(random_storage(torch.float32), 0,
                                                      TWO_BLOCKS))
        sock.sendall(encode_ask(frame))  # then goes silent once it has its places
        header = read_header(sock)
        assert header.kind == KIND_PLACES and all(p.accepted for p in read_places(sock, 2))
    sink.wait_for(lambda: any(e[0] == "lost" for e in sink.events))
    assert sink.events == [("lost", ("gone",), "connection closed mid-frame")]


def test_write_the_engine_refuses_fails_the_request(make_receiver, make_sender,
                                                    monkeypatch) -> None:
    """Places in memory the receiver's engine never registered: its engine rejects the write."""
    monkeypatch.setattr(Engine, "ensure_registered", lambda self, view: True)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink, preregister=False, settle_s=0.05)
    done = send_request(make_sender(), address, random_storage(torch.float32), "r", TWO_BLOCKS)
    ok, num_frames, error = done.wait("r")
    assert (ok, num_frames) == (False, 0) and "transfer engine write" in error
    sink.wait_for(lambda: any(e[0] == "lost" for e in sink.events))
    assert sink.events == [("lost", ("r",), "connection closed mid-frame")]


class StalledSink:
    """Never returns a destination."""

    def destination(self, *args):
        time.sleep(60)

    def on_frame(self, *args): ...
    def on_end(self, *args): ...
    def on_lost(self, *args): ...


def stalled_receiver(conn) -> None:
    conn.send(MooncakeKVReceiver(StalledSink(), host="127.0.0.1").start())
    time.sleep(60)


def test_receiver_killed_mid_frame_fails_the_request(make_sender) -> None:
    context = mp.get_context("spawn")  # NOTE: not fork: this process runs engine threads
    parent, child = context.Pipe()
    process = context.Process(target=stalled_receiver, args=(child,), daemon=True)
    process.start()
    try:
        address = parent.recv()
        done = send_request(make_sender(), address, random_storage(torch.float32), "r",
                            TWO_BLOCKS, layers=[0])
        time.sleep(0.2)  # the sender now waits for places that never come
        process.kill()
        ok, num_frames, error = done.wait("r")
        assert (ok, num_frames) == (False, 0) and "no places" in error
    finally:
        process.kill()
        process.join()


def test_close_interrupts_a_silent_peer_and_fails_its_requests(make_sender) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never says HELLO
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        sender, done = make_sender(connect_timeout_s=30), Done()
        sender.send(address, "r", 0, [(BlockSpan(0, 0, 1), memoryview(b"k"), memoryview(b"v"))])
        sender.finish(address, "r", done.callback("r"))
        time.sleep(0.1)  # the sender is now waiting for the HELLO
        start = time.monotonic()
        sender.close()
        assert time.monotonic() - start < 2
        ok, _, error = done.wait("r", timeout=0)
        assert not ok and error
        with pytest.raises(RuntimeError):
            sender.finish(address, "late", done.callback("late"))


def test_sender_reconnects_to_a_restarted_receiver(make_receiver, make_sender) -> None:
    """The new receiver has a new engine session: the sender learns it on reconnecting."""
    source = random_storage(torch.float32)
    first = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(first)
    sender = make_sender()
    assert send_request(sender, address, source, "before", TWO_BLOCKS).wait("before")[0]
    receiver.stop()

    second = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    make_receiver(second, port=int(address.rsplit(":", 1)[1]))
    done = send_request(sender, address, source, "after", TWO_BLOCKS, layers=[0])
    assert done.wait("after") == (True, 1, "")
    second.wait_ends("after")
    assert [f[4] for f in second.frames("after")] == [True]


def test_tcp_sender_is_refused_by_a_mooncake_receiver(make_receiver) -> None:
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink)
    sender = TcpKVSender()
    try:
        done = send_request(sender, address, random_storage(torch.float32), "r", TWO_BLOCKS)
        ok, _, error = done.wait("r")
    finally:
        sender.close()
    assert not ok and "not a kvstack" in error
    assert sink.events == []


# --- authentication (of the control channel) ------------------------------------------------


def transfer(make_receiver, make_sender, receiver_token, sender_token, via_proxy=False):
    """Send one frame and END; returns (sink, on_done result, proxy or None)."""
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink, auth_token=receiver_token)
    proxy = FlipProxy(address) if via_proxy else None
    peer = proxy.address if proxy else address
    sender = make_sender(auth_token=sender_token)
    result = send_request(sender, peer, random_storage(torch.float32), "r",
                          [(0, BlockSpan(1, 0, 4))], layers=[0]).wait("r")
    if result[0]:
        sink.wait_ends("r")
    if proxy:
        proxy.close()
    return sink, result, proxy


@pytest.mark.parametrize("receiver_token, sender_token", [(TOKEN, TOKEN), (None, None)])
def test_matching_configuration_transfers(make_receiver, make_sender, receiver_token,
                                          sender_token) -> None:
    sink, result, _ = transfer(make_receiver, make_sender, receiver_token, sender_token)
    assert result == (True, 1, "")
    assert [f[4] for f in sink.frames("r")] == [True]


@pytest.mark.parametrize("sender_token", ["wrong-token", None])
def test_wrong_or_missing_token_is_refused(make_receiver, make_sender, sender_token) -> None:
    sink, (ok, num_frames, error), _ = transfer(make_receiver, make_sender, TOKEN, sender_token)
    assert not ok and num_frames == 0 and "authentication failed" in error
    assert sink.events == []


def test_token_never_travels(make_receiver, make_sender) -> None:
    _, result, proxy = transfer(make_receiver, make_sender, TOKEN, TOKEN, via_proxy=True)
    assert result == (True, 1, "")
    assert len(proxy.sent) > 32 and TOKEN.encode() not in proxy.sent
