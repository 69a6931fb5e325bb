"""The sending side: frames go over the peer's connection itself, in wire parts hashed just
before they are sent."""

from __future__ import annotations

import socket

from shared.transfer.common.encryption import SealingKey, require_token
from shared.transfer.common.frames import Frame
from shared.transfer.common.handshake import answer_hello
from shared.transfer.common.sender import MAX_IDLE_S, ChannelSender, PeerChannel
from shared.transfer.common.sockets import tune
from shared.transfer.tcp.sealing import Sealer
from shared.transfer.tcp.sockets import SOCKET_BUFFER_BYTES, send_all
from shared.transfer.tcp.wire import GREETING, PART_BYTES, encode_end, encode_kv


class _PeerChannel(PeerChannel[list[memoryview]]):
    """Writes a frame's wire parts, then counts it; a request's count starts at its first
    frame sent whole."""

    sender: TcpKVSender
    sealer: Sealer | None = None  # under encryption: the current connection's

    def _send_frame(self, frame: Frame) -> None:
        rid = frame.request_id
        if rid in self.errors or not self._connect(rid):
            return
        for buffers in encode_kv(frame, self.sender.part_bytes):
            if not self._write(rid, buffers):
                return
            self.sender.counters.add(bytes=sum(b.nbytes for b in buffers[1:]))
        self.frames[rid] = self.frames.get(rid, 0) + frame.layers  # as the receiver counts
        self.sender.counters.add(frames=frame.layers)

    def _encode_end(self, request_id: str, num_frames: int) -> list[memoryview]:
        return encode_end(request_id, num_frames)

    def _handshake(self, sock: socket.socket) -> None:
        key = self.sender.prepare(sock)
        self.sealer = None if key is None else Sealer(key)

    def _transmit(self, data: list[memoryview]) -> None:
        if self.sealer is None:
            send_all(self._connected(), data)
        else:
            self.sealer.send(self._connected(), data)


class TcpKVSender(ChannelSender):
    """Sends KV frames over one persistent TCP connection per peer; with `encrypt`, sealed
    (which needs `auth_token`, and receivers that encrypt too)."""

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
    ) -> None:
        require_token(auth_token, encrypt)
        super().__init__(auth_token, connect_timeout_s, part_bytes, max_idle_s)
        self.socket_buffer_bytes = socket_buffer_bytes
        self.encrypt = encrypt

    def prepare(self, sock: socket.socket) -> SealingKey | None:
        """Tune and authenticate a fresh connection (from its channel's thread); the key to
        seal its frames with, under encryption."""
        tune(sock, self.socket_buffer_bytes)
        key = answer_hello(sock, self.auth_token, GREETING, self.encrypt)
        sock.settimeout(None)
        return key
