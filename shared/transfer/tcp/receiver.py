"""The receiving side: a listener, and one thread per accepted connection (up to a cap) that
reads frames straight into the memory the sink names."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from functools import cached_property

import xxhash

from shared.transfer.base import BlockSpan, KVSink
from shared.transfer.common.encryption import require_token
from shared.transfer.common.frames import ProtocolError
from shared.transfer.common.handshake import challenge
from shared.transfer.common.limits import ConnectionLimits
from shared.transfer.common.receiver import (
    Connection,
    ListeningReceiver,
    call_sink,
    layer_destinations,
)
from shared.transfer.common.sockets import recv_exact
from shared.transfer.tcp import placed, placed_puts, ring
from shared.transfer.tcp.asking import Answer, AskServer, write_answer
from shared.transfer.tcp.sealing import Opener
from shared.transfer.tcp.sockets import SOCKET_BUFFER_BYTES, Landing, recv_hashed
from shared.transfer.tcp.wire import (
    GREETING,
    HEADER,
    KIND_ANSWER,
    KIND_ASK,
    KIND_END,
    KIND_KV,
    KIND_PLACED,
    KIND_RING,
    SPAN,
    check_header,
    parse_spans,
    unpack_layers,
)

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
    layers: range  # a frame of several layers reaches the sink as one frame per layer
    spans: list[BlockSpan] = field(default_factory=list)
    error: str = ""

    @property
    def layer(self) -> int:
        return self.layers[0]


def verify(targets: list[_Target]) -> str:
    hashers = [t.hasher for t in targets if t.hasher is not None]
    if len(hashers) != len(targets):
        return "destination refused or wrong size"
    if any(h.intdigest() != t.checksum for h, t in zip(hashers, targets, strict=True)):
        return "checksum mismatch"
    return ""


class _Connection(Connection[bytes, _Partial]):
    """One accepted sender: reads frames straight into the sink's memory, hashing as they land."""

    receiver: TcpKVReceiver

    def __init__(self, sock: socket.socket, receiver: TcpKVReceiver) -> None:
        super().__init__(sock, receiver)
        self.opener: Opener | None = None  # under encryption, from the handshake
        self.ring: ring.RingReader | None = None  # same host: the sender's shared memory
        self.answer_ring: ring.RingWriter | None = None  # same host: an asker's, for answers
        self.arena_mapped = False  # same host: the asker mapped the server's arena (`placed`)
        self.put_ring: ring.RingReader | None = None  # the asker's ring, read for its puts

    @cached_property
    def scratch(self) -> memoryview:
        """Allocated on first use, so that a peer who never gets past the handshake costs
        no megabyte."""
        return memoryview(bytearray(DISCARD_CHUNK))

    def _handshake(self) -> None:
        key = challenge(
            self.sock, self.receiver.auth_token, GREETING, encrypt=self.receiver.encrypt
        )
        self.opener = None if key is None else Opener(key)

    def _read_header(self) -> bytes | None:
        return recv_exact(self.sock, HEADER.size, eof_ok=True)

    def _handle(self, raw: bytes) -> None:
        kind, rid_len, layers, count, body = check_header(raw)
        if kind == KIND_RING:
            return self._take_ring(body, for_answers=bool(count))
        if kind in (KIND_ASK, KIND_ANSWER):
            return self._answer(kind, body)
        if kind == KIND_PLACED:
            return self._placed(raw)
        num_spans = 0 if kind == KIND_END else count
        meta = self._read_meta(raw, rid_len + num_spans * SPAN.size)  # id and span table
        request_id = meta[:rid_len].decode(errors="replace")
        if kind == KIND_END:
            self._end_of(request_id, count, body - len(meta))
        else:
            spans = parse_spans(meta[rid_len:])
            self._receive_part(
                raw, kind, request_id, unpack_layers(layers), spans, body - len(meta)
            )

    def _take_ring(self, body: int, for_answers: bool) -> None:
        """A peer on this host offers its ring: a sender's to read its frames from, or an
        asker's to write this side's answers into; taken if this process sees it too (and
        takes rings at all, and answers asks for an asker's)."""
        taken = self.answer_ring if for_answers else self.ring
        if self.opener is not None or taken is not None or self.frame is not None:
            raise ProtocolError("a ring offered under encryption, twice or inside a frame")
        if body != ring.OFFER.size:
            raise ProtocolError(f"a ring offer of {body} bytes")
        offer = recv_exact(self.sock, body)
        if not self.receiver.shared_memory or (for_answers and self.receiver.server is None):
            self.sock.sendall(ring.NO)
        elif for_answers:
            self.answer_ring = ring.accept_for_answers(self.sock, offer)
            if self.answer_ring is not None:  # NOTE: same host: where the blocks lie, too
                shared = self.answer_ring
                self.put_ring = ring.RingReader(shared.mapping, shared.size)
                arena = self.receiver.server.arena()  # type: ignore[union-attr]
                self.arena_mapped = placed.offer_arena(self.sock, arena)
        else:
            self.ring = ring.accept(self.sock, offer)

    def _answer(self, kind: int, body: int) -> None:
        """An ask from the peer that dialed (`asking`): answered on this connection."""
        server = self.receiver.server
        if kind != KIND_ASK or server is None or self.opener is not None or self.frame:
            raise ProtocolError("an answer, or an ask where none is served or mid-frame")
        answer = call_sink(server.answer, recv_exact(self.sock, body))
        if not isinstance(answer, Answer):  # the server failed (and logged why)
            raise ProtocolError("an ask the server could not answer")
        write_answer(self.sock, answer, self.answer_ring, self.arena_mapped)

    def _placed(self, raw: bytes) -> None:
        """Part of a put's blocks placed whole in the asker's ring (`placed`): copied into
        the sink's blocks, checked there, reported as a frame of every layer; then how far
        the ring was read goes back, and this side's answers go on from there."""
        reader, writer = self.put_ring, self.answer_ring
        if reader is None or writer is None or self.frame is not None:
            raise ProtocolError("blocks placed in a ring never offered, or mid-frame")
        placement = placed.read_placed(self.sock, raw)
        start = ring.POSITION.unpack(recv_exact(self.sock, ring.POSITION.size))[0]
        reader.next = max(reader.next, writer.head)
        try:
            offset = reader.check(start, placement.nbytes)
        except ValueError as e:
            raise ProtocolError(str(e)) from e
        self.open_requests[placement.request_id] = None
        part = reader.data[offset : offset + placement.nbytes]
        spans, error = placed_puts.take_blocks(self.sink, placement, part)
        self.receiver.counters.add(bytes=placement.nbytes)
        self._report(placement.request_id, placement.layers, spans, error)
        reader.consumed(self.sock, start + placement.nbytes)
        writer.head = writer.tail = reader.next

    def _closed(self) -> None:
        for shared in (self.ring, self.answer_ring, self.put_ring):
            if shared is not None:
                shared.close()
        super()._closed()

    def _read_meta(self, header: bytes, nbytes: int) -> bytes:
        if self.opener is None:
            return recv_exact(self.sock, nbytes)
        return self.opener.read_meta(self.sock, header, nbytes)

    def _land(self, header: bytes, landings: list[Landing], payload: int) -> None:
        """Read the payload into `landings`, hashing each piece as it lands: from the ring
        where the sender placed it there, else from the socket."""
        if self.ring is not None:
            start = ring.POSITION.unpack(recv_exact(self.sock, ring.POSITION.size))[0]
            if start != ring.NOT_IN_RING:
                return self._land_from_ring(self.ring, start, landings, payload)
        if self.opener is None:
            recv_hashed(self.sock, landings)
        else:
            self.opener.receive(self.sock, header, landings)

    def _land_from_ring(
        self, shared: ring.RingReader, start: int, landings: list[Landing], payload: int
    ) -> None:
        try:
            offset = shared.check(start, payload)
        except ValueError as e:
            raise ProtocolError(str(e)) from e
        shared.land(offset, landings)
        shared.consumed(self.sock, start + payload)

    def _end_of(self, request_id: str, num_frames: int, extra: int) -> None:
        if extra or self.frame is not None:
            raise ProtocolError(f"END of {request_id} inside a frame or with a body")
        self._end(request_id, num_frames)

    def _receive_part(
        self,
        header: bytes,
        kind: int,
        request_id: str,
        layers: range,
        spans: list[tuple[BlockSpan, int, int]],
        payload: int,
    ) -> None:
        if payload != sum(2 * nbytes for _, nbytes, _ in spans):
            raise ProtocolError("frame body size disagrees with its spans")
        if any(nbytes % len(layers) for _, nbytes, _ in spans):
            raise ProtocolError(f"a span's bytes do not split into {len(layers)} layers")
        frame = self._frame_of(request_id, layers)
        targets = [self._target(request_id, layers, *s) for s in spans]
        self._land(header, [landing for t in targets for landing in t.landings()], payload)
        frame.error = frame.error or verify(targets)
        frame.spans += (span for span, _, _ in spans)
        self.receiver.counters.add(bytes=payload)
        if kind == KIND_KV:
            self._complete()

    def _frame_of(self, request_id: str, layers: range) -> _Partial:
        """The frame this part belongs to: the one in progress, or a new one."""
        frame = self.frame
        if frame is None:
            frame = _Partial(request_id, layers)
            self._begin(frame)
        elif (frame.request_id, frame.layers) != (request_id, layers):
            raise ProtocolError(f"part of {request_id} inside a frame of {frame}")
        return frame

    def _target(
        self, request_id: str, layers: range, span: BlockSpan, nbytes: int, digest: int
    ) -> _Target:
        """Where a span lands: the sink's memory for each of its layers, in as many pieces
        as the sink names (its K of every layer, then its V of every layer); nowhere when
        the sink refuses any layer of it."""
        per_layer = nbytes // len(layers)
        dests = layer_destinations(self.sink, request_id, layers, span, per_layer)
        found = [dest for dest in dests if dest is not None]
        if len(found) != len(dests):
            return _Target(self._discard(2 * nbytes), None, digest)
        views = [view for half in (0, 1) for dest in found for view in dest[half]]
        return _Target(tuple(views), xxhash.xxh3_64(), digest)

    def _discard(self, nbytes: int) -> tuple[memoryview, ...]:
        """Views of one scratch buffer that add up to `nbytes` (a refused span's bytes)."""
        full, rest = divmod(nbytes, DISCARD_CHUNK)
        return (self.scratch,) * full + ((self.scratch[:rest],) if rest else ())


class TcpKVReceiver(ListeningReceiver):
    """Listens for senders and writes their KV frames where `sink` says, within `limits`;
    with `encrypt`, only from senders that encrypt them (which needs `auth_token`); with
    `shared_memory`, their payload through the ring a sender on this host offers; with a
    `server`, asks on a connection answered on it (`asking`)."""

    connection_class = _Connection

    def __init__(
        self,
        sink: KVSink,
        host: str = "0.0.0.0",
        port: int = 0,
        auth_token: str | None = None,
        socket_buffer_bytes: int | None = SOCKET_BUFFER_BYTES,
        limits: ConnectionLimits = ConnectionLimits(),
        encrypt: bool = False,
        shared_memory: bool = True,
        server: AskServer | None = None,
    ) -> None:
        require_token(auth_token, encrypt)
        super().__init__(sink, host, port, auth_token, limits)
        self.server = server  # answers asks on the data connection (`asking`), if any
        self.socket_buffer_bytes = socket_buffer_bytes
        self.encrypt = encrypt
        self.shared_memory = shared_memory

    def _listen(self) -> socket.socket:
        listener = super()._listen()
        if self.socket_buffer_bytes:  # NOTE: set before accept so the window scale fits
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.socket_buffer_bytes)
        return listener
