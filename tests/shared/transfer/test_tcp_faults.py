"""TCP only: a receiver killed while the sender's bytes pile up fails the request; garbage on
the wire closes one connection and nothing else."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import time

import pytest
import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.base import BlockSpan
from shared.transfer.tcp import (
    HEADER,
    HELLO,
    KIND_ANSWER,
    KIND_ASK,
    KIND_KV,
    KIND_KV_MORE,
    KIND_PLACED,
    KIND_RING,
    MAGIC,
    MAX_SPANS,
    SPAN,
    VERSION,
    placed,
    ring,
)
from tests.shared.transfer.sinks import ONE_BLOCK, Done, RecordingSink, random_storage, send_request
from tests.shared.transfer.transports import stalled_receiver

SPAN_HALF_BYTES = 4 * 2 * 8 * 4  # block_size x kv_heads x head_dim x float32


@pytest.fixture
def transport() -> str:
    return "tcp"


def test_receiver_killed_mid_transfer_fails_the_request(make_sender) -> None:
    parent, child = mp.get_context("fork").Pipe()
    process = mp.get_context("fork").Process(
        target=stalled_receiver, args=(child, "tcp"), daemon=True
    )
    process.start()
    try:
        address = parent.recv()
        payload = memoryview(bytearray(4 << 20))
        sender, done = make_sender(), Done()
        for layer in range(16):  # 128 MiB: far more than the socket buffers hold
            sender.send(address, "r", layer, [(BlockSpan(0, 0, 16), payload, payload)])
        sender.finish(address, "r", done.callback("r"))
        deadline = time.monotonic() + 5
        while sender.bytes_sent < (4 << 20) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the stalled receiver's buffers have filled up
        os.kill(process.pid, signal.SIGKILL)
        ok, num_frames, error = done.wait("r")
        assert not ok and num_frames < 16 and "failed" in error
    finally:
        process.kill()
        process.join()


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def handshaken(address: str) -> socket.socket:
    sock = connect(address)
    hello = sock.recv(HELLO.size, socket.MSG_WAITALL)
    assert HELLO.unpack(hello)[:3] == (MAGIC, VERSION, False)
    assert sock.recv(1) == b"\x01"
    return sock


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def kv_header(rid: bytes, num_spans: int, body: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, KIND_KV, len(rid), 0, num_spans, body) + rid


GARBAGE = {
    "bad magic": os.urandom(256),
    "unknown kind": HEADER.pack(MAGIC, VERSION, 99, 0, 0, 0, 0),
    "absurd span count": kv_header(b"x", MAX_SPANS + 1, 1 << 20),
    "absurd frame size": kv_header(b"x", 1, 1 << 40),
    "absurd span size": kv_header(b"x", 1, 1 + SPAN.size + 100) + SPAN.pack(0, 0, 4, 1 << 40, 0, 0),
    "body disagrees with spans": kv_header(b"x", 1, 1 + SPAN.size + 3)
    + SPAN.pack(0, 0, 4, SPAN_HALF_BYTES, 0, 0),
    "a ring offer of the wrong size": HEADER.pack(MAGIC, VERSION, KIND_RING, 0, 0, 0, 9) + bytes(9),
    "a ring offer inside a frame": HEADER.pack(MAGIC, VERSION, KIND_KV_MORE, 1, 0, 0, 1)
    + b"x"
    + HEADER.pack(MAGIC, VERSION, KIND_RING, 0, 0, 0, ring.OFFER.size)
    + bytes(ring.OFFER.size),
    "an ask where none is served": HEADER.pack(MAGIC, VERSION, KIND_ASK, 0, 0, 0, 3) + b"get",
    "an answer sent to a receiver": HEADER.pack(MAGIC, VERSION, KIND_ANSWER, 0, 0, 0, 3) + b"yes",
    "an ask with a request id": HEADER.pack(MAGIC, VERSION, KIND_ASK, 1, 0, 0, 4) + b"xget",
    "an absurd ask": HEADER.pack(MAGIC, VERSION, KIND_ASK, 0, 0, 0, 1 << 30),
    "blocks placed where none were asked for": placed.encode_placed("x", 3, 1536, 4, [(0, 0, 0)]),
    "a placed message with no blocks": HEADER.pack(MAGIC, VERSION, KIND_PLACED, 1, 0, 0, 13)
    + bytes(13),
}


@pytest.mark.parametrize("garbage", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_closes_only_its_connection(make_receiver, make_sender, garbage) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(sink)
    idle = handshaken(address)  # another sender's connection, which must survive
    connect(address).close()  # gone before the handshake
    bad = handshaken(address)
    bad.sendall(garbage)
    assert closed_by_peer(bad)

    done = send_request(make_sender(), address, source, "after", ONE_BLOCK, layers=[0])
    assert done.wait("after") == (True, 1, "")
    sink.wait_ends("after")
    assert [f[4] for f in sink.frames("after")] == [True]
    idle.sendall(kv_header(b"idle", 0, 4))  # an empty frame: the idle connection still works
    sink.wait_for(lambda: sink.frames("idle"))
    assert receiver.frames_received == 2


def test_truncated_frame_reports_its_request_lost(make_receiver) -> None:
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink)
    sock = handshaken(address)
    sock.sendall(
        kv_header(b"trunc", 1, 5 + SPAN.size + 2 * SPAN_HALF_BYTES)
        + SPAN.pack(0, 0, 4, SPAN_HALF_BYTES, 0, 0)
        + b"\x00" * 100
    )
    sock.close()
    sink.wait_for(lambda: any(e[0] == "lost" for e in sink.events))
    assert sink.events == [("lost", ("trunc",), "connection closed mid-frame")]
