"""The receiving side both transports share: a listener, one thread per accepted sender, and
what every connection does with the sink (destinations, frames, ends, losses)."""

from __future__ import annotations

import functools
import logging
import socket
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from shared.errors import KvstackError
from shared.transfer.base import BlockSpan, KVReceiver, KVSink
from shared.transfer.common.counters import Counters
from shared.transfer.common.frames import Pieces, ProtocolError, pieces, size
from shared.transfer.common.limits import ConnectionLimits, ThrottledWarning
from shared.transfer.common.sockets import shut_down, tune

log = logging.getLogger(__name__)
# NOTE: the default keeps idle connections open, as the attention link's client never
# reconnects; KV receivers, whose senders do, default to ConnectionLimits() and its idle timeout.
NO_IDLE_TIMEOUT = ConnectionLimits(idle_timeout_s=None)
CAPS = ("max_connections", "max_connections_per_peer")  # ConnectionLimits' caps at accept


class OpenFrame(Protocol):
    """What every transport's frame in progress has."""

    @property
    def request_id(self) -> str: ...

    @property
    def layer(self) -> int: ...

    @property
    def layers(self) -> range: ...

    @property
    def spans(self) -> Sequence[BlockSpan]: ...

    @property
    def error(self) -> str: ...


HeaderT = TypeVar("HeaderT")  # a transport's message header
FrameT = TypeVar("FrameT", bound=OpenFrame)  # its frame in progress


def writable(dest: object, nbytes: int) -> tuple[memoryview, memoryview] | None:
    """The sink's (K, V) destination as flat byte views, or None unless both are writable
    buffers of exactly `nbytes` (one piece each: for a transport that cannot scatter)."""
    halves = scattered(dest, nbytes)
    if halves is None or len(halves[0]) != 1 or len(halves[1]) != 1:
        return None
    return halves[0][0], halves[1][0]


def scattered(dest: object, nbytes: int) -> tuple[Pieces, Pieces] | None:
    """The sink's (K, V) destination as writable flat pieces, each half one buffer or a
    sequence of them adding up to `nbytes`; None when it is anything else."""
    if not isinstance(dest, (tuple, list)) or len(dest) != 2:
        return None
    k, v = dest
    if _flat_writable(k, nbytes) and _flat_writable(v, nbytes):  # NOTE: the common case,
        return (k,), (v,)  # checked in a tenth of the general path's time (30 a span)
    try:
        halves = tuple(pieces(half) for half in dest)
    except (TypeError, ValueError):  # None, or not buffers
        return None
    if any(size(half) != nbytes or any(p.readonly for p in half) for half in halves):
        return None
    return halves[0], halves[1]


def _flat_writable(half: object, nbytes: int) -> bool:
    return (
        type(half) is memoryview
        and half.nbytes == nbytes
        and not half.readonly
        and half.ndim == 1
        and half.format == "B"
    )


def layer_destinations(
    sink: KVSink, request_id: str, layers: range, span: BlockSpan, nbytes: int
) -> list[tuple[Pieces, Pieces] | None]:
    """A span's destination in each of `layers` (`nbytes` each half), as `scattered`
    makes them: in one call where the sink names many layers at once (`destinations`),
    else one call a layer."""
    many = getattr(sink, "destinations", None)
    if many is None:
        return [
            scattered(call_sink(sink.destination, request_id, i, span, nbytes), nbytes)
            for i in layers
        ]
    found = call_sink(many, request_id, layers, span, nbytes)
    if not isinstance(found, (list, tuple)) or len(found) != len(layers):
        return [None] * len(layers)
    return [scattered(dest, nbytes) for dest in found]


def report_frame(
    sink: KVSink, request_id: str, layers: range, spans: tuple[BlockSpan, ...], error: str
) -> None:
    """A landed frame, to the sink: in one call where the sink hears of many layers at once
    (`on_frames`), else one call a layer."""
    many = getattr(sink, "on_frames", None) if len(layers) > 1 else None
    if many is not None:
        call_sink(many, request_id, layers, spans, not error, error)
        return
    for layer in layers:
        call_sink(sink.on_frame, request_id, layer, spans, not error, error)


def call_sink(callback: Callable, *args: object) -> object:
    """Run a sink callback; a sink's bug must not take the connection down."""
    try:
        return callback(*args)
    except Exception:
        log.exception("KV sink %s failed", getattr(callback, "__name__", callback))
        return None


