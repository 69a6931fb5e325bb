"""Asks on the data connection, the answering side: a peer that dialed a receiver (a
worker dialing a kvstore) asks it for something in the bus's own message encoding (a
get of blocks, slots for a put), and the receiver answers on the same connection: a
get's frames follow the answer, a put's follow it from the asker. Neither costs a bus
round trip or a second connection, and a get's bytes come back on the socket the
question went out on, straight into the asker's KV.

    asker -> receiver   ASK      body: the question (shared/codec)
    receiver -> asker   ANSWER   body: the reply; `count` 1: the request's KV frames and
                                 its END follow on this connection, 0: nothing follows
    asker -> receiver   KV..END  what the reply asked for, if anything (a put's blocks,
                                 into the slots the reply named)

On one host a get's frames may be replaced by one PLACED message that says where the
blocks lie in the kvstore's shared memory (`placed`); the asker answers DONE once it has
copied them out.

A receiver answers only when it has an `AskServer`, and never under encryption (askers
that encrypt ask over the bus).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from shared.transfer.common.frames import Frame, ProtocolError
from shared.transfer.common.sockets import recv_exact
from shared.transfer.tcp import placed, ring
from shared.transfer.tcp.sockets import send_all
from shared.transfer.tcp.wire import (
    HEADER,
    KIND_ANSWER,
    encode_end,
    encode_note,
    parts_of,
    unpack_layers,
)


@dataclass(frozen=True)
class Answer:
    """A reply, and the frames of `request_id` that follow it (none without a request id),
    made one at a time as they go, so the reply leaves before any is made; `done(ok)` runs
    once they are all out (ok) or the connection failed (not ok)."""

    reply: bytes
    request_id: str = ""
    frames: Iterable[Frame] = ()
    done: Callable[[bool], None] = lambda ok: None
    # same host: a PLACED message that stands for `frames`, for an asker that mapped the
    # answering side's arena (`placed`); empty: the frames go
    placed: bytes = b""


class AskServer(Protocol):
    def answer(self, question: bytes) -> Answer:
        """The answer to one ask (on the receiver's connection thread: it may block)."""

    def arena(self) -> placed.ArenaOffer | None:
        """Where its blocks lie in shared memory, for askers on this host (`placed`)."""


def write_answer(
    sock: socket.socket,
    answer: Answer,
    shared: ring.RingWriter | None = None,
    arena_mapped: bool = False,
) -> None:
    """The answer, then its frames and their END: their payload through the asker's ring
    where it offered one (`shared`), and then every placed part read by the asker before
    anything else is read from it. Where the asker mapped this side's arena and the
    answer has a PLACED message, that goes instead of the frames, and the answer is done
    once the asker said DONE."""
    ok = False
    try:
        note = encode_note(KIND_ANSWER, answer.reply, bool(answer.request_id))
        if answer.placed and arena_mapped:
            _write_placed(sock, note, answer)
        else:
            send_all(sock, note)
            if answer.request_id:
                write_frames(sock, answer.request_id, answer.frames, shared)
                if shared is not None:
                    shared.settle(sock)
        ok = True
    finally:
        answer.done(ok)


def _write_placed(sock: socket.socket, note: list[memoryview], answer: Answer) -> None:
    """The answer, its PLACED message and its END at once (the END counts a frame a layer),
    then the asker's DONE: its copy is over, so the blocks may be unpinned."""
    num_layers = len(unpack_layers(HEADER.unpack_from(answer.placed)[4]))
    end = encode_end(answer.request_id, num_layers)
    send_all(sock, [*note, memoryview(answer.placed), *end])
    if recv_exact(sock, 1) != placed.DONE:
        raise ProtocolError("a PLACED get not answered DONE")


def write_frames(
    sock: socket.socket,
    request_id: str,
    frames: Iterable[Frame],
    shared: ring.RingWriter | None = None,
) -> None:
    """A request's frames, hashed a part at a time right before it goes, then its END."""
    num_frames = 0
    for frame in frames:
        for part in parts_of(frame):
            send_all(sock, ring.wire_part(sock, shared, part))
        num_frames += frame.layers  # as the reader counts them
    send_all(sock, encode_end(request_id, num_frames))
