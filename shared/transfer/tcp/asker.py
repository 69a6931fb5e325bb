"""Asks on the data connection, the asking side (`asking` has the protocol): connections
this worker dialed to the receivers it asks (kvstores), one ask at a time each, a few kept
open between asks. An answer's frames are read with the receiving side's own code into
this worker's receiver's sink, as if that receiver had accepted them: the same checks,
the same expectations, the same counters."""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from shared.transfer.base import BlockSpan
from shared.transfer.common.frames import Frame, ProtocolError
from shared.transfer.common.handshake import answer_hello
from shared.transfer.common.receiver import call_sink
from shared.transfer.common.sender import MAX_IDLE_S
from shared.transfer.common.sockets import peer_closed, recv_exact, shut_down, split_peer, tune
from shared.transfer.tcp import arena_view, placed, placed_puts, ring
from shared.transfer.tcp.asking import write_frames
from shared.transfer.tcp.receiver import TcpKVReceiver, _Connection
from shared.transfer.tcp.sockets import SOCKET_BUFFER_BYTES, send_all
from shared.transfer.tcp.wire import (
    GREETING,
    HEADER,
    KIND_ANSWER,
    KIND_ASK,
    KIND_PLACED,
    check_header,
    encode_end,
    encode_note,
    encode_ring_offer,
)

log = logging.getLogger(__name__)
KEEP_PER_PEER = 4  # idle connections kept per receiver; more asks at once dial more
# NOTE: a get placed in the arena this small lands before its answer is handed on (the
# asker's loop then wakes once for both); a bigger one after, so its first layers are in
# use while the rest copy
LAND_FIRST_BYTES = 1 << 20
ASK_THREADS = 8
# NOTE: how often kept connections are checked for a peer that closed them: a stopped
# kvstore's arena stays in memory while a connection of this process still maps it
PRUNE_INTERVAL_S = 5.0

# Takes the reply, or None when none came; returns what to send on the connection next (a
# put's blocks, as frames or whole for the ring: then their END follows), or None
Answered = Callable[[bytes | None], Sequence[Frame] | placed_puts.BlocksOut | None]


