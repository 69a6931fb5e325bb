"""KV frames over plain TCP: the default data plane.

Every connection opens with a handshake:

    receiver -> sender   HELLO    magic, version, auth required, 32-byte nonce
    sender -> receiver   proof    HMAC-SHA256(token, nonce), only when auth is required
    receiver -> sender   verdict  one byte: 1 accepted; 0, or a close, refused

then carries frames, each a fixed HEADER (magic, version, kind, request-id length, layer,
count, body bytes) and a body of `body bytes`:

    KV, KV_MORE  request id, `count` SPAN records (each with xxh3_64 of its K then V bytes),
                 then each span's K bytes and V bytes
    END          request id; `count` is the number of KV frames of the request

A frame larger than PART_BYTES travels as several parts (KV_MORE ... KV) that the receiver
reports as one frame. The sender hashes each part right before `sendmsg` copies it, and the
receiver hashes each piece right after `recvmsg_into` lands it in the sink's memory, so both
hash bytes that are still in cache (hashing whole frames apart from the copy cost about a
fifth of loopback throughput in `kvstack bench transfer`).

One thread and one connection per peer on the sending side keep a request's frames and END
in order; one thread per accepted connection on the receiving side.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import queue
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice

import xxhash

from shared.transfer.base import (
    BlockSpan,
    DoneCallback,
    KVReceiver,
    KVSender,
    KVSink,
    SpanBytes,
)

log = logging.getLogger(__name__)

MAGIC = 0x5453564B  # b"KVST" read as little endian
VERSION = 1
KIND_KV, KIND_KV_MORE, KIND_END = 1, 2, 3
HEADER = struct.Struct("<IBBHIIQ")  # magic, version, kind, id length, layer, count, body bytes
SPAN = struct.Struct("<IIIQQQ")  # block id, offset, tokens, bytes per half, block hash, checksum
HELLO = struct.Struct("<IBB32s")  # magic, version, auth required, nonce
PROOF_BYTES = 32
ACCEPTED, REFUSED = b"\x01", b"\x00"

PART_BYTES = 1 << 20  # payload per wire part: hashed, then sent while still in L2
RECV_CHUNK = 256 << 10  # bytes per recvmsg_into, hashed right after they land
SOCKET_BUFFER_BYTES = 4 << 20
HANDSHAKE_TIMEOUT_S = 10.0
IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))  # buffers per sendmsg/recvmsg
# NOTE: limits that make garbage fail fast instead of allocating or waiting on absurd sizes.
MAX_REQUEST_ID = 1024
MAX_SPANS = 1 << 16
MAX_HALF_BYTES = 1 << 30
MAX_BODY_BYTES = 1 << 32
DISCARD_CHUNK = 1 << 20


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; the connection is dropped."""


class AuthenticationError(ConnectionError):
    """The receiver refused the sender's proof (or the sender had none to give)."""


# --- bytes in and out -----------------------------------------------------------------------


def tune(sock: socket.socket, buffer_bytes: int | None) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if buffer_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)


def send_all(sock: socket.socket, buffers: Sequence[memoryview]) -> None:
    """`sendmsg` until every byte has gone (it may send only part of the scatter list)."""
    pending = deque(b for b in buffers if b.nbytes)
    while pending:
        sent = sock.sendmsg(list(islice(pending, IOV_MAX)))
        while sent:
            first = pending[0]
            if sent < first.nbytes:
                pending[0] = first[sent:]
                break
            sent -= first.nbytes
            pending.popleft()


def recv_exact(sock: socket.socket, nbytes: int, eof_ok: bool = False) -> bytes | None:
    """`nbytes` bytes, or None when the peer closed cleanly before the first (if `eof_ok`)."""
    buf = bytearray(nbytes)
    view, got = memoryview(buf), 0
    while got < nbytes:
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0 and eof_ok:
                return None
            raise ConnectionError("connection closed mid-frame")
        got += n
    return bytes(buf)


Landing = tuple[memoryview, xxhash.xxh3_64 | None]  # where bytes go, what hashes them


