"""Scatter/gather I/O: partial sends, more buffers than IOV_MAX, many tiny spans per frame."""

from __future__ import annotations

import os
import socket
import threading

import pytest
import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.base import BlockSpan
from shared.transfer.tcp import IOV_MAX, send_all
from tests.shared.transfer.sinks import Done, RecordingSink, random_storage, source_spans


@pytest.fixture
def transport() -> str:
    return "tcp"


def test_send_all_survives_partial_sends_and_iov_max() -> None:
    chunks = [os.urandom(1 + (i * 7919) % 9000) for i in range(3 * IOV_MAX)]
    expected = b"".join(chunks)
    left, right = socket.socketpair()
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # forces partial sendmsg
    received = bytearray()

    def read() -> None:
        while len(received) < len(expected):
            received.extend(right.recv(1 << 12))

    reader = threading.Thread(target=read)
    reader.start()
    send_all(left, [memoryview(c) for c in chunks])
    reader.join(timeout=10)
    left.close()
    right.close()
    assert bytes(received) == expected


def test_frame_of_more_spans_than_iov_max(make_receiver, make_sender) -> None:
    num_blocks = IOV_MAX // 2  # 4 one-token spans per block: 2 * IOV_MAX spans, 4 * IOV_MAX views
    source = random_storage(torch.bfloat16, num_blocks=num_blocks)
    sink = RecordingSink(KVStorage(3, num_blocks, 4, 2, 8, torch.bfloat16))
    _, address = make_receiver(sink)
    moves = [(num_blocks - 1 - b, BlockSpan(b, t, 1)) for b in range(num_blocks) for t in range(4)]
    sender, done = make_sender(part_bytes=1 << 30), Done()
    sender.send(address, "r", 2, source_spans(source, 2, moves))
    sender.finish(address, "r", done.callback("r"))
    assert done.wait("r") == (True, 1, "")
    sink.wait_ends("r")
    assert [f[4] for f in sink.frames("r")] == [True]
    assert torch.equal(sink.storage.kv[2].view(torch.int16), source.kv[2].flip(1).view(torch.int16))
