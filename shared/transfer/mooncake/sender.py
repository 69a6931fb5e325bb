"""The sending side: per peer one thread and one control connection, so that a request's
frames and its END go in the order they were queued; the KV bytes go through the engine."""
from __future__ import annotations

import logging
import queue
import socket
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from shared.transfer.base import DoneCallback, KVSender, SpanBytes
from shared.transfer.mooncake.control import (
    KIND_PLACES,
    MAX_SPANS,
    Place,
    answer_hello,
    encode_ask,
    encode_end,
    encode_landed,
    read_header,
    read_places,
)
from shared.transfer.mooncake.engine import Engine, Wait
from shared.transfer.mooncake.memory import views_of
from shared.transfer.mooncake.parts import PART_BYTES, Part, parts_of
from shared.transfer.tcp.counters import Counters
from shared.transfer.tcp.handshake import AuthenticationError
from shared.transfer.tcp.sockets import peer_closed, split_peer, tune
from shared.transfer.tcp.wire import (
    Frame,
    ProtocolError,
    check_request_id,
    checked_frame,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _End:
    request_id: str
    on_done: DoneCallback


_STOP = object()


class _PeerChannel:
    """One peer's FIFO of frames and end markers, served by one thread.

    Per frame: ASK the receiver for places, write the spans there with the engine part by
    part, and after each part send LANDED(_MORE) with its checksums. A request whose
    connection broke stays failed; later requests reconnect.
    """

    def __init__(self, peer: str, sender: MooncakeKVSender) -> None:
        self.peer = peer
        self.sender = sender
        self.items: queue.SimpleQueue = queue.SimpleQueue()
        self.sock: socket.socket | None = None
        self.session = ""  # the receiver's engine session on this connection
        self.engine: Engine | None = None
        self.frames: dict[str, int] = {}  # request id -> frames landed, from its first ASK
        self.errors: dict[str, str] = {}  # request id -> why it failed, until its END
        self.thread = threading.Thread(target=self._run, name=f"kv-send {peer}", daemon=True)
        self.thread.start()

    def put(self, item: object) -> None:
        self.items.put(item)

    def abort(self) -> None:
        """Unblock a wait on the receiver (the channel's thread closes the socket)."""
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
            except Exception as e:  # e.g. a buffer released too early
                log.exception("sending to %s failed", self.peer)
                self._disconnect(f"internal error: {e!r}")
                self.errors.setdefault(item.request_id, f"internal error: {e!r}")
        self._disconnect("sender closed")

    def _send(self, item: Frame | _End) -> None:
        if isinstance(item, Frame):
            self._send_frame(item)
        else:
            self._send_end(item)

    # --- a frame --------------------------------------------------------------------------

    def _send_frame(self, frame: Frame) -> None:
        rid = frame.request_id
        if rid in self.errors or not self._connect(rid) or not self._sources_ready(frame):
            return
        self.frames.setdefault(rid, 0)
        if not self._write(rid, encode_ask(frame)):
            return
        places = self._read_places(frame)
        if places is not None and self._land(frame, places):
            self.frames[rid] += 1
            self.sender.counters.add(frames=1)

    def _sources_ready(self, frame: Frame) -> bool:
        """RDMA reads only registered memory; the tcp protocol reads any (registering there
        would only pile up stale registrations as buffers come and go)."""
        if self.engine.protocol == "tcp" or all(
                self.engine.ensure_registered(view) for _, k, v in frame.spans for view in (k, v)
                if view.nbytes):
            return True
        self.errors[frame.request_id] = "cannot register the source memory with the engine"
        return False

    def _read_places(self, frame: Frame) -> list[Place] | None:
        try:
            header = read_header(self.sock)
            if (header.kind, header.layer, header.count) != \
                    (KIND_PLACES, frame.layer, len(frame.spans)):
                raise ProtocolError(f"{header} does not answer the frame asked")
            return read_places(self.sock, header.count)
        except (OSError, ProtocolError) as e:
            self._fail(frame.request_id, f"no places from {self.peer}: {e}")
            return None

    def _land(self, frame: Frame, places: list[Place]) -> bool:
        """Write the frame part by part, each part's write started before the previous one
        is waited on, and report each part's checksums once it has landed."""
        parts = parts_of([(k, v, place) for (_, k, v), place in
                          zip(frame.spans, places, strict=True)], self.sender.part_bytes)
        waits = deque([self._start(parts[0])])
        for i, part in enumerate(parts):
            if i + 1 < len(parts):
                waits.append(self._start(parts[i + 1]))
            if not self._report(frame, part, waits.popleft(), last=i + 1 == len(parts)):
                for wait in waits:
                    wait()  # NOTE: the engine frees a batch only once it is waited on
                return False
        return True

    def _start(self, part: Part) -> Wait:
        return self.engine.start_writes(self.session, part.copies())

    def _report(self, frame: Frame, part: Part, wait: Wait, last: bool) -> bool:
        # NOTE: hashed while the engine writes; hashing the sender's own bytes means a
        # buffer changed under the transfer shows up as a mismatch at the receiver.
        checksums = part.checksums()
        if not wait():
            self._fail(frame.request_id, f"transfer engine write to {self.peer} failed")
            return False
        if not self._write(frame.request_id, encode_landed(frame, checksums, last)):
            return False
        self.sender.counters.add(bytes=part.nbytes)
        return True

    # --- a request's end ------------------------------------------------------------------

    def _send_end(self, end: _End) -> None:
        rid = end.request_id
        if rid not in self.errors and self._connect(rid):
            self._write(rid, encode_end(rid, self.frames.get(rid, 0)))
        num_frames, error = self.frames.pop(rid, 0), self.errors.pop(rid, "")
        try:
            end.on_done(not error, num_frames, error)
        except Exception:
            log.exception("on_done callback of %s failed", rid)

    # --- the connection -------------------------------------------------------------------

    def _connect(self, request_id: str) -> bool:
        # NOTE: between frames the receiver is silent, so a readable socket means it went away
        if self.sock is not None and request_id not in self.frames and peer_closed(self.sock):
            self._disconnect(f"{self.peer} closed the connection")
        if self.sock is not None:
            return True
        try:
            self.sock = socket.create_connection(split_peer(self.peer),
                                                 self.sender.connect_timeout_s)
            self.session = self.sender.prepare(self.sock)
            self.engine = self.sender.engine(self.sock.getsockname()[0])
        except AuthenticationError as e:
            self.errors[request_id] = str(e)
        except (OSError, ProtocolError) as e:
            self.errors[request_id] = f"cannot reach {self.peer}: {e}"
        if request_id in self.errors:
            self._close_socket()
        return self.sock is not None

    def _write(self, request_id: str, message: bytes) -> bool:
        try:
            self.sock.sendall(message)
        except OSError as e:
            self._fail(request_id, f"send to {self.peer} failed: {e}")
            return False
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


class MooncakeKVSender(KVSender):
    """Sends KV frames to MooncakeKVReceivers: control over TCP, bytes by the engine.

    `memory` (tensors or buffers the spans will come from) is registered with the engine up
    front; RDMA needs it, and registers other source allocations lazily otherwise.
    """

    def __init__(self, auth_token: str | None = None, connect_timeout_s: float = 5.0,
                 protocol: str = "tcp", device_name: str = "", local_hostname: str | None = None,
                 memory: Sequence[torch.Tensor | memoryview] = (),
                 part_bytes: int = PART_BYTES) -> None:
        self.auth_token = auth_token
        self.connect_timeout_s = connect_timeout_s
        self.part_bytes = part_bytes
        self.protocol, self.device_name = protocol, device_name
        self.local_hostname = local_hostname
        self.memory = views_of(memory)
        self.counters = Counters("bytes", "frames")
        self.closed = False
        self._engine: Engine | None = None
        self._channels: dict[str, _PeerChannel] = {}
        self._lock = threading.Lock()

    def send(self, peer: str, request_id: str, layer: int, spans: Sequence[SpanBytes]) -> None:
        if len(spans) > MAX_SPANS:
            raise ValueError(f"a frame holds at most {MAX_SPANS} spans")
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
        if self._engine is not None:
            self._engine.close()

    @property
    def bytes_sent(self) -> int:
        return self.counters["bytes"]

    @property
    def frames_sent(self) -> int:
        return self.counters["frames"]

    def prepare(self, sock: socket.socket) -> str:
        """Authenticate a fresh control connection; returns the receiver's engine session."""
        tune(sock, None)
        session = answer_hello(sock, self.auth_token)
        sock.settimeout(None)
        return session

    def engine(self, local_ip: str) -> Engine:
        """The sender's one engine, started on first use on the address that reaches peers."""
        with self._lock:
            if self._engine is None:
                engine = Engine(self.local_hostname or local_ip, self.protocol, self.device_name)
                engine.register(self.memory)
                self._engine = engine
            return self._engine

    def _channel(self, peer: str) -> _PeerChannel:
        with self._lock:
            if self.closed:
                raise RuntimeError("sender is closed")
            if peer not in self._channels:
                self._channels[peer] = _PeerChannel(peer, self)
            return self._channels[peer]
