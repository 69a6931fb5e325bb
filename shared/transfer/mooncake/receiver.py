"""The receiving side: a control listener, one thread per sender that hands out places from the
sink and checks every span once the engine has written it, and the engine those writes land in."""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from shared.transfer.base import BlockSpan, KVSink
from shared.transfer.common.frames import ProtocolError, checksum
from shared.transfer.common.limits import ConnectionLimits
from shared.transfer.common.receiver import Connection, ListeningReceiver
from shared.transfer.mooncake.control import (
    KIND_ASK,
    KIND_END,
    KIND_LANDED,
    KIND_LANDED_MORE,
    REFUSE,
    Header,
    Place,
    challenge,
    encode_places,
    read_ask,
    read_checksums,
    read_header,
)
from shared.transfer.mooncake.engine import Engine
from shared.transfer.mooncake.memory import address_of, views_of

Target = tuple[memoryview, memoryview] | None  # where a span's K and V went; None: refused
WILDCARD_HOSTS = ("", "0.0.0.0", "::")


@dataclass(slots=True)
class _Placed:
    """A frame whose places the sender has: its bytes may be landing until its last part's
    LANDED comes; parts land in span order."""

    request_id: str
    layer: int
    spans: tuple[BlockSpan, ...]
    targets: tuple[Target, ...]
    checked: int = 0  # spans whose part has landed and been hashed
    error: str = ""

    @property
    def layers(self) -> range:
        return range(self.layer, self.layer + 1)  # this transport's frames carry one layer

    def expects(self, header: Header) -> bool:
        """Whether `header` is a LANDED of this frame's next spans (all the rest, if last)."""
        end = self.checked + header.count
        return (
            (header.request_id, header.layer) == (self.request_id, self.layer)
            and end <= len(self.spans)
            and (header.kind == KIND_LANDED_MORE or end == len(self.spans))
        )


def place_of(target: Target) -> Place:
    if target is None:
        return REFUSE
    k, v = target
    return Place(address_of(k) if k.nbytes else 0, address_of(v) if v.nbytes else 0, True)


def landed_bytes(targets: Sequence[Target]) -> int:
    return sum(k.nbytes + v.nbytes for k, v in filter(None, targets))


def verify(targets: Sequence[Target], checksums: Sequence[int]) -> str:
    """Why the landed frame is bad, or "" (hashes the bytes where they landed)."""
    landed = [t for t in targets if t is not None]
    if len(landed) != len(targets):
        return "destination refused or wrong size"
    if any(checksum(k, v) != c for (k, v), c in zip(landed, checksums, strict=True)):
        return "checksum mismatch"
    return ""


class _Connection(Connection[Header, _Placed]):
    """One sender's control connection: at most one frame placed at a time, so the sink sees
    `destination` ... `on_frame` of one frame before `destination` of the next."""

    receiver: MooncakeKVReceiver

    def __init__(self, sock: socket.socket, receiver: MooncakeKVReceiver) -> None:
        super().__init__(sock, receiver)

    def _handshake(self) -> None:
        challenge(self.sock, self.receiver.auth_token, self.receiver.started_engine.session)

    def _read_header(self) -> Header | None:
        return read_header(self.sock, eof_ok=True)

    def _handle(self, header: Header) -> None:
        if header.kind == KIND_ASK:
            self._place(header)
        elif header.kind in (KIND_LANDED, KIND_LANDED_MORE):
            self._landed(header)
        elif header.kind == KIND_END:
            self._end_of(header)
        else:
            raise ProtocolError(f"a sender does not send {header}")

    def _closed(self) -> None:
        if self.frame is not None:
            # NOTE: the sender may still be writing into the places it was given, and
            # the sink may reuse them once told; give a write in flight time to finish.
            time.sleep(self.receiver.settle_s)

    def _place(self, header: Header) -> None:
        if self.frame is not None:
            raise ProtocolError(f"ASK of {header.request_id} before the last frame landed")
        asked = read_ask(self.sock, header.count)
        targets = tuple(
            self._target(header.request_id, header.layer, span, nbytes) for span, nbytes in asked
        )
        self._begin(
            _Placed(header.request_id, header.layer, tuple(span for span, _ in asked), targets)
        )
        self.sock.sendall(encode_places(header.layer, [place_of(t) for t in targets]))

    def _target(self, request_id: str, layer: int, span: BlockSpan, nbytes: int) -> Target:
        dest = self._destination(request_id, layer, span, nbytes)
        engine = self.receiver.started_engine
        if dest is None or not all(engine.ensure_registered(d) for d in dest if d.nbytes):
            return None
        return dest

    def _landed(self, header: Header) -> None:
        """Hash one part where it landed; after the last, report the frame."""
        placed = self.frame
        if placed is None or not placed.expects(header):
            raise ProtocolError(f"LANDED {header} does not match the frame placed")
        checksums = read_checksums(self.sock, header.count)
        targets = placed.targets[placed.checked : placed.checked + header.count]
        placed.checked += header.count
        placed.error = placed.error or verify(targets, checksums)
        self.receiver.counters.add(bytes=landed_bytes(targets))
        if header.kind == KIND_LANDED:
            self._complete()

    def _end_of(self, header: Header) -> None:
        if self.frame is not None:
            raise ProtocolError(f"END of {header.request_id} inside a frame")
        self._end(header.request_id, header.count)


class MooncakeKVReceiver(ListeningReceiver):
    """Serves senders' control connections and lets their engines write where `sink` says.

    `memory` (the tensors the sink hands out destinations from) is registered with the engine
    at start; any other destination gets its whole allocation registered on first use, until
    stop(), so hand out destinations from long-lived memory. With a wildcard `host`, pass
    `advertise_host` (where peers' engines reach this one); the default guesses it from the
    hostname.

    Trust: the auth token guards the control channel only. The engine's own port takes writes
    into registered memory from anyone who reaches it, at any time, even into spans already
    checked: run it on a trusted network.
    """

    connection_class = _Connection

    def __init__(
        self,
        sink: KVSink,
        host: str = "0.0.0.0",
        port: int = 0,
        auth_token: str | None = None,
        protocol: str = "tcp",
        device_name: str = "",
        advertise_host: str | None = None,
        memory: Sequence[torch.Tensor | memoryview] = (),
        settle_s: float = 0.5,
        limits: ConnectionLimits = ConnectionLimits(),
    ) -> None:
        super().__init__(sink, host, port, auth_token, limits)
        self.protocol, self.device_name = protocol, device_name
        self.advertise_host = advertise_host
        self.memory = views_of(memory)
        self.settle_s = settle_s
        self.engine: Engine | None = None

    @property
    def started_engine(self) -> Engine:
        """The engine, which start() made (connections are served only after it)."""
        if self.engine is None:
            raise RuntimeError("the receiver is not started")
        return self.engine

    def start(self) -> str:
        self.engine = Engine(self._engine_host(), self.protocol, self.device_name)
        self.engine.register(self.memory)
        return super().start()

    def stop(self) -> None:
        super().stop()
        if self.engine is not None:
            self.engine.close()

    def _engine_host(self) -> str:
        """The address senders' engines reach this one at (a wildcard bind names none)."""
        if self.advertise_host:
            return self.advertise_host
        if self.host not in WILDCARD_HOSTS:
            return self.host
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"
