"""What only the Mooncake transport does: destinations registered lazily, senders that leave
with places handed out, writes the engine refuses, a receiver that never places. The
scenarios both transports share run over it from test_roundtrip, test_integrity, test_faults
and test_auth (its `tcp` protocol, P2P handshake: no etcd, no RDMA NIC)."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time

import pytest
import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.common.frames import checked_frame
from shared.transfer.mooncake.control import (
    KIND_PLACES,
    answer_hello,
    encode_ask,
    read_header,
    read_places,
)
from shared.transfer.mooncake.engine import Engine
from tests.shared.transfer.sinks import (
    TWO_BLOCKS,
    RecordingSink,
    random_storage,
    send_request,
    source_spans,
)
from tests.shared.transfer.test_roundtrip import check_requests_land_byte_exact
from tests.shared.transfer.transports import needs_mooncake, stalled_receiver

pytestmark = needs_mooncake


@pytest.fixture
def transport() -> str:
    return "mooncake"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("part_bytes", [64, 1 << 20])  # a part per span, or one per frame
def test_destinations_registered_on_first_use_land_byte_exact(
    make_receiver, make_sender, dtype, part_bytes
) -> None:
    check_requests_land_byte_exact(make_receiver, make_sender, dtype, part_bytes, memory=())


def test_sender_gone_mid_frame_reports_its_request_lost(make_receiver) -> None:
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink, settle_s=0.05)
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        answer_hello(sock, None)
        frame = checked_frame("gone", 0, source_spans(random_storage(torch.float32), 0, TWO_BLOCKS))
        sock.sendall(encode_ask(frame))  # then goes silent once it has its places
        header = read_header(sock)
        assert header.kind == KIND_PLACES and all(p.accepted for p in read_places(sock, 2))
    sink.wait_for(lambda: any(e[0] == "lost" for e in sink.events))
    assert sink.events == [("lost", ("gone",), "connection closed mid-frame")]


def test_write_the_engine_refuses_fails_the_request(
    make_receiver, make_sender, monkeypatch
) -> None:
    """Places in memory the receiver's engine never registered: its engine rejects the write."""
    monkeypatch.setattr(Engine, "ensure_registered", lambda self, view: True)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink, memory=(), settle_s=0.05)
    done = send_request(make_sender(), address, random_storage(torch.float32), "r", TWO_BLOCKS)
    ok, num_frames, error = done.wait("r")
    assert (ok, num_frames) == (False, 0) and "transfer engine write" in error
    sink.wait_for(lambda: any(e[0] == "lost" for e in sink.events))
    assert sink.events == [("lost", ("r",), "connection closed mid-frame")]


def test_receiver_killed_mid_frame_fails_the_request(make_sender) -> None:
    context = mp.get_context("spawn")  # NOTE: not fork: this process runs engine threads
    parent, child = context.Pipe()
    process = context.Process(target=stalled_receiver, args=(child, "mooncake"), daemon=True)
    process.start()
    try:
        address = parent.recv()
        done = send_request(
            make_sender(), address, random_storage(torch.float32), "r", TWO_BLOCKS, layers=[0]
        )
        time.sleep(0.2)  # the sender now waits for places that never come
        process.kill()
        ok, num_frames, error = done.wait("r")
        assert (ok, num_frames) == (False, 0) and "no places" in error
    finally:
        process.kill()
        process.join()
