"""The sending side: per peer one thread and one control connection, so that a request's
frames and its END go in the order they were queued; the KV bytes go through the engine."""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Sequence

import torch

from shared.transfer.base import SpanBytes
from shared.transfer.common.frames import Frame, ProtocolError, contiguous
from shared.transfer.common.sender import MAX_IDLE_S, ChannelSender, PeerChannel
from shared.transfer.common.sockets import tune
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


class _PeerChannel(PeerChannel[bytes]):
    """Per frame: ASK the receiver for places, write the spans there with the engine part by
    part, and after each part send LANDED(_MORE) with its checksums. A request's count starts
    at its first ASK."""

    sender: MooncakeKVSender

    def __init__(self, peer: str, sender: MooncakeKVSender) -> None:
        self.session = ""  # the receiver's engine session on this connection
        self.engine: Engine | None = None
        super().__init__(peer, sender)  # NOTE: last, as it starts the thread

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
        engine = self._engine()
        if engine.protocol == "tcp" or all(
            engine.ensure_registered(view)
            for _, k, v in contiguous(frame)
            for view in (k, v)
            if view.nbytes
        ):
            return True
        self.errors[frame.request_id] = "cannot register the source memory with the engine"
        return False

    def _read_places(self, frame: Frame) -> list[Place] | None:
        try:
            sock = self._connected()
            header = read_header(sock)
            if (header.kind, header.layer, header.count) != (
                KIND_PLACES,
                frame.layer,
                len(frame.spans),
            ):
                raise ProtocolError(f"{header} does not answer the frame asked")
            return read_places(sock, header.count)
        except (OSError, ProtocolError) as e:
            self._fail(frame.request_id, f"no places from {self.peer}: {e}")
            return None

    def _land(self, frame: Frame, places: list[Place]) -> bool:
        """Write the frame part by part, each part's write started before the previous one
        is waited on, and report each part's checksums once it has landed."""
        parts = parts_of(
            [(k, v, place) for (_, k, v), place in zip(contiguous(frame), places, strict=True)],
            self.sender.part_bytes,
        )
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
        return self._engine().start_writes(self.session, part.copies())

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

    # --- an END, a fresh connection -------------------------------------------------------

    def _encode_end(self, request_id: str, num_frames: int) -> bytes:
        return encode_end(request_id, num_frames)

    def _handshake(self, sock: socket.socket) -> None:
        self.session = self.sender.prepare(sock)
        self.engine = self.sender.engine(sock.getsockname()[0])

    def _transmit(self, data: bytes) -> None:
        self._connected().sendall(data)

    def _engine(self) -> Engine:
        """The engine, which the handshake of the connection in use set."""
        if self.engine is None:
            raise RuntimeError(f"no transfer engine for {self.peer} before a handshake")
        return self.engine


class MooncakeKVSender(ChannelSender):
    """Sends KV frames to MooncakeKVReceivers: control over TCP, bytes by the engine.

    `memory` (tensors or buffers the spans will come from) is registered with the engine up
    front; RDMA needs it, and registers other source allocations lazily otherwise.
    """

    channel_class = _PeerChannel

    def __init__(
        self,
        auth_token: str | None = None,
        connect_timeout_s: float = 5.0,
        protocol: str = "tcp",
        device_name: str = "",
        local_hostname: str | None = None,
        memory: Sequence[torch.Tensor | memoryview] = (),
        part_bytes: int = PART_BYTES,
        max_idle_s: float = MAX_IDLE_S,
    ) -> None:
        super().__init__(auth_token, connect_timeout_s, part_bytes, max_idle_s)
        self.protocol, self.device_name = protocol, device_name
        self.local_hostname = local_hostname
        self.memory = views_of(memory)
        self._engine: Engine | None = None

    def send(
        self, peer: str, request_id: str, layer: int, spans: Sequence[SpanBytes], layers: int = 1
    ) -> None:
        if len(spans) > MAX_SPANS:
            raise ValueError(f"a frame holds at most {MAX_SPANS} spans")
        super().send(peer, request_id, layer, spans, layers)

    def close(self) -> None:
        """Abort: queued frames are dropped and unfinished requests fail."""
        super().close()
        if self._engine is not None:
            self._engine.close()

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