def first_bytes(pending: deque[Landing], limit: int) -> list[memoryview]:
    """Views of the first `limit` bytes of `pending` (at most IOV_MAX of them)."""
    views, total = [], 0
    for view, _ in islice(pending, IOV_MAX):
        views.append(view[:limit - total])
        total += views[-1].nbytes
        if total >= limit:
            break
    return views


def recv_hashed(sock: socket.socket, landings: Sequence[Landing]) -> None:
    """Fill every view, feeding each piece to its hasher as soon as it has landed."""
    pending = deque(landing for landing in landings if landing[0].nbytes)
    while pending:
        received = sock.recvmsg_into(first_bytes(pending, RECV_CHUNK))[0]
        if received == 0:
            raise ConnectionError("connection closed mid-frame")
        while received:
            view, hasher = pending[0]
            if hasher is not None:
                hasher.update(view[:received])
            if received < view.nbytes:
                pending[0] = (view[received:], hasher)
                break
            received -= view.nbytes
            pending.popleft()


def as_bytes(buffer: memoryview) -> memoryview:
    view = memoryview(buffer)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def checksum(k: memoryview, v: memoryview) -> int:
    digest = xxhash.xxh3_64(k)
    digest.update(v)
    return digest.intdigest()


def peer_closed(sock: socket.socket) -> bool:
    """Whether the receiver has closed an idle connection: it never sends after the
    handshake, so anything readable (an EOF, a reset, stray bytes) means it is gone."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True


def split_peer(peer: str) -> tuple[str, int]:
    host, _, port = peer.rpartition(":")
    return host.strip("[]"), int(port)


class _Counters:
    """Totals that several I/O threads add to."""

    def __init__(self, *names: str) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(names, 0)

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount

    def __getitem__(self, name: str) -> int:
        return self._values[name]


# --- authentication -------------------------------------------------------------------------


def proof_of(token: str, nonce: bytes) -> bytes:
    return hmac.new(token.encode(), nonce, hashlib.sha256).digest()


def answer_hello(sock: socket.socket, token: str | None) -> None:
    """Sender side of the handshake; raises AuthenticationError when refused."""
    magic, version, auth_required, nonce = HELLO.unpack(recv_exact(sock, HELLO.size))
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(f"not a kvstack v{VERSION} receiver")
    if auth_required:
        if token is None:
            raise AuthenticationError("authentication failed: the receiver needs a token")
        sock.sendall(proof_of(token, nonce))
    if sock.recv(1) != ACCEPTED:
        raise AuthenticationError("authentication failed")


def challenge(sock: socket.socket, token: str | None) -> None:
    """Receiver side of the handshake; raises AuthenticationError on a wrong proof."""
    nonce = os.urandom(32)
    sock.sendall(HELLO.pack(MAGIC, VERSION, token is not None, nonce))
    if token is not None:
        proof = recv_exact(sock, PROOF_BYTES)
        if not hmac.compare_digest(proof, proof_of(token, nonce)):
            sock.sendall(REFUSED)
            raise AuthenticationError("authentication failed")
    sock.sendall(ACCEPTED)


# --- sender ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Frame:
    request_id: str
    layer: int
    spans: tuple[SpanBytes, ...]


@dataclass(frozen=True, slots=True)
class _End:
    request_id: str
    on_done: DoneCallback


_STOP = object()
U32, U64 = 1 << 32, 1 << 64


def check_request_id(request_id: str) -> None:
    if len(request_id.encode()) > MAX_REQUEST_ID:
        raise ValueError(f"request id longer than {MAX_REQUEST_ID} bytes")


def checked_frame(request_id: str, layer: int, spans: Sequence[SpanBytes]) -> _Frame:
    """The frame with flat byte views; ValueError (in the caller's thread, before anything
    is queued) for whatever the wire cannot carry."""
    check_request_id(request_id)
    frame = _Frame(request_id, layer, tuple((s, as_bytes(k), as_bytes(v)) for s, k, v in spans))
    if not 0 <= layer < U32:
        raise ValueError(f"layer {layer} out of range")
    for span, k, v in frame.spans:
        if k.nbytes != v.nbytes or k.nbytes > MAX_HALF_BYTES:
            raise ValueError(f"{span}: K has {k.nbytes} bytes, V has {v.nbytes}")
        if not (max(span.block_id, span.offset, span.num_tokens) < U32 and span.block_hash < U64
                and min(span.block_id, span.offset, span.num_tokens, span.block_hash) >= 0):
            raise ValueError(f"{span} does not fit the wire format")
    return frame


def runs_of(spans: Sequence[SpanBytes], part_bytes: int) -> list[Sequence[SpanBytes]]:
    """Consecutive runs of spans, each closed once it holds `part_bytes` or MAX_SPANS spans
    (one run at least, maybe empty)."""
    runs, start, nbytes = [], 0, 0
    for i, (_, k, v) in enumerate(spans):
        nbytes += k.nbytes + v.nbytes
        if nbytes >= part_bytes or i + 1 - start == MAX_SPANS:
            runs.append(spans[start:i + 1])
            start, nbytes = i + 1, 0
    return runs + [spans[start:]] if start < len(spans) or not runs else runs


def encode_part(kind: int, rid: bytes, layer: int, spans: Sequence[SpanBytes]) -> list[memoryview]:
    """Header, span table and payload views of one wire part, checksums computed now."""
    table, payload = [rid], []
    for span, k, v in spans:
        table.append(SPAN.pack(span.block_id, span.offset, span.num_tokens, k.nbytes,
                               span.block_hash, checksum(k, v)))
        payload += (k, v)
    body = len(rid) + len(spans) * SPAN.size + sum(b.nbytes for b in payload)
    header = HEADER.pack(MAGIC, VERSION, kind, len(rid), layer, len(spans), body)
    return [memoryview(header + b"".join(table)), *payload]


def encode_kv(frame: _Frame, part_bytes: int = PART_BYTES) -> Iterator[list[memoryview]]:
    """The wire parts of a frame, lazily: each is hashed only when the sender is ready
    to send it, so its bytes are still in cache when `sendmsg` copies them."""
    rid = frame.request_id.encode()
    runs = runs_of(frame.spans, part_bytes)
    for i, run in enumerate(runs):
        yield encode_part(KIND_KV if i == len(runs) - 1 else KIND_KV_MORE, rid, frame.layer, run)


def encode_end(request_id: str, num_frames: int) -> list[memoryview]:
    rid = request_id.encode()
    return [memoryview(HEADER.pack(MAGIC, VERSION, KIND_END, len(rid), 0, num_frames, len(rid))
                       + rid)]


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

    def _send(self, item: _Frame | _End) -> None:
        if isinstance(item, _Frame):
            self._send_frame(item)
        else:
            self._send_end(item)

    def _send_frame(self, frame: _Frame) -> None:
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
        self.counters = _Counters("bytes", "frames")
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


# --- receiver -------------------------------------------------------------------------------


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


def parse_spans(table: bytes) -> list[tuple[BlockSpan, int, int]]:
    """(span, bytes per half, checksum) of each SPAN record."""
    spans = []
    for block_id, offset, num_tokens, nbytes, block_hash, digest in SPAN.iter_unpack(table):
        if nbytes > MAX_HALF_BYTES:
            raise ProtocolError(f"span of {nbytes} bytes per half")
        spans.append((BlockSpan(block_id, offset, num_tokens, block_hash), nbytes, digest))
    return spans


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


def check_header(raw: bytes) -> tuple[int, int, int, int, int]:
    """(kind, request-id length, layer, count, body bytes) of a header that makes sense."""
    magic, version, kind, rid_len, layer, count, body = HEADER.unpack(raw)
    if magic != MAGIC or version != VERSION or kind not in (KIND_KV, KIND_KV_MORE, KIND_END):
        raise ProtocolError(f"bad frame header {raw.hex()}")
    spans = 0 if kind == KIND_END else count
    if rid_len > MAX_REQUEST_ID or spans > MAX_SPANS or body > MAX_BODY_BYTES \
            or body < rid_len + spans * SPAN.size:
        raise ProtocolError(f"absurd frame header {raw.hex()}")
    return kind, rid_len, layer, count, body


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
        self.counters = _Counters("bytes", "frames", "rejected")
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