class Connection(Generic[HeaderT, FrameT]):
    """One accepted sender: serves its messages until the peer closes, misbehaves or keeps
    the receiver waiting longer than its `ConnectionLimits` allow.

    `frame` is the frame in progress (None between frames); it has `request_id`, `layer`,
    `spans` and `error`. A transport does the handshake (`_handshake`), reads a message
    header (`_read_header`, None at a clean close) and handles the message (`_handle`).
    A dropped connection reports its open requests lost; a frame it had begun is never
    reported, so the sink never takes half-written bytes for a whole frame.
    """

    def __init__(self, sock: socket.socket, receiver: ListeningReceiver) -> None:
        self.sock = sock
        self.receiver = receiver
        self.sink = receiver.sink
        self.limits = receiver.limits
        self.peer = peer_name(sock)
        self.open_requests: dict[str, None] = {}  # insertion-ordered set
        self.frame: FrameT | None = None
        self.waiting_for = "handshake"  # what a timeout interrupts: handshake, idle or message

    def run(self) -> None:
        error = "connection closed"
        try:
            tune(self.sock, self.receiver.socket_buffer_bytes)
            self.sock.settimeout(self.limits.handshake_timeout_s)
            self._handshake()
            while self._message_begins() and (header := self._read_header()) is not None:
                self._handle(header)
            if self.frame is not None:
                raise ConnectionError("connection closed mid-frame")
        except TimeoutError:
            error = self._timeout_error()
            self.receiver.dropped(self.peer, error, quietly=self.waiting_for == "idle")
        except (OSError, ProtocolError) as e:
            error = str(e) or type(e).__name__
            self.receiver.dropped(self.peer, error)
        finally:
            self.sock.close()
            self._closed()
            if self.open_requests:
                call_sink(self.sink.on_lost, list(self.open_requests), error)

    def _message_begins(self) -> bool:
        """Wait for the next message's first byte (False at a clean close): up to the idle
        timeout between frames, the read timeout while a frame's parts are still due. The
        rest of the message then has the read timeout for each read."""
        self.waiting_for = "idle" if self.frame is None else "message"
        self.sock.settimeout(
            self.limits.idle_timeout_s if self.frame is None else self.limits.read_timeout_s
        )
        begun = self.sock.recv(1, socket.MSG_PEEK) != b""
        self.waiting_for = "message"
        self.sock.settimeout(self.limits.read_timeout_s)
        return begun

    def _timeout_error(self) -> str:
        limits = self.limits
        if self.waiting_for == "handshake":
            return f"no handshake within {limits.handshake_timeout_s:g} s"
        if self.waiting_for == "idle":
            return f"idle for {limits.idle_timeout_s:g} s"
        return f"no bytes for {limits.read_timeout_s:g} s mid-message"

    # --- what a transport provides ---------------------------------------------------------

    def _handshake(self) -> None:
        raise NotImplementedError

    def _read_header(self) -> HeaderT | None:
        raise NotImplementedError

    def _handle(self, header: HeaderT) -> None:
        raise NotImplementedError

    def _closed(self) -> None:
        """After the socket closed, before the sink hears of lost requests."""

    # --- the sink ---------------------------------------------------------------------------

    def _begin(self, frame: FrameT) -> None:
        self.frame = frame
        self.open_requests[frame.request_id] = None

    def _destination(
        self, request_id: str, layer: int, span: BlockSpan, nbytes: int
    ) -> tuple[memoryview, memoryview] | None:
        return writable(call_sink(self.sink.destination, request_id, layer, span, nbytes), nbytes)

    def _complete(self) -> None:
        """The frame in progress has been checked to its end: count it, report it (a frame
        of several layers counts, and is reported, as a frame of each)."""
        frame, self.frame = self.frame, None
        if frame is None:
            raise RuntimeError("no frame in progress to complete")
        self._report(frame.request_id, frame.layers, tuple(frame.spans), frame.error)

    def _report(
        self, request_id: str, layers: range, spans: tuple[BlockSpan, ...], error: str
    ) -> None:
        """A frame of `layers` that landed (or not: `error`), counted and told to the sink."""
        self.receiver.counters.add(frames=len(layers), rejected=len(layers) * bool(error))
        report_frame(self.sink, request_id, layers, spans, error)

    def _end(self, request_id: str, num_frames: int) -> None:
        self.open_requests.pop(request_id, None)
        call_sink(self.sink.on_end, request_id, num_frames)


