"""Same host: KV payload through a ring in shared memory. It lands byte-exact (the ring
wrapping around many times), the socket carries no payload byte, a damaged byte in the ring
is a bad frame, a ring the receiver cannot see or that is not the sender's is refused (then
the socket carries the payload), and a receiver that dies leaves no request hanging."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.tcp import TcpKVReceiver, TcpKVSender, ring
from tests.shared.transfer.proxy import FlipProxy
from tests.shared.transfer.sinks import (
    MOVES,
    TWO_BLOCKS,
    Done,
    RecordingSink,
    random_storage,
    send_request,
    source_spans,
)
from tests.shared.transfer.test_roundtrip import as_ints
from tests.shared.transfer.transports import damage_first_placed_part, stalled_receiver

needs_shm = pytest.mark.skipif(not os.path.isdir(ring.SHM_DIR), reason="no /dev/shm here")
pytestmark = needs_shm


@pytest.fixture
def pair():
    """`pair(sink, shared_memory, **sender_options)`: a receiver for `sink` (taking rings or
    not) and a sender, both stopped after."""
    made = []

    def make(sink, shared_memory=True, **options):
        receiver = TcpKVReceiver(sink, host="127.0.0.1", shared_memory=shared_memory)
        sender = TcpKVSender(**options)
        made.append((receiver, sender))
        return receiver, sender, receiver.start()

    yield make
    for receiver, sender in made:
        sender.close()
        receiver.stop()


def _rings() -> set[str]:
    return {name for name in os.listdir(ring.SHM_DIR) if name.startswith("kvstack-ring-")}


def _lands_exactly(sink: RecordingSink, source: KVStorage, rid: str, moves) -> None:
    for src, span in moves:
        tokens = slice(span.offset, span.offset + span.num_tokens)
        assert torch.equal(
            as_ints(sink.storage.kv[:, :, span.block_id, tokens]),
            as_ints(source.kv[:, :, src, tokens]),
        )
    assert all(frame[4] for frame in sink.frames(rid)), sink.frames(rid)


def test_many_requests_land_byte_exact_through_a_ring_that_wraps(pair, monkeypatch) -> None:
    monkeypatch.setattr(ring, "RING_BYTES", 4096)  # a few parts fill it: it wraps
    before = _rings()
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, sender, address = pair(sink, part_bytes=64)
    proxy = FlipProxy(address)  # flips nothing: it only counts what the socket carried
    done = Done()
    for round_ in range(20):
        for rid, moves in MOVES.items():
            for layer in range(3):
                sender.send(
                    proxy.address, f"{rid}-{round_}", layer, source_spans(source, layer, moves)
                )
            sender.finish(proxy.address, f"{rid}-{round_}", done.callback(f"{rid}-{round_}"))
    rids = [f"{rid}-{round_}" for round_ in range(20) for rid in MOVES]
    sink.wait_ends(*rids)
    for rid in rids:
        assert done.wait(rid) == (True, 3, "")
        _lands_exactly(sink, source, rid, MOVES[rid.rsplit("-", 1)[0]])
    assert receiver.bytes_received == sender.bytes_sent > 10 * 4096
    assert len(proxy.sent) < sender.bytes_sent / 4  # headers and span tables only
    assert _rings() == before  # the file went at once; the mappings hold the ring
    proxy.close()


def test_a_part_bigger_than_half_the_ring_goes_over_the_socket(pair, monkeypatch) -> None:
    monkeypatch.setattr(ring, "RING_BYTES", 512)
    _lands_over_the_socket(pair)


def test_a_byte_damaged_in_the_ring_is_a_bad_frame(pair, monkeypatch) -> None:
    damage_first_placed_part(monkeypatch)
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, sender, address = pair(sink)
    done = send_request(sender, address, source, "req", TWO_BLOCKS)
    sink.wait_ends("req")
    assert [f[4] for f in sink.frames("req")] == [False, True, True]
    assert sink.frames("req")[0][5] == "checksum mismatch"
    assert receiver.frames_rejected == 1 and done.wait("req") == (True, 3, "")


@pytest.mark.parametrize(
    "why",
    ["another host", "a foreign file", "another size"],
)
def test_a_ring_the_receiver_cannot_trust_is_refused_and_the_socket_carries_kv(
    pair, monkeypatch, why
) -> None:
    real_open = ring._open
    if why == "another host":  # its /dev/shm holds no such file
        monkeypatch.setattr(ring, "_open", lambda name, cookie, size: None)
    elif why == "a foreign file":  # the same name, not the sender's cookie in it
        monkeypatch.setattr(
            ring, "_open", lambda name, cookie, size: real_open(name, bytes(16), size)
        )
    else:
        monkeypatch.setattr(
            ring, "_open", lambda name, cookie, size: real_open(name, cookie, size + 4096)
        )
    _lands_over_the_socket(pair)


def test_an_encrypting_sender_offers_no_ring(monkeypatch) -> None:
    offered = []
    monkeypatch.setattr(ring, "offer", lambda *args: offered.append(args))
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver = TcpKVReceiver(sink, host="127.0.0.1", auth_token="t" * 32, encrypt=True)
    sender = TcpKVSender(auth_token="t" * 32, encrypt=True)
    try:
        done = send_request(sender, receiver.start(), source, "req", TWO_BLOCKS)
        sink.wait_ends("req")
        assert done.wait("req") == (True, 3, "")
        _lands_exactly(sink, source, "req", TWO_BLOCKS)
    finally:
        sender.close()
        receiver.stop()
    assert offered == []


def test_a_receiver_killed_while_the_sender_waits_for_room_fails_the_request(
    monkeypatch,
) -> None:
    """The receiver takes the ring, then never reads (its sink stalls): the sender fills the
    ring and waits for room; SIGKILL of the receiver ends that wait with an error."""
    monkeypatch.setattr(ring, "RING_BYTES", 2048)  # 4 of the request's 6 parts fill it
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=stalled_receiver, args=(child, "tcp"), daemon=True)
    process.start()
    address = parent.recv()
    source = random_storage(torch.float32)
    sender = TcpKVSender(part_bytes=64)
    try:
        done = send_request(sender, address, source, "stuck", TWO_BLOCKS)
        deadline = time.monotonic() + 10
        while sender.bytes_sent < 2048 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert sender.bytes_sent == 2048 and "stuck" not in done.results  # waiting for room
        os.kill(process.pid, signal.SIGKILL)
        ok, _, error = done.wait("stuck")
        assert not ok and error, error
    finally:
        sender.close()
        process.join(10)


def test_only_the_senders_own_regular_file_opens_as_its_ring() -> None:
    cookie = bytes(range(16))
    real, link, fifo = (ring._new_name() for _ in range(3))
    mapping = ring._create(ring._path(real), cookie, ring.RING_BYTES)
    assert mapping is not None
    try:
        os.symlink(ring._path(real), ring._path(link))
        os.mkfifo(ring._path(fifo), 0o600)
        assert ring._open(link, cookie, ring.RING_BYTES) is None  # a link: not followed
        assert ring._open(fifo, cookie, ring.RING_BYTES) is None  # not a regular file
        assert ring._open(real, bytes(16), ring.RING_BYTES) is None  # another cookie
        opened = ring._open(real, cookie, ring.RING_BYTES)
        assert opened is not None
        opened.close()
    finally:
        mapping.close()
        for name in (real, link, fifo):
            ring._unlink(ring._path(name))


def test_a_receiver_that_takes_no_rings_gets_the_kv_over_the_socket(pair) -> None:
    _lands_over_the_socket(pair, shared_memory=False)


def _lands_over_the_socket(pair, **receiver_options) -> None:
    """A request lands byte-exact with every payload byte over the socket (none in a ring)."""
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, sender, address = pair(sink, **receiver_options)
    proxy = FlipProxy(address)
    try:
        done = send_request(sender, proxy.address, source, "req", TWO_BLOCKS)
        sink.wait_ends("req")
        assert done.wait("req") == (True, 3, "")
        _lands_exactly(sink, source, "req", TWO_BLOCKS)
        assert len(proxy.sent) > sender.bytes_sent
    finally:
        proxy.close()


def test_a_ring_file_left_by_a_dead_sender_is_swept_and_a_live_ones_is_not() -> None:
    """A sender killed between making its file and the answer leaves the file behind; the
    next offer on this host removes it (a live process's file stays)."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = f"{int(gone.stdout)}-{'0' * 32}".encode()
    live = ring._new_name()
    for name in (dead, live):
        with open(ring._path(name), "wb") as f:
            f.write(bytes(64))
    try:
        ring.sweep()
        assert not os.path.exists(ring._path(dead)) and os.path.exists(ring._path(live))
    finally:
        for name in (dead, live):
            ring._unlink(ring._path(name))
