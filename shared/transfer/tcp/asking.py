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

A receiver answers only when it has an `AskServer`, and never under encryption (askers
that encrypt ask over the bus).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from shared.transfer.common.frames import Frame
from shared.transfer.tcp import ring
from shared.transfer.tcp.sockets import send_all
from shared.transfer.tcp.wire import KIND_ANSWER, encode_end, encode_note, parts_of


@dataclass(frozen=True)
class Answer:
    """A reply, and the frames of `request_id` that follow it (none without a request id),
    made one at a time as they go, so the reply leaves before any is made; `done(ok)` runs
    once they are all out (ok) or the connection failed (not ok)."""

    reply: bytes
    request_id: str = ""
    frames: Iterable[Frame] = ()
    done: Callable[[bool], None] = lambda ok: None


class AskServer(Protocol):
    def answer(self, question: bytes) -> Answer:
        """The answer to one ask (on the receiver's connection thread: it may block)."""


def write_answer(
    sock: socket.socket, answer: Answer, shared: ring.RingWriter | None = None
) -> None:
    """The answer, then its frames and their END: their payload through the asker's ring
    where it offered one (`shared`), and then every placed part read by the asker before
    anything else is read from it."""
    ok = False
    try:
        send_all(sock, encode_note(KIND_ANSWER, answer.reply, bool(answer.request_id)))
        if answer.request_id:
            write_frames(sock, answer.request_id, answer.frames, shared)
            if shared is not None:
                shared.settle(sock)
        ok = True
    finally:
        answer.done(ok)


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
