"""The receiving side: a listener, and one thread per accepted connection that reads
frames straight into the memory the sink names."""
from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import xxhash

from shared.transfer.base import BlockSpan, KVReceiver, KVSink
from shared.transfer.tcp.counters import Counters
from shared.transfer.tcp.handshake import HANDSHAKE_TIMEOUT_S, challenge
from shared.transfer.tcp.sockets import (
    SOCKET_BUFFER_BYTES,
    Landing,
    recv_exact,
    recv_hashed,
    tune,
)
from shared.transfer.tcp.wire import (
    HEADER,
    KIND_END,
    KIND_KV,
    SPAN,
    ProtocolError,
    as_bytes,
    check_header,
    parse_spans,
)

log = logging.getLogger(__name__)

DISCARD_CHUNK = 1 << 20  # scratch buffer that a refused span's bytes are read into


@dataclass(frozen=True, slots=True)
class _Target:
    """Where one received span lands; `hasher` is None when its bytes are discarded."""

    views: tuple[memoryview, ...]
    hasher: xxhash.xxh3_64 | None
    checksum: int

    def landings(self) -> list[Landing]:
        return [(view, self.hasher) for view in self.views]


@dataclass(slots=True)
class _Partial:
    """A frame whose parts are still arriving (parts of one frame are consecutive)."""

    request_id: str
    layer: int
    spans: list[BlockSpan] = field(default_factory=list)
    error: str = ""


def verify(targets: list[_Target]) -> str:
    if any(t.hasher is None for t in targets):
        return "destination refused or wrong size"
    if any(t.hasher.intdigest() != t.checksum for t in targets):
        return "checksum mismatch"
    return ""


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


class _Connection:
    """One accepted sender: reads frames until the peer closes or misbehaves."""

    def __init__(self, sock: socket.socket, receiver: TcpKVReceiver) -> None:
        self.sock = sock
        self.receiver = receiver
        self.sink = receiver.sink
        self.open_requests: dict[str, None] = {}  # insertion-ordered set
        self.partial: _Partial | None = None
        self.scratch = memoryview(bytearray(DISCARD_CHUNK))

    def run(self) -> None:
        error = "connection closed"
        try:
            tune(self.sock, self.receiver.socket_buffer_bytes)
            self.sock.settimeout(HANDSHAKE_TIMEOUT_S)
            challenge(self.sock, self.receiver.auth_token)
            self.sock.settimeout(None)
            while self._serve_one():
                pass
        except (OSError, ProtocolError) as e:
            error = str(e) or type(e).__name__
        finally:
            self.sock.close()
            if self.open_requests:
                self._call(self.sink.on_lost, list(self.open_requests), error)

    def _serve_one(self) -> bool:
        raw = recv_exact(self.sock, HEADER.size, eof_ok=True)
        if raw is None:
            if self.partial is not None:
                raise ConnectionError("connection closed mid-frame")
            return False
        kind, rid_len, layer, count, body = check_header(raw)
        num_spans = 0 if kind == KIND_END else count
        meta = recv_exact(self.sock, rid_len + num_spans * SPAN.size)  # id and span table
        request_id = meta[:rid_len].decode(errors="replace")
        if kind == KIND_END:
            self._end(request_id, count, body - len(meta))
        else:
            self._receive_part(kind, request_id, layer, parse_spans(meta[rid_len:]),
                               body - len(meta))
        return True

    def _end(self, request_id: str, num_frames: int, extra: int) -> None:
        if extra or self.partial is not None:
            raise ProtocolError(f"END of {request_id} inside a frame or with a body")
        self.open_requests.pop(request_id, None)
        self._call(self.sink.on_end, request_id, num_frames)

    def _receive_part(self, kind: int, request_id: str, layer: int,
                      spans: list[tuple[BlockSpan, int, int]], payload: int) -> None:
        if payload != sum(2 * nbytes for _, nbytes, _ in spans):
            raise ProtocolError("frame body size disagrees with its spans")
        frame = self._frame_of(request_id, layer)
        targets = [self._target(request_id, layer, *s) for s in spans]
        recv_hashed(self.sock, [landing for t in targets for landing in t.landings()])
        frame.error = frame.error or verify(targets)
        frame.spans += (span for span, _, _ in spans)
        self.receiver.counters.add(bytes=payload)
        if kind == KIND_KV:
            self._complete(frame)

    def _frame_of(self, request_id: str, layer: int) -> _Partial:
        """The frame this part belongs to: the one in progress, or a new one."""
        if self.partial is None:
            self.partial = _Partial(request_id, layer)
            self.open_requests[request_id] = None
        elif (self.partial.request_id, self.partial.layer) != (request_id, layer):
            raise ProtocolError(f"part of {request_id} inside a frame of {self.partial}")
        return self.partial

    def _complete(self, frame: _Partial) -> None:
        self.partial = None
        self.receiver.counters.add(frames=1, rejected=int(bool(frame.error)))
        self._call(self.sink.on_frame, frame.request_id, frame.layer, tuple(frame.spans),
                   not frame.error, frame.error)

    def _target(self, request_id: str, layer: int, span: BlockSpan, nbytes: int,
                digest: int) -> _Target:
        dest = writable(self._call(self.sink.destination, request_id, layer, span, nbytes),
                        nbytes)
        if dest is None:
            return _Target(self._discard(2 * nbytes), None, digest)
        return _Target(dest, xxhash.xxh3_64(), digest)

    def _discard(self, nbytes: int) -> tuple[memoryview, ...]:
        """Views of one scratch buffer that add up to `nbytes` (a refused span's bytes)."""
        full, rest = divmod(nbytes, DISCARD_CHUNK)
        return (self.scratch,) * full + ((self.scratch[:rest],) if rest else ())

    @staticmethod
    def _call(callback: Callable, *args: object) -> object:
        """Run a sink callback; a sink's bug must not take the connection down."""
        try:
            return callback(*args)
        except Exception:
            log.exception("KV sink %s failed", getattr(callback, "__name__", callback))
            return None


class TcpKVReceiver(KVReceiver):
    """Listens for senders and writes their KV frames where `sink` says."""

    def __init__(self, sink: KVSink, host: str = "0.0.0.0", port: int = 0,
                 auth_token: str | None = None,
                 socket_buffer_bytes: int | None = SOCKET_BUFFER_BYTES) -> None:
        self.sink = sink
        self.host, self.port = host, port
        self.auth_token = auth_token
        self.socket_buffer_bytes = socket_buffer_bytes
        self.counters = Counters("bytes", "frames", "rejected")
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = False

    def start(self) -> str:
        listener = socket.create_server((self.host, self.port), backlog=64)
        if self.socket_buffer_bytes:  # NOTE: set before accept so the window scale fits
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.socket_buffer_bytes)
        self._listener = listener
        self._spawn(self._accept_loop, "kv-accept")
        host, port = listener.getsockname()[:2]
        return f"{host}:{port}"

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            sockets = [s for s in (self._listener, *self._sockets) if s is not None]
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
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
            _Connection(sock, self).run()
        finally:
            with self._lock:
                self._sockets.discard(sock)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