class _AskingConnection(_Connection):
    """A connection this side dialed: it answers the receiver's handshake, sends asks and
    reads what comes back as the receiving side reads a sender's frames."""

    def __init__(self, sock: socket.socket, receiver: TcpKVReceiver) -> None:
        super().__init__(sock, receiver)
        self.last_used = time.monotonic()
        self.arena: arena_view.ArenaView | None = None  # same host: the receiver's blocks
        self.put_writer: ring.RingWriter | None = None  # its own ring, written for puts

    def _handshake(self) -> None:
        answer_hello(self.sock, self.receiver.auth_token, GREETING, encrypt=False)

    def _take_ring(self, body: int, for_answers: bool) -> None:
        raise ProtocolError("a ring offered to an asker")

    def exchange(self, question: bytes, request_id: str, answered: Answered) -> None:
        """Ask, hand the reply to `answered` and send the frames it gives back (if any),
        then read the frames that follow the reply (if any) into the sink until the
        request's END, or land the blocks placed in the mapped arena."""
        send_all(self.sock, encode_note(KIND_ASK, question))
        kind, _, _, frames_follow, body = check_header(recv_exact(self.sock, HEADER.size))
        if kind != KIND_ANSWER:
            raise ProtocolError(f"kind {kind} where an answer was due")
        reply = recv_exact(self.sock, body)
        first = None
        if frames_follow:  # NOTE: before `answered`, so a drop from here on reaches the sink
            self.open_requests[request_id] = None
            if self.arena is not None:  # PLACED, or the first frame's header
                first = recv_exact(self.sock, HEADER.size)
                if check_header(first)[0] == KIND_PLACED:
                    return self._placed_answer(request_id, first, reply, answered)
        out = answered(reply)
        if isinstance(out, placed_puts.BlocksOut):
            out = self._put_through_ring(request_id, out)
        if out is not None:
            write_frames(self.sock, request_id, out)
        self._read_request(request_id, first)

    def _put_through_ring(
        self, request_id: str, out: placed_puts.BlocksOut
    ) -> Sequence[Frame] | None:
        """A put's blocks whole through this connection's ring, where the receiver took it
        (`placed`), then their END, then every part read; else their frames, to send."""
        if self.ring is None or out.slot_bytes > self.ring.size // 2:
            return out.frames()
        if self.put_writer is None:
            self.put_writer = ring.RingWriter(self.ring.mapping, self.ring.size)
        writer = self.put_writer
        writer.head = writer.tail = self.ring.next  # NOTE: the answers' reader's position
        parts = placed_puts.place_blocks(self.sock, writer, request_id, out)
        send_all(self.sock, encode_end(request_id, parts * out.num_layers))
        writer.settle(self.sock)
        self.ring.next = writer.head
        return None

    def _placed_answer(
        self, request_id: str, header: bytes, reply: bytes, answered: Answered
    ) -> None:
        """A get answered where its blocks lie: landed (`placed`), DONE sent (the receiver
        may then reuse their memory), its END read; handed on after all that when small,
        else before (a get's `answered` sends nothing)."""
        placement = placed.read_placed(self.sock, header)
        if placement.request_id != request_id:
            raise ProtocolError(f"blocks placed for {placement.request_id}, not {request_id}")
        small = placement.nbytes <= LAND_FIRST_BYTES
        if not small:
            answered(reply)
        report = functools.partial(self._report_placed, request_id)
        self.arena.land(self.sink, placement, report)  # type: ignore[union-attr]
        self.sock.sendall(placed.DONE)
        self._read_request(request_id, None)
        if small:
            answered(reply)

    def _report_placed(
        self, request_id: str, layers: range, spans: tuple[BlockSpan, ...], moved: int, error: str
    ) -> None:
        """A group of layers of a placed get landed: counted and reported as a frame of them."""
        self.receiver.counters.add(bytes=moved, placed=moved)
        self._report(request_id, layers, spans, error)

    def _read_request(self, request_id: str, first: bytes | None) -> None:
        """Read what follows the reply until the request's END (from `first`, a header
        read already)."""
        if first is not None:
            self._handle(first)
        while request_id in self.open_requests:
            self._handle(recv_exact(self.sock, HEADER.size))
        self.last_used = time.monotonic()

    def offer_ring(self, timeout_s: float) -> None:
        """Offer the receiver a ring for its answers' payload (same host: `ring`); where it
        takes it, map the arena it names, if it names one (`placed`)."""
        self.sock.settimeout(timeout_s)
        self.ring = ring.offer_for_answers(
            self.sock, encode_ring_offer(ring.OFFER.size, for_answers=True)
        )
        if self.ring is not None:
            self.arena = arena_view.take_arena(self.sock)

    def _placed(self, raw: bytes) -> None:
        raise ProtocolError("blocks placed where no answer was due")

    def _closed(self) -> None:
        super()._closed()
        if self.put_writer is not None:
            self.put_writer.close()
            self.put_writer = None
        if self.arena is not None:
            self.arena.close()
            self.arena = None

    def close(self) -> None:
        self.sock.close()
        self._closed()  # its ring and arena, if it has them

    def fail(self, error: str) -> None:
        """Close; requests whose frames were due are lost to the sink."""
        self.close()
        if self.open_requests:
            call_sink(self.sink.on_lost, list(self.open_requests), error)
            self.open_requests.clear()


