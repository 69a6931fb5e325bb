"""The sending side: frames go over the peer's connection itself, in wire parts hashed just
before they are sent."""

from __future__ import annotations

import socket

from shared.transfer.common.encryption import SealingKey, require_token
from shared.transfer.common.frames import Frame
from shared.transfer.common.handshake import answer_hello
from shared.transfer.common.sender import MAX_IDLE_S, ChannelSender, PeerChannel
from shared.transfer.common.sockets import tune
from shared.transfer.tcp import ring
from shared.transfer.tcp.sealing import Sealer
from shared.transfer.tcp.sockets import SOCKET_BUFFER_BYTES, send_all
from shared.transfer.tcp.wire import (
    GREETING,
    PART_BYTES,
    Part,
    encode_end,
    encode_ring_offer,
    parts_of,
)


class _PeerChannel(PeerChannel[Part | list[memoryview]]):
    """Writes a frame's wire parts, then counts it; a request's count starts at its first
    frame sent whole."""

    sender: TcpKVSender
    sealer: Sealer | None = None  # under encryption: the current connection's
    ring: ring.RingWriter | None = None  # same host: the current connection's shared memory

    def _send_frame(self, frame: Frame) -> None:
        rid = frame.request_id
        if rid in self.errors or not self._connect(rid):
            return
        for part in parts_of(frame, self.sender.part_bytes):
            if not self._write(rid, part):
                return
            self.sender.counters.add(bytes=part.payload_bytes)
        self.frames[rid] = self.frames.get(rid, 0) + frame.layers  # as the receiver counts
        self.sender.counters.add(frames=frame.layers)

    def _encode_end(self, request_id: str, num_frames: int) -> list[memoryview]:
        return encode_end(request_id, num_frames)

    def _handshake(self, sock: socket.socket) -> None:
        key = self.sender.prepare(sock)
        self.sealer = None if key is None else Sealer(key)
        if key is None and self.sender.shared_memory:
            sock.settimeout(self.sender.connect_timeout_s)
            self.ring = ring.offer(sock, encode_ring_offer(ring.OFFER.size))
            sock.settimeout(None)

    def _transmit(self, data: Part | list[memoryview]) -> None:
        sock = self._connected()
        if isinstance(data, Part):
            data = self._encoded(sock, data)
        if self.sealer is None:
            send_all(sock, data)
        else:
            self.sealer.send(sock, data)

    def _encoded(self, sock: socket.socket, part: Part) -> list[memoryview]:
        return ring.wire_part(sock, self.ring, part)

    def _stale(self) -> bool:
        """The receiver answers on a ring's connection: an answer is not a close."""
        if self.ring is None:
            return super()._stale()
        return self._idle_too_long() or (self.sock is not None and not self.ring.drained(self.sock))

    def _close_socket(self) -> None:
        super()._close_socket()
        if self.ring is not None:
            self.ring.close()
            self.ring = None


class TcpKVSender(ChannelSender):
    """Sends KV frames over one persistent TCP connection per peer; with `encrypt`, sealed
    (which needs `auth_token`, and receivers that encrypt too); with `shared_memory` (and
    not `encrypt`), their payload through a ring in shared memory where the receiver is on
    this host (`ring`)."""

    channel_class = _PeerChannel
    gathers = True  # sendmsg takes the pieces as they are; the receiver splits the layers

    def __init__(
        self,
        auth_token: str | None = None,
        connect_timeout_s: float = 5.0,
        socket_buffer_bytes: int | None = SOCKET_BUFFER_BYTES,
        part_bytes: int = PART_BYTES,
        max_idle_s: float = MAX_IDLE_S,
        encrypt: bool = False,
        shared_memory: bool = True,
    ) -> None:
        require_token(auth_token, encrypt)
        super().__init__(auth_token, connect_timeout_s, part_bytes, max_idle_s)
        self.socket_buffer_bytes = socket_buffer_bytes
        self.encrypt = encrypt
        self.shared_memory = shared_memory  # offer a ring to a receiver on this host

    def prepare(self, sock: socket.socket) -> SealingKey | None:
        """Tune and authenticate a fresh connection (from its channel's thread); the key to
        seal its frames with, under encryption."""
        tune(sock, self.socket_buffer_bytes)
        key = answer_hello(sock, self.auth_token, GREETING, self.encrypt)
        sock.settimeout(None)
        return key