def peer_name(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:  # already reset by the peer
        return "an unknown peer"
    return f"{host}:{port}"


class ListeningReceiver(KVReceiver):
    """Listens for senders and serves each on its own thread with a `connection_class`,
    up to `limits.max_connections` at once and `limits.max_connections_per_peer` from one
    address."""

    connection_class: type[Connection[Any, Any]]
    socket_buffer_bytes: int | None = None  # per accepted socket; None keeps the system's

    def __init__(
        self,
        sink: KVSink,
        host: str,
        port: int,
        auth_token: str | None,
        limits: ConnectionLimits = NO_IDLE_TIMEOUT,
    ) -> None:
        self.sink = sink
        self.host, self.port = host, port
        self.auth_token = auth_token
        self.limits = limits
        self.counters = Counters("bytes", "frames", "rejected", "placed")
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._sockets: dict[socket.socket, str] = {}  # open connections -> their peer's IP
        self._per_peer: Counter[str] = Counter()  # peer IP -> its open connections
        self._accepted = 0
        self._refused = {cap: ThrottledWarning(log) for cap in CAPS}
        self._dropped = ThrottledWarning(log)
        self._lock = threading.Lock()
        self._stopping = False

    def start(self) -> str:
        self._listener = listener = self._listen()
        self._spawn(functools.partial(self._accept_loop, listener), "kv-accept")
        host, port = listener.getsockname()[:2]
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

    def dropped(self, peer: str, error: str, quietly: bool = False) -> None:
        """A connection ended on `error` (from its thread): worth a warning unless it idled
        out (`quietly`) or the receiver is stopping."""
        if quietly:
            log.info("closed the connection of %s: %s", peer, error)
        elif not self._stopping:
            self._dropped("dropped the connection of %s: %s", peer, error)

    @property
    def bytes_received(self) -> int:
        return self.counters["bytes"]

    @property
    def bytes_placed(self) -> int:
        """Of `bytes_received`, those an asker read where a kvstore placed them (tcp.placed)."""
        return self.counters["placed"]

    @property
    def frames_received(self) -> int:
        return self.counters["frames"]

    @property
    def frames_rejected(self) -> int:
        return self.counters["rejected"]

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._sockets)

    @property
    def connections_accepted(self) -> int:
        """Connections served so far (those refused at the cap not counted)."""
        return self._accepted

    @property
    def connections_refused(self) -> int:
        """Connections closed at accept because either cap was reached."""
        return sum(warning.total for warning in self._refused.values())

    @property
    def connections_refused_per_peer(self) -> int:
        """Connections closed at accept because their peer address had
        `limits.max_connections_per_peer` open."""
        return self._refused["max_connections_per_peer"].total

    def _listen(self) -> socket.socket:
        try:
            return socket.create_server((self.host, self.port), backlog=64)
        except OSError as e:  # one clear line, as for a taken HTTP port (shared/runtime/service.py)
            raise KvstackError(
                f"cannot listen on {self.host}:{self.port} (data plane): {e.strerror}"
            ) from None

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, address = listener.accept()
            except OSError:
                return  # stop() shut the listener down
            if self._admit(sock, address[0]):
                self._spawn(functools.partial(self._serve, sock), "kv-recv")

    def _admit(self, sock: socket.socket, host: str) -> bool:
        """Track `sock` (from `host`) for a thread of its own; close it at once when stopping
        or at a cap (the connections already open carry on)."""
        with self._lock:
            stopping = self._stopping
            cap = None if stopping else self._cap_reached(host)
            admitted = not stopping and cap is None
            if admitted:
                self._sockets[sock] = host
                self._per_peer[host] += 1
                self._accepted += 1
        if cap is not None:
            self._refused[cap](
                "refused a connection from %s: %d already open (%s)",
                peer_name(sock),
                getattr(self.limits, cap),
                cap,
            )
        if not admitted:
            sock.close()
        return admitted

    def _cap_reached(self, host: str) -> str | None:
        """The limit one more connection from `host` would pass, if any (under the lock)."""
        if len(self._sockets) >= self.limits.max_connections:
            return "max_connections"
        if self._per_peer[host] >= self.limits.max_connections_per_peer:
            return "max_connections_per_peer"
        return None

    def _serve(self, sock: socket.socket) -> None:
        try:
            self.connection_class(sock, self).run()
        finally:
            with self._lock:
                host = self._sockets.pop(sock)
                self._per_peer[host] -= 1
                if not self._per_peer[host]:
                    del self._per_peer[host]

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
