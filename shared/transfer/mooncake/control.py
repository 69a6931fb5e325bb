"""The control channel: a TCP connection per sender and receiver pair that carries everything
but the KV bytes (see the package docstring for the exchange)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, overload

from shared.transfer.base import BlockSpan
from shared.transfer.common import handshake
from shared.transfer.common.frames import (
    MAX_HALF_BYTES,
    MAX_REQUEST_ID,
    Frame,
    ProtocolError,
    contiguous,
)
from shared.transfer.common.handshake import Greeting
from shared.transfer.common.sockets import recv_exact

MAGIC = 0x434D564B  # b"KVMC" read as little endian: not a kvstack TCP-transport peer
VERSION = 1
KIND_ASK, KIND_PLACES, KIND_LANDED, KIND_END, KIND_LANDED_MORE = 1, 2, 3, 4, 5
KINDS = (KIND_ASK, KIND_PLACES, KIND_LANDED, KIND_END, KIND_LANDED_MORE)
HEADER = struct.Struct("<IBHII")  # magic, kind, request-id length, layer, count
ASK_SPAN = struct.Struct("<IIIQQ")  # block id, offset, tokens, bytes per half, block hash
PLACE = struct.Struct("<QQ?")  # K address, V address at the receiver, accepted
CHECKSUM = struct.Struct("<Q")  # xxh3_64 of a span's K then V bytes, as the sender read them
SESSION = struct.Struct("<H")  # length of the receiver's Transfer Engine session name
MAX_SPANS = 1 << 20  # per frame; frames are never split into parts here
GREETING = Greeting(MAGIC, VERSION, f"kvstack mooncake v{VERSION}")


@dataclass(frozen=True, slots=True)
class Header:
    kind: int
    request_id: str
    layer: int
    count: int


@dataclass(frozen=True, slots=True)
class Place:
    """Where one span's K and V go in the receiver's memory, or that it was refused."""

    k_address: int = 0
    v_address: int = 0
    accepted: bool = False


REFUSE = Place()


# --- handshake ------------------------------------------------------------------------------


def challenge(sock: socket.socket, token: str | None, session: str) -> None:
    """Receiver side: check the sender's proof, then tell it the engine session to write to
    (only an accepted sender learns it)."""
    name = session.encode()
    handshake.challenge(sock, token, GREETING, SESSION.pack(len(name)) + name)


def answer_hello(sock: socket.socket, token: str | None) -> str:
    """Sender side; returns the receiver's engine session, or raises AuthenticationError."""
    handshake.answer_hello(sock, token, GREETING)
    (length,) = SESSION.unpack(recv_exact(sock, SESSION.size))
    return recv_exact(sock, length).decode()


# --- messages -------------------------------------------------------------------------------


def _header(kind: int, request_id: str, layer: int, count: int) -> bytes:
    rid = request_id.encode()
    return HEADER.pack(MAGIC, kind, len(rid), layer, count) + rid


def encode_ask(frame: Frame) -> bytes:
    table = [
        ASK_SPAN.pack(s.block_id, s.offset, s.num_tokens, k.nbytes, s.block_hash)
        for s, k, _ in contiguous(frame)
    ]
    return _header(KIND_ASK, frame.request_id, frame.layer, len(frame.spans)) + b"".join(table)


def encode_places(layer: int, places: Sequence[Place]) -> bytes:
    table = [PLACE.pack(p.k_address, p.v_address, p.accepted) for p in places]
    return _header(KIND_PLACES, "", layer, len(places)) + b"".join(table)


def encode_landed(frame: Frame, checksums: Sequence[int], last: bool = True) -> bytes:
    """Checksums of the frame's next `len(checksums)` spans; the last part ends the frame."""
    kind = KIND_LANDED if last else KIND_LANDED_MORE
    table = [CHECKSUM.pack(c) for c in checksums]
    return _header(kind, frame.request_id, frame.layer, len(checksums)) + b"".join(table)


def encode_end(request_id: str, num_frames: int) -> bytes:
    return _header(KIND_END, request_id, 0, num_frames)


@overload
def read_header(sock: socket.socket, eof_ok: Literal[False] = False) -> Header: ...


@overload
def read_header(sock: socket.socket, eof_ok: bool) -> Header | None: ...


def read_header(sock: socket.socket, eof_ok: bool = False) -> Header | None:
    """The next message's header and request id; None at a clean close (if `eof_ok`)."""
    raw = recv_exact(sock, HEADER.size, eof_ok)
    if raw is None:
        return None
    magic, kind, rid_len, layer, count = HEADER.unpack(raw)
    if (
        magic != MAGIC
        or kind not in KINDS
        or rid_len > MAX_REQUEST_ID
        or (kind != KIND_END and count > MAX_SPANS)
    ):
        raise ProtocolError(f"bad control message {raw.hex()}")
    request_id = recv_exact(sock, rid_len).decode(errors="replace") if rid_len else ""
    return Header(kind, request_id, layer, count)


def read_ask(sock: socket.socket, count: int) -> list[tuple[BlockSpan, int]]:
    """(span, bytes per half) of each span the sender asks a place for."""
    asked = []
    for block_id, offset, num_tokens, nbytes, block_hash in ASK_SPAN.iter_unpack(
        recv_exact(sock, count * ASK_SPAN.size)
    ):
        if nbytes > MAX_HALF_BYTES:
            raise ProtocolError(f"span of {nbytes} bytes per half")
        asked.append((BlockSpan(block_id, offset, num_tokens, block_hash), nbytes))
    return asked


def read_places(sock: socket.socket, count: int) -> list[Place]:
    return [Place(*fields) for fields in PLACE.iter_unpack(recv_exact(sock, count * PLACE.size))]


def read_checksums(sock: socket.socket, count: int) -> list[int]:
    return [c for (c,) in CHECKSUM.iter_unpack(recv_exact(sock, count * CHECKSUM.size))]