class Asker:
    """Asks receivers on connections of its own and reads what comes back into `receiver`'s
    sink. `ask` blocks: it runs on the asker's threads (`submit`)."""

    def __init__(
        self,
        receiver: TcpKVReceiver,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        max_idle_s: float = MAX_IDLE_S,
        prune_interval_s: float = PRUNE_INTERVAL_S,
    ) -> None:
        self.receiver = receiver
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.max_idle_s = max_idle_s
        self.threads = ThreadPoolExecutor(ASK_THREADS, thread_name_prefix="kv-ask")
        self._idle: dict[str, list[_AskingConnection]] = {}
        self._busy: dict[str, _AskingConnection] = {}  # request id -> its connection
        self._lock = threading.Lock()
        self.closed = False
        self._stopping = threading.Event()
        self._pruner = threading.Thread(
            target=self._prune_every, args=(prune_interval_s,), name="kv-ask-prune", daemon=True
        )
        self._pruner.start()

    def submit(
        self, peer: str, request_id: str, question: bytes, answered: Answered
    ) -> Future[bool]:
        return self.threads.submit(self.ask, peer, request_id, question, answered)

    def ask(self, peer: str, request_id: str, question: bytes, answered: Answered) -> bool:
        """Ask `peer`; `answered` gets the reply, or None when none came. True once all is
        done: what `answered` gave sent, what followed the reply read. A kept connection
        that fails before the answer (the receiver restarted, or closed it idle) is
        replaced by a fresh one once."""
        replied: list[bytes] = []

        def reply(data: bytes) -> Sequence[Frame] | placed_puts.BlocksOut | None:
            replied.append(data)
            return answered(data)

        try:
            kept = self._kept(peer)
            if kept is not None and self._exchange(peer, kept, request_id, question, reply):
                return True
            if replied:  # it failed after the answer: the sink has heard its frames lost
                return False
            fresh = self._dial(peer)
            if self._exchange(peer, fresh, request_id, question, reply):
                return True
        except (OSError, ProtocolError) as e:  # cannot connect, or refused at the handshake
            log.warning("cannot ask %s: %s", peer, e)
        except Exception:  # the owner of this thread's work: log it, end the ask
            log.exception("asking %s failed", peer)
        if not replied:
            answered(None)
        return False

    def abort(self, request_id: str) -> None:
        """Cut the connection an ask is reading on (its frames are then lost)."""
        with self._lock:
            conn = self._busy.get(request_id)
        if conn is not None:
            shut_down(conn.sock)

    def close(self) -> None:
        """Close the idle connections; cut the busy ones (their threads close them)."""
        self._stopping.set()
        with self._lock:
            self.closed = True
            idle = [c for kept in self._idle.values() for c in kept]
            busy = [*self._busy.values()]
            self._idle.clear()
        for conn in idle:
            conn.close()
        for conn in busy:
            shut_down(conn.sock)
        self.threads.shutdown(wait=False, cancel_futures=True)

    def _exchange(
        self, peer: str, conn: _AskingConnection, request_id: str, question: bytes, reply
    ) -> bool:
        with self._lock:
            self._busy[request_id] = conn
        try:
            conn.exchange(question, request_id, reply)
        except (OSError, ProtocolError) as e:
            conn.fail(str(e) or type(e).__name__)
            return False
        except Exception as e:  # e.g. `answered` failed: the connection's state is unknown
            conn.fail(f"internal error: {e!r}")
            raise
        finally:
            with self._lock:
                self._busy.pop(request_id, None)
        self._keep(peer, conn)
        return True

    def _dial(self, peer: str) -> _AskingConnection:
        sock = socket.create_connection(split_peer(peer), self.connect_timeout_s)
        try:
            tune(sock, SOCKET_BUFFER_BYTES)
            conn = _AskingConnection(sock, self.receiver)
            conn._handshake()
            if self.receiver.shared_memory:
                conn.offer_ring(self.connect_timeout_s)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(self.read_timeout_s)
        return conn

    def _kept(self, peer: str) -> _AskingConnection | None:
        """An idle connection to `peer` still fit to ask on, if one is kept."""
        while True:
            with self._lock:
                idle = self._idle.get(peer)
                conn = idle.pop() if idle else None
            if conn is None:
                return None
            if not self._stale(conn, time.monotonic()):
                return conn
            conn.close()

    def _prune_every(self, interval_s: float) -> None:
        while not self._stopping.wait(interval_s):
            try:
                self.prune()
            except Exception:  # the owner of this thread's work: log it, go on
                log.exception("pruning kept connections failed")

    def prune(self) -> int:
        """Close kept connections that their peer closed or that idled too long; returns
        how many."""
        now, stale = time.monotonic(), []
        with self._lock:
            for peer, kept in self._idle.items():
                fresh = [c for c in kept if not self._stale(c, now)]
                stale += [c for c in kept if c not in fresh]
                self._idle[peer] = fresh
        for conn in stale:
            conn.close()
        return len(stale)

    def _stale(self, conn: _AskingConnection, now: float) -> bool:
        return now - conn.last_used >= self.max_idle_s or peer_closed(conn.sock)

    def _keep(self, peer: str, conn: _AskingConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(peer, [])
            if not self.closed and len(idle) < KEEP_PER_PEER:
                idle.append(conn)
                return
        conn.close()
