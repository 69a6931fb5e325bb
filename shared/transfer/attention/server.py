"""The attention worker's side of the link: a listener and one thread per decode worker
that reads q, k, v straight into tensors, has its handler compute, and sends the output."""

from __future__ import annotations

from typing import Protocol

import orjson
import torch

from shared.transfer.attention.wire import (
    GREETING,
    KIND_ERROR,
    KIND_OUT,
    KIND_QKV,
    KIND_RELEASE,
    KIND_STEP,
    ChunkSpec,
    decode_step,
    read_header,
    send_frame,
)
from shared.transfer.base import BlockSpan
from shared.transfer.common.counters import Counters
from shared.transfer.common.frames import ProtocolError
from shared.transfer.common.handshake import challenge
from shared.transfer.common.receiver import Connection, ListeningReceiver, OpenFrame
from shared.transfer.common.sockets import recv_exact
from shared.transfer.tcp.sockets import recv_hashed
from shared.transfer.tensor_bytes import tensor_bytes


class AttentionHandler(Protocol):
    """What the attention worker does with a link's frames (on the link's thread)."""

    def begin_step(self, micro_batch: int, chunks: list[ChunkSpec]) -> None:
        """Adopt a micro-batch's layout; ValueError if it names blocks it cannot hold."""

    def qkv_buffers(self, micro_batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Empty q, k, v tensors shaped for that micro-batch's tokens and this shard's heads."""

    def attend(
        self, micro_batch: int, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Append k, v to the cache and return the attention output [T, H_w, D]."""

    def release(self, request_ids: list[str]) -> None: ...

    def link_opened(self) -> object:
        """A decode worker's link opened: what `link_closed` gets back when it closes."""

    def link_closed(self, opened: object) -> None:
        """That link closed (its decode worker stopped, died or re-formed its group)."""


class _NoKV:
    """The KV sink of a link, which carries no KV frames: the listener it shares with the KV
    receivers wants one, and never calls it (no frame on a link opens a request)."""

    def destination(self, request_id: str, layer: int, span: BlockSpan, nbytes: int) -> None:
        return None

    def on_frame(
        self, request_id: str, layer: int, spans: tuple[BlockSpan, ...], ok: bool, error: str
    ) -> None:
        pass

    def on_end(self, request_id: str, num_frames: int) -> None:
        pass

    def on_lost(self, request_ids: list[str], error: str) -> None:
        pass


class _LinkConnection(Connection[tuple[int, int, int, int], OpenFrame]):
    receiver: AttentionServer
    opened: object = None  # what the handler said when this link opened

    def _handshake(self) -> None:
        challenge(self.sock, self.receiver.auth_token, GREETING)
        self.opened = self.receiver.handler.link_opened()

    def _closed(self) -> None:
        self.receiver.handler.link_closed(self.opened)

    def _read_header(self) -> tuple[int, int, int, int] | None:
        return read_header(self.sock)

    def _handle(self, header: tuple[int, int, int, int]) -> None:
        kind, micro_batch, layer, size = header
        handler = self.receiver.handler
        try:
            if kind == KIND_QKV:
                return self._attend(handler, micro_batch, layer, size)
            payload = recv_exact(self.sock, size)
            self.receiver.counters.add(bytes=size)
            if kind == KIND_STEP:
                handler.begin_step(micro_batch, decode_step(payload))
            elif kind == KIND_RELEASE:
                handler.release(_request_ids(payload))
            else:
                raise ProtocolError(f"unexpected frame kind {kind} from a decode worker")
        except (ValueError, KeyError) as e:
            send_frame(self.sock, KIND_ERROR, micro_batch, layer, str(e).encode())
            raise ProtocolError(str(e)) from None

    def _attend(self, handler: AttentionHandler, micro_batch: int, layer: int, size: int) -> None:
        buffers = handler.qkv_buffers(micro_batch)
        views = [tensor_bytes(b) for b in buffers]
        if size != sum(v.nbytes for v in views):
            raise ValueError(
                f"QKV of {size} bytes; micro-batch {micro_batch} needs "
                f"{sum(v.nbytes for v in views)}"
            )
        recv_hashed(self.sock, [(view, None) for view in views])
        out = handler.attend(micro_batch, layer, *buffers)
        sent = send_frame(self.sock, KIND_OUT, micro_batch, layer, tensor_bytes(out.contiguous()))
        self.receiver.counters.add(bytes=size, frames=1, sent=sent)


def _request_ids(payload: bytes) -> list[str]:
    ids = orjson.loads(payload)
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError("RELEASE carries a list of request ids")
    return ids


class AttentionServer(ListeningReceiver):
    """Serves decode workers' attention links with one handler (the worker's KV shard)."""

    connection_class = _LinkConnection

    def __init__(
        self, handler: AttentionHandler, host: str, port: int, auth_token: str | None
    ) -> None:
        super().__init__(_NoKV(), host, port, auth_token)
        self.handler = handler
        self.counters = Counters("bytes", "frames", "rejected", "sent")

    @property
    def bytes_sent(self) -> int:
        return self.counters["sent"]
