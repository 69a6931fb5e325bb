"""The sending side both transports share: per peer one queue, one thread and one connection,
so that a request's frames and its END go in the order they were queued."""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from shared.transfer.base import DoneCallback, KVSender, SpanBytes
from shared.transfer.common.counters import Counters
from shared.transfer.common.frames import Frame, ProtocolError, check_request_id, checked_frame
from shared.transfer.common.handshake import AuthenticationError
from shared.transfer.common.sockets import peer_closed, shut_down, split_peer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class End:
    request_id: str
    on_done: DoneCallback


STOP = object()  # the last item a channel's thread takes
WireT = TypeVar("WireT")  # what a transport's channel writes: bytes, or a list of buffers
# NOTE: below receivers' idle timeout (ConnectionLimits.idle_timeout_s, 300 s), so that the
# sender retires an idle connection itself rather than write into one the receiver is closing.
MAX_IDLE_S = 240.0


class PeerChannel(Generic[WireT]):
    """One peer's FIFO of frames and end markers, served by one thread over one connection.

    A request that was mid-stream when its connection broke stays failed: its remaining
    frames are dropped and its END reports the error. Requests that start later reconnect,
    as they do when the receiver closed the connection while it was idle, or when it has
    been idle for `max_idle_s` (so that a receiver's idle timeout never fails a request).
    A transport says how a frame goes (`_send_frame`), what its END looks like
    (`_encode_end`), what a fresh connection needs (`_handshake`) and how bytes leave
    (`_transmit`).
    """

    def __init__(self, peer: str, sender: ChannelSender) -> None:
        self.peer = peer
        self.sender = sender
        self.items: queue.SimpleQueue = queue.SimpleQueue()
        self.sock: socket.socket | None = None
        self.last_write = 0.0  # time.monotonic() of the last write on `sock`
        self.frames: dict[str, int] = {}  # request id -> frames sent, until its END
        self.errors: dict[str, str] = {}  # request id -> why it failed, until its END
        self.thread = threading.Thread(target=self._run, name=f"kv-send {peer}", daemon=True)
        self.thread.start()

    def put(self, item: object) -> None:
        self.items.put(item)

    def abort(self) -> None:
        """Unblock a send or a wait in progress (the channel's thread closes the socket)."""
        shut_down(self.sock)

    # --- what a transport provides ---------------------------------------------------------

    def _send_frame(self, frame: Frame) -> None:
        raise NotImplementedError

    def _encode_end(self, request_id: str, num_frames: int) -> WireT:
        raise NotImplementedError

    def _handshake(self, sock: socket.socket) -> None:
        """Set up the fresh connection `sock`; raises what a failed connect would."""
        raise NotImplementedError

    def _transmit(self, data: WireT) -> None:
        raise NotImplementedError

    def _connected(self) -> socket.socket:
        """The connection, which `_connect` opened before anything is written or read."""
        if self.sock is None:
            raise ConnectionError(f"no connection to {self.peer}")
        return self.sock

    # --- the queue --------------------------------------------------------------------------

    def _run(self) -> None:
        while (item := self.items.get()) is not STOP:
            if self.sender.closed:
                self.errors.setdefault(item.request_id, "sender closed")
            try:
                self._send(item)
            except Exception as e:  # e.g. a buffer released too early; the stream may be torn
                log.exception("sending to %s failed", self.peer)
                self._disconnect(f"internal error: {e!r}")
                self.errors.setdefault(item.request_id, f"internal error: {e!r}")
        self._disconnect("sender closed")

    def _send(self, item: Frame | End) -> None:
        if isinstance(item, Frame):
            self._send_frame(item)
        else:
            self._send_end(item)

    def _send_end(self, end: End) -> None:
        rid = end.request_id
        if rid not in self.errors and self._connect(rid):
            self._write(rid, self._encode_end(rid, self.frames.get(rid, 0)))
        num_frames, error = self.frames.pop(rid, 0), self.errors.pop(rid, "")
        try:
            end.on_done(not error, num_frames, error)
        except Exception:
            log.exception("on_done callback of %s failed", rid)

    # --- the connection ---------------------------------------------------------------------

    def _connect(self, request_id: str) -> bool:
        """Whether a connection is up for the request, opening one if need be; when none
        is, the request has its error."""
        if self.sock is not None and request_id not in self.frames and self._stale():
            self._disconnect(f"{self.peer} closed the connection")  # e.g. it restarted
        if self.sock is not None:
            return True
        try:
            # NOTE: self.sock is set before the handshake so that abort() can interrupt it.
            self.sock = sock = socket.create_connection(
                split_peer(self.peer), self.sender.connect_timeout_s
            )
            self._handshake(sock)
            self.last_write = time.monotonic()
        except AuthenticationError as e:
            self.errors[request_id] = str(e)
        except (OSError, ProtocolError) as e:
            self.errors[request_id] = f"cannot reach {self.peer}: {e}"
        if request_id in self.errors:
            self._close_socket()
        return self.sock is not None

    def _stale(self) -> bool:
        """Whether the connection should not take a new request: the receiver has closed it
        (idle, restarted), or it has idled long enough that the receiver may be closing it."""
        return self._idle_too_long() or (self.sock is not None and peer_closed(self.sock))

    def _idle_too_long(self) -> bool:
        idle_s = time.monotonic() - self.last_write
        return not self.frames and idle_s > self.sender.max_idle_s

    def _write(self, request_id: str, data: WireT) -> bool:
        try:
            self._transmit(data)
        except OSError as e:
            self._fail(request_id, f"send to {self.peer} failed: {e}")
            return False
        self.last_write = time.monotonic()
        return True

    def _fail(self, request_id: str, error: str) -> None:
        self.errors[request_id] = error
        self._disconnect(error)

    def _disconnect(self, error: str) -> None:
        """Close the connection and fail every request that had frames on it."""
        self._close_socket()
        for rid in self.frames:
            self.errors.setdefault(rid, error)

    def _close_socket(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class ChannelSender(KVSender):
    """A KVSender with one `channel_class` per peer."""

    channel_class: type[PeerChannel[Any]]
    gathers = False  # whether a span's half may come in pieces, a frame carry several layers

    def __init__(
        self,
        auth_token: str | None,
        connect_timeout_s: float,
        part_bytes: int,
        max_idle_s: float = MAX_IDLE_S,
    ) -> None:
        self.auth_token = auth_token
        self.connect_timeout_s = connect_timeout_s
        self.part_bytes = part_bytes
        self.max_idle_s = max_idle_s
        self.counters = Counters("bytes", "frames")
        self.closed = False
        self._channels: dict[str, PeerChannel[Any]] = {}
        self._lock = threading.Lock()

    def send(
        self, peer: str, request_id: str, layer: int, spans: Sequence[SpanBytes], layers: int = 1
    ) -> None:
        self._channel(peer).put(checked_frame(request_id, layer, spans, self.gathers, layers))

    def finish(self, peer: str, request_id: str, on_done: DoneCallback) -> None:
        check_request_id(request_id)
        self._channel(peer).put(End(request_id, on_done))

    def close(self) -> None:
        """Abort: queued frames are dropped and unfinished requests fail."""
        with self._lock:
            self.closed = True
            channels = list(self._channels.values())
        for channel in channels:
            channel.put(STOP)
            channel.abort()
        for channel in channels:
            channel.thread.join()

    @property
    def bytes_sent(self) -> int:
        return self.counters["bytes"]

    @property
    def frames_sent(self) -> int:
        return self.counters["frames"]

    def _channel(self, peer: str) -> PeerChannel:
        with self._lock:
            if self.closed:
                raise RuntimeError("sender is closed")
            if peer not in self._channels:
                self._channels[peer] = self.channel_class(peer, self)
            return self._channels[peer]
