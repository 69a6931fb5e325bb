"""The sending side: one thread and one connection per peer, so that a request's frames
and its END leave in the order they were queued."""
from __future__ import annotations

import logging
import queue
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from shared.transfer.base import DoneCallback, KVSender, SpanBytes
from shared.transfer.tcp.counters import Counters
from shared.transfer.tcp.handshake import AuthenticationError, answer_hello
from shared.transfer.tcp.sockets import (
    SOCKET_BUFFER_BYTES,
    peer_closed,
    send_all,
    split_peer,
    tune,
)
from shared.transfer.tcp.wire import (
    PART_BYTES,
    Frame,
    ProtocolError,
    check_request_id,
    checked_frame,
    encode_end,
    encode_kv,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _End:
    request_id: str
    on_done: DoneCallback


_STOP = object()


class _PeerChannel:
    """One peer's FIFO of frames and end markers, written by one thread over one connection.

    A request that was mid-stream when its connection broke stays failed: its remaining
    frames are dropped and its END reports the error. Requests that start later reconnect.
    """

    def __init__(self, peer: str, sender: TcpKVSender) -> None:
        self.peer = peer
        self.sender = sender
        self.items: queue.SimpleQueue = queue.SimpleQueue()
        self.sock: socket.socket | None = None
        self.frames: dict[str, int] = {}  # request id -> frames sent, until its END
        self.errors: dict[str, str] = {}  # request id -> why it failed, until its END
        self.thread = threading.Thread(target=self._run, name=f"kv-send {peer}", daemon=True)
        self.thread.start()

    def put(self, item: object) -> None:
        self.items.put(item)

    def abort(self) -> None:
        """Unblock a send in progress (the channel's thread closes the socket)."""
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _run(self) -> None:
        while (item := self.items.get()) is not _STOP:
            if self.sender.closed:
                self.errors.setdefault(item.request_id, "sender closed")
            try:
                self._send(item)
            except Exception as e:  # e.g. a buffer released too early; the stream may be torn
                log.exception("sending to %s failed", self.peer)
                self._disconnect(f"internal error: {e!r}")
                self.errors.setdefault(item.request_id, f"internal error: {e!r}")
        self._disconnect("sender closed")

    def _send(self, item: Frame | _End) -> None:
        if isinstance(item, Frame):
            self._send_frame(item)
        else:
            self._send_end(item)

    def _send_frame(self, frame: Frame) -> None:
        rid = frame.request_id
        if rid in self.errors or not self._connect(rid):
            return
        for buffers in encode_kv(frame, self.sender.part_bytes):
            if not self._write(rid, buffers):
                return
            self.sender.counters.add(bytes=sum(b.nbytes for b in buffers[1:]))
        self.frames[rid] = self.frames.get(rid, 0) + 1
        self.sender.counters.add(frames=1)

    def _send_end(self, end: _End) -> None:
        rid = end.request_id
        if rid not in self.errors and self._connect(rid):
            self._write(rid, encode_end(rid, self.frames.get(rid, 0)))
        num_frames, error = self.frames.pop(rid, 0), self.errors.pop(rid, "")
        try:
            end.on_done(not error, num_frames, error)
        except Exception:
            log.exception("on_done callback of %s failed", rid)

    def _connect(self, request_id: str) -> bool:
        if self.sock is not None and request_id not in self.frames and peer_closed(self.sock):
            self._disconnect(f"{self.peer} closed the connection")  # e.g. it restarted
        if self.sock is not None:
            return True
        try:
            # NOTE: self.sock is set before the handshake so that abort() can interrupt it.
            self.sock = socket.create_connection(split_peer(self.peer),
                                                 self.sender.connect_timeout_s)
            self.sender.prepare(self.sock)
        except AuthenticationError as e:
            self.errors[request_id] = str(e)
        except (OSError, ProtocolError) as e:
            self.errors[request_id] = f"cannot reach {self.peer}: {e}"
        if request_id in self.errors:
            self._close_socket()
        return self.sock is not None

    def _write(self, request_id: str, buffers: list[memoryview]) -> bool:
        try:
            send_all(self.sock, buffers)
        except OSError as e:
            self.errors[request_id] = f"send to {self.peer} failed: {e}"
            self._disconnect(self.errors[request_id])
            return False
        return True

    def _disconnect(self, error: str) -> None:
        """Close the connection and fail every request that had frames on it."""
        self._close_socket()
        for rid in self.frames:
            self.errors.setdefault(rid, error)

    def _close_socket(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class TcpKVSender(KVSender):
    """Sends KV frames over one persistent TCP connection per peer."""

    def __init__(self, auth_token: str | None = None, connect_timeout_s: float = 5.0,
                 socket_buffer_bytes: int | None = SOCKET_BUFFER_BYTES,
                 part_bytes: int = PART_BYTES) -> None:
        self.auth_token = auth_token
        self.connect_timeout_s = connect_timeout_s
        self.socket_buffer_bytes = socket_buffer_bytes
        self.part_bytes = part_bytes
        self.counters = Counters("bytes", "frames")
        self.closed = False
        self._channels: dict[str, _PeerChannel] = {}
        self._lock = threading.Lock()

    def send(self, peer: str, request_id: str, layer: int, spans: Sequence[SpanBytes]) -> None:
        self._channel(peer).put(checked_frame(request_id, layer, spans))

    def finish(self, peer: str, request_id: str, on_done: DoneCallback) -> None:
        check_request_id(request_id)
        self._channel(peer).put(_End(request_id, on_done))

    def close(self) -> None:
        """Abort: queued frames are dropped and unfinished requests fail."""
        with self._lock:
            self.closed = True
            channels = list(self._channels.values())
        for channel in channels:
            channel.put(_STOP)
            channel.abort()
        for channel in channels:
            channel.thread.join()

    @property
    def bytes_sent(self) -> int:
        return self.counters["bytes"]

    @property
    def frames_sent(self) -> int:
        return self.counters["frames"]

    def prepare(self, sock: socket.socket) -> None:
        """Tune and authenticate a fresh connection (from its channel's thread)."""
        tune(sock, self.socket_buffer_bytes)
        answer_hello(sock, self.auth_token)
        sock.settimeout(None)

    def _channel(self, peer: str) -> _PeerChannel:
        with self._lock:
            if self.closed:
                raise RuntimeError("sender is closed")
            if peer not in self._channels:
                self._channels[peer] = _PeerChannel(peer, self)
            return self._channels[peer]
