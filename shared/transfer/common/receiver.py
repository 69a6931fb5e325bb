"""The receiving side both transports share: a listener, one thread per accepted sender, and
what every connection does with the sink (destinations, frames, ends, losses)."""
from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from shared.transfer.base import BlockSpan, KVReceiver, KVSink
from shared.transfer.common.counters import Counters
from shared.transfer.common.frames import ProtocolError, as_bytes
from shared.transfer.common.handshake import HANDSHAKE_TIMEOUT_S
from shared.transfer.common.sockets import shut_down, tune

log = logging.getLogger(__name__)


def writable(dest: object, nbytes: int) -> tuple[memoryview, memoryview] | None:
    """The sink's (K, V) destination as flat byte views, or None unless both are writable
    buffers of exactly `nbytes`."""
    try:
        k, v = (as_bytes(d) for d in dest)
    except (TypeError, ValueError):  # None, or not a pair of contiguous buffers
        return None
    if k.nbytes != nbytes or v.nbytes != nbytes or k.readonly or v.readonly:
        return None
    return k, v


def call_sink(callback: Callable, *args: object) -> object:
    """Run a sink callback; a sink's bug must not take the connection down."""
    try:
        return callback(*args)
    except Exception:
        log.exception("KV sink %s failed", getattr(callback, "__name__", callback))
        return None


class Connection:
    """One accepted sender: serves its messages until the peer closes or misbehaves.

    `frame` is the frame in progress (None between frames); it has `request_id`, `layer`,
    `spans` and `error`. A transport does the handshake (`_handshake`), reads a message
    header (`_read_header`, None at a clean close) and handles the message (`_handle`).
    """

    def __init__(self, sock: socket.socket, receiver: ListeningReceiver) -> None:
        self.sock = sock
        self.receiver = receiver
        self.sink = receiver.sink
        self.open_requests: dict[str, None] = {}  # insertion-ordered set
        self.frame = None

    def run(self) -> None:
        error = "connection closed"
        try:
            tune(self.sock, self.receiver.socket_buffer_bytes)
            self.sock.settimeout(HANDSHAKE_TIMEOUT_S)
            self._handshake()
            self.sock.settimeout(None)
            while (header := self._read_header()) is not None:
                self._handle(header)
            if self.frame is not None:
                raise ConnectionError("connection closed mid-frame")
        except (OSError, ProtocolError) as e:
            error = str(e) or type(e).__name__
        finally:
            self.sock.close()
            self._closed()
            if self.open_requests:
                call_sink(self.sink.on_lost, list(self.open_requests), error)

    # --- what a transport provides ---------------------------------------------------------

    def _handshake(self) -> None:
        raise NotImplementedError

    def _read_header(self) -> object | None:
        raise NotImplementedError

    def _handle(self, header: object) -> None:
        raise NotImplementedError

    def _closed(self) -> None:
        """After the socket closed, before the sink hears of lost requests."""

    # --- the sink ---------------------------------------------------------------------------

    def _begin(self, frame: object) -> None:
        self.frame = frame
        self.open_requests[frame.request_id] = None

    def _destination(self, request_id: str, layer: int, span: BlockSpan,
                     nbytes: int) -> tuple[memoryview, memoryview] | None:
        return writable(call_sink(self.sink.destination, request_id, layer, span, nbytes),
                        nbytes)

    def _complete(self) -> None:
        """The frame in progress has been checked to its end: count it, report it."""
        frame, self.frame = self.frame, None
        self.receiver.counters.add(frames=1, rejected=int(bool(frame.error)))
        call_sink(self.sink.on_frame, frame.request_id, frame.layer, tuple(frame.spans),
                  not frame.error, frame.error)

    def _end(self, request_id: str, num_frames: int) -> None:
        self.open_requests.pop(request_id, None)
        call_sink(self.sink.on_end, request_id, num_frames)


class ListeningReceiver(KVReceiver):
    """Listens for senders and serves each on its own thread with a `connection_class`."""

    connection_class: type[Connection]
    socket_buffer_bytes: int | None = None  # per accepted socket; None keeps the system's

    def __init__(self, sink: KVSink, host: str, port: int, auth_token: str | None) -> None:
        self.sink = sink
        self.host, self.port = host, port
        self.auth_token = auth_token
        self.counters = Counters("bytes", "frames", "rejected")
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = False

    def start(self) -> str:
        self._listener = self._listen()
        self._spawn(self._accept_loop, "kv-accept")
        host, port = self._listener.getsockname()[:2]
        return f"{host}:{port}"

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            sockets = [s for s in (self._listener, *self._sockets) if s is not None]
        for sock in sockets:
            shut_down(sock)
        for thread in list(self._threads):
            thread.join(timeout=5.0)
        if self._listener is not None:
            self._listener.close()

    @property
    def bytes_received(self) -> int:
        return self.counters["bytes"]

    @property
    def frames_received(self) -> int:
        return self.counters["frames"]

    @property
    def frames_rejected(self) -> int:
        return self.counters["rejected"]

    def _listen(self) -> socket.socket:
        return socket.create_server((self.host, self.port), backlog=64)

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # stop() shut the listener down
            with self._lock:
                if self._stopping:
                    sock.close()
                    return
                self._sockets.add(sock)
            self._spawn(lambda s=sock: self._serve(s), "kv-recv")

    def _serve(self, sock: socket.socket) -> None:
        try:
            self.connection_class(sock, self).run()
        finally:
            with self._lock:
                self._sockets.discard(sock)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
