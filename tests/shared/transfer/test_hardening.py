"""A receiver's limits against peers that misbehave: intruders and malformed or stalled peers
are dropped while other transfers carry on, the connection cap refuses one connection too
many, and idle connections close without failing the next request (real sockets throughout;
the tests that speak the TCP wire themselves run over that transport only)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.common.frames import checked_frame
from shared.transfer.common.handshake import ACCEPTED, HELLO, REFUSED, proof_of
from shared.transfer.common.limits import ConnectionLimits
from shared.transfer.tcp.wire import KIND_KV, KIND_KV_MORE, encode_end, encode_part
from tests.shared.transfer.sinks import (
    MOVES,
    ONE_BLOCK,
    WAIT_S,
    RecordingSink,
    random_storage,
    send_request,
    source_spans,
)

TOKEN = "s3cret-token-for-kv"
SHORT_S = 0.4  # every timeout under test; the rest stay long so that only this one can fire


class GatedSink(RecordingSink):
    """Holds the first destination of request `held` until `gate` opens, so that its transfer
    is in progress (mid-frame) meanwhile."""

    def __init__(self, held: str) -> None:
        super().__init__(KVStorage(3, 8, 4, 2, 8))
        self.held = held
        self.entered, self.gate = threading.Event(), threading.Event()

    def destination(self, request_id, *args):
        if request_id == self.held and not self.gate.is_set():
            self.entered.set()
            self.gate.wait(WAIT_S)
        return super().destination(request_id, *args)


# --- a raw peer -----------------------------------------------------------------------------


def connect(address: str, source: str = "") -> socket.socket:
    """A connection to `address`, from the local address `source` if given."""
    host, port = address.rsplit(":", 1)
    source_address = (source, 0) if source else None
    return socket.create_connection((host, int(port)), WAIT_S, source_address)


def authenticated(address: str, token: str | None = None, source: str = "") -> socket.socket:
    sock = connect(address, source)
    *_, auth_required, nonce = HELLO.unpack(sock.recv(HELLO.size, socket.MSG_WAITALL))
    if auth_required:
        sock.sendall(proof_of(token, nonce))
    assert sock.recv(1) == ACCEPTED
    return sock


def until_closed(sock: socket.socket, since: float | None = None) -> tuple[float, bytes]:
    """Seconds from `since` (default now) until the receiver closed `sock`, and what it
    sent meanwhile."""
    start, received = since or time.monotonic(), b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except ConnectionResetError:
        pass
    sock.close()
    return time.monotonic() - start, received


def wait_until(predicate, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def kv_part(kind: int, request_id: str, source: KVStorage) -> bytes:
    spans = checked_frame(request_id, 0, source_spans(source, 0, ONE_BLOCK)).spans
    return b"".join(bytes(b) for b in encode_part(kind, request_id.encode(), 0, spans))


# --- intruders and malformed peers ----------------------------------------------------------


def held_transfer(make_receiver, make_sender, source: KVStorage, **options):
    """A transfer of req-a held mid-frame by the sink: (sink, receiver, address, its Done)."""
    sink = GatedSink("req-a")
    receiver, address = make_receiver(sink, **options)
    done = send_request(make_sender(**options), address, source, "req-a", MOVES["req-a"])
    assert sink.entered.wait(WAIT_S)
    return sink, receiver, address, done


def assert_landed_intact(sink: RecordingSink, done, source: KVStorage) -> None:
    sink.gate.set()
    assert done.wait("req-a") == (True, 3, "")
    sink.wait_ends("req-a")
    assert [f[4] for f in sink.frames("req-a")] == [True] * 3
    for src, span in MOVES["req-a"]:
        tokens = slice(span.offset, span.offset + span.num_tokens)
        assert torch.equal(
            sink.storage.kv[:, :, span.block_id, tokens], source.kv[:, :, src, tokens]
        )


def test_peers_without_the_secret_are_refused_while_a_transfer_completes(
    make_receiver, make_sender
) -> None:
    source = random_storage(torch.float32)
    sink, receiver, address, done = held_transfer(
        make_receiver, make_sender, source, auth_token=TOKEN
    )
    for token in ("wrong-token", None):
        refused = send_request(
            make_sender(auth_token=token), address, source, "intruder", ONE_BLOCK
        ).wait("intruder")
        assert not refused[0] and "authentication failed" in refused[2]
    garbage = connect(address)
    garbage.sendall(os.urandom(32))  # a proof that is not one
    assert until_closed(garbage)[1][HELLO.size :] == REFUSED
    assert_landed_intact(sink, done, source)
    assert {e[1] for e in sink.events if e[0] in ("frame", "end")} == {"req-a"}
    assert not any(e[0] == "lost" for e in sink.events)
    assert receiver.frames_rejected == 0


@pytest.mark.parametrize("transport", ["tcp"])
def test_half_written_frame_of_a_malformed_peer_is_discarded(make_receiver, make_sender) -> None:
    """An authenticated peer's frame that turns to garbage halfway is never reported, its
    request is lost, and a transfer in progress on another connection lands intact."""
    source = random_storage(torch.float32)
    sink, _, address, done = held_transfer(make_receiver, make_sender, source, auth_token=TOKEN)
    peer = authenticated(address, TOKEN)
    peer.sendall(kv_part(KIND_KV_MORE, "torn", source) + os.urandom(64))
    until_closed(peer)
    sink.wait_for(lambda: any(e[0] == "lost" for e in sink.events))
    others = [e for e in sink.events if e[1] != "req-a"]
    assert [e[:2] for e in others] == [("lost", ("torn",))]  # never a frame of "torn"
    assert "bad frame header" in others[0][2]
    assert_landed_intact(sink, done, source)


# --- timeouts --------------------------------------------------------------------------------


def short(**timeouts: float) -> ConnectionLimits:
    """SHORT_S for the timeouts named, long ones for the rest."""
    return ConnectionLimits(
        **{"handshake_timeout_s": 30.0, "read_timeout_s": 30.0, "idle_timeout_s": 30.0, **timeouts}
    )


def assert_cut_after_timeout(sock: socket.socket, since: float | None = None) -> bytes:
    elapsed, received = until_closed(sock, since)
    assert SHORT_S * 0.9 <= elapsed < SHORT_S + 2.0
    return received


def send_proof_slowly(sock: socket.socket) -> None:
    """A byte of a proof every tenth of a second: each read gets data, the whole never ends."""
    try:
        for byte in os.urandom(32):
            sock.send(bytes([byte]))
            time.sleep(0.1)
    except OSError:
        pass  # cut off


STALLS = {
    "silent": lambda sock: None,
    "half a proof": lambda sock: sock.sendall(os.urandom(16)),
    "a proof dripping in": lambda sock: threading.Thread(
        target=send_proof_slowly, args=(sock,), daemon=True
    ).start(),
}


@pytest.mark.parametrize("stall", STALLS.values(), ids=STALLS.keys())
def test_peer_stalling_in_the_handshake_is_cut_and_others_carry_on(
    make_receiver, make_sender, stall
) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(
        sink, auth_token=TOKEN, limits=short(handshake_timeout_s=SHORT_S)
    )
    sender = make_sender(auth_token=TOKEN)
    assert send_request(sender, address, source, "before", ONE_BLOCK).wait("before")[0]
    staller = connect(address)
    stall(staller)
    assert len(assert_cut_after_timeout(staller)) == HELLO.size  # a HELLO, never a verdict
    assert send_request(sender, address, source, "after", ONE_BLOCK).wait("after") == (True, 3, "")
    sink.wait_ends("before", "after")
    assert receiver.connections_accepted == 2  # the sender's connection lived on
    assert not any(e[0] == "lost" for e in sink.events)


def stalled_frames(source: KVStorage) -> dict[str, bytes]:
    whole = kv_part(KIND_KV, "stall", source)
    return {
        "mid-header": whole[:5],
        "mid-payload": whole[:-100],
        "between parts": kv_part(KIND_KV_MORE, "stall", source),
    }


@pytest.mark.parametrize("transport", ["tcp"])
@pytest.mark.parametrize("where", ["mid-header", "mid-payload", "between parts"])
def test_peer_stalling_mid_frame_is_cut_and_its_request_lost(
    make_receiver, make_sender, where
) -> None:
    """The read timeout, not the (long) idle timeout, applies once a frame has begun."""
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink, limits=short(read_timeout_s=SHORT_S))
    staller = authenticated(address)
    staller.sendall(stalled_frames(source)[where])
    assert_cut_after_timeout(staller)
    lost = [] if where == "mid-header" else [("lost", ("stall",), "no bytes for 0.4 s mid-message")]
    sink.wait_for(lambda: len(sink.events) == len(lost))
    assert sink.events == lost  # never a frame: what had landed is not reported
    assert send_request(make_sender(), address, source, "after", ONE_BLOCK).wait("after") == (
        True,
        3,
        "",
    )


@pytest.mark.parametrize("transport", ["tcp"])
def test_idle_connections_close_and_report_unfinished_requests_lost(make_receiver) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(sink, limits=short(idle_timeout_s=SHORT_S))
    since = time.monotonic()
    quiet, unfinished = authenticated(address), authenticated(address)
    unfinished.sendall(kv_part(KIND_KV, "open", source))  # a whole frame, never its END
    assert_cut_after_timeout(quiet, since)
    assert_cut_after_timeout(unfinished, since)
    sink.wait_for(lambda: len(sink.events) == 2)
    assert [e[0] for e in sink.events] == ["frame", "lost"]
    assert sink.events[1] == ("lost", ("open",), "idle for 0.4 s")
    wait_until(lambda: receiver.open_connections == 0)


# --- the connection cap ----------------------------------------------------------------------


def test_connection_over_the_cap_is_refused_and_the_others_keep_working(
    make_receiver, make_sender, caplog
) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(sink, limits=ConnectionLimits(max_connections=2))
    first, second, third = make_sender(), make_sender(), make_sender()
    for sender, rid in ((first, "first"), (second, "second")):
        assert send_request(sender, address, source, rid, ONE_BLOCK).wait(rid)[0]

    assert until_closed(connect(address))[1] == b""  # closed at once: not even a HELLO
    ok, _, error = send_request(third, address, source, "third", ONE_BLOCK).wait("third")
    assert not ok and "before its HELLO" in error
    assert receiver.connections_refused == 2
    assert len([r for r in caplog.records if "refused a connection" in r.message]) == 1
    for sender, rid in ((first, "first again"), (second, "second again")):
        assert send_request(sender, address, source, rid, ONE_BLOCK).wait(rid) == (True, 3, "")
    assert receiver.connections_accepted == receiver.open_connections == 2

    second.close()  # frees a place
    wait_until(lambda: receiver.open_connections == 1)
    assert send_request(third, address, source, "third again", ONE_BLOCK).wait("third again") == (
        True,
        3,
        "",
    )
    sink.wait_ends("first", "second", "first again", "second again", "third again")
    assert not any(e[0] == "lost" or e[1] == "third" for e in sink.events)


@pytest.mark.parametrize("transport", ["tcp"])
def test_connection_over_the_per_peer_cap_is_refused_while_another_address_connects(
    make_receiver, make_sender, caplog
) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    limits = ConnectionLimits(max_connections_per_peer=2)
    receiver, address = make_receiver(sink, limits=limits)
    first, second = make_sender(), make_sender()  # both from 127.0.0.1
    for sender, rid in ((first, "first"), (second, "second")):
        assert send_request(sender, address, source, rid, ONE_BLOCK).wait(rid)[0]

    assert until_closed(connect(address))[1] == b""  # a third from 127.0.0.1: not even a HELLO
    other = authenticated(address, source="127.0.0.2")  # loopback takes any 127/8 source
    other.sendall(kv_part(KIND_KV, "other", source) + bytes(encode_end("other", 1)[0]))
    sink.wait_ends("first", "second", "other")
    assert [f[4] for f in sink.frames("other")] == [True]
    assert receiver.connections_refused_per_peer == receiver.connections_refused == 1
    assert len([r for r in caplog.records if "(max_connections_per_peer)" in r.message]) == 1

    second.close()  # frees a place of 127.0.0.1's
    wait_until(lambda: receiver.open_connections == 2)
    assert send_request(make_sender(), address, source, "third", ONE_BLOCK).wait("third")[0]
    other.close()


# --- idle connections, seen from the sender ---------------------------------------------------


def test_sender_reconnects_after_the_receiver_closed_its_idle_connection(
    make_receiver, make_sender
) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(sink, limits=short(idle_timeout_s=SHORT_S))
    sender = make_sender()
    assert send_request(sender, address, source, "before", ONE_BLOCK).wait("before")[0]
    sink.wait_ends("before")
    wait_until(lambda: receiver.open_connections == 0)  # the receiver closed it, idle

    done = send_request(sender, address, source, "after", MOVES["req-a"])
    assert done.wait("after") == (True, 3, "")
    sink.wait_ends("after")
    assert [f[4] for f in sink.frames("after")] == [True] * 3
    assert receiver.connections_accepted == 2
    assert not any(e[0] == "lost" for e in sink.events)


def test_sender_retires_a_connection_idle_for_max_idle_s(make_receiver, make_sender) -> None:
    """Before the receiver's idle timeout, so it never writes into one being closed."""
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(sink)
    sender = make_sender(max_idle_s=0.2)
    assert send_request(sender, address, source, "first", ONE_BLOCK).wait("first")[0]
    assert send_request(sender, address, source, "at once", ONE_BLOCK).wait("at once")[0]
    assert receiver.connections_accepted == 1
    time.sleep(0.3)
    assert send_request(sender, address, source, "later", ONE_BLOCK).wait("later") == (True, 3, "")
    assert receiver.connections_accepted == 2
    wait_until(lambda: receiver.open_connections == 1)  # the retired one is gone
