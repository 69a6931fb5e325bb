"""Peers that go away, come back, never answer or speak the other transport (over each
transport)."""

from __future__ import annotations

import socket
import time

import pytest
import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.base import BlockSpan
from tests.shared.transfer.sinks import (
    ONE_BLOCK,
    Done,
    RecordingSink,
    random_storage,
    send_request,
    source_spans,
)
from tests.shared.transfer.transports import OTHER, new_sender

TINY = [(BlockSpan(0, 0, 1), memoryview(b"k"), memoryview(b"v"))]


def test_unreachable_peer_fails_the_request(make_sender) -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        address = f"127.0.0.1:{placeholder.getsockname()[1]}"
    sender, done = make_sender(), Done()
    sender.send(address, "r", 0, TINY)
    sender.finish(address, "r", done.callback("r"))
    ok, num_frames, error = done.wait("r")
    assert (ok, num_frames) == (False, 0) and "cannot reach" in error


def test_stopping_the_receiver_reports_open_requests_lost(make_receiver, make_sender) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(sink)
    make_sender().send(address, "open", 0, source_spans(source, 0, ONE_BLOCK))
    sink.wait_for(lambda: sink.frames("open"))
    receiver.stop()
    sink.wait_for(lambda: any(e[0] == "lost" for e in sink.events))
    assert sink.events[-1][:2] == ("lost", ("open",))


def test_close_interrupts_a_silent_peer_and_fails_its_requests(make_sender) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never says HELLO
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        sender, done = make_sender(connect_timeout_s=30), Done()
        sender.send(address, "r", 0, TINY)
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
    """The new receiver may differ (a new engine session): the sender learns it anew."""
    source = random_storage(torch.float32)
    first = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(first)
    sender = make_sender()
    assert send_request(sender, address, source, "before", ONE_BLOCK).wait("before")[0]
    first.wait_ends("before")
    receiver.stop()

    second = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    make_receiver(second, port=int(address.rsplit(":", 1)[1]))
    done = send_request(sender, address, source, "after", ONE_BLOCK, layers=[0])
    assert done.wait("after") == (True, 1, "")
    second.wait_ends("after")
    assert [f[4] for f in second.frames("after")] == [True]


def test_sender_of_the_other_transport_is_refused(make_receiver, transport) -> None:
    """Each transport greets with its own magic; the sender fails before it sends a byte."""
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink)
    sender = new_sender(OTHER[transport])
    try:
        done = send_request(sender, address, random_storage(torch.float32), "r", ONE_BLOCK)
        ok, _, error = done.wait("r")
    finally:
        sender.close()
    assert not ok and "not a kvstack" in error
    assert sink.events == []
