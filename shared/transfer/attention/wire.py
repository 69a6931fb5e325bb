"""Frames of the attention link: a fixed HEADER (kind, micro-batch, layer, payload bytes)
and a payload.

    STEP     decode -> attention   the micro-batch's chunk layout (JSON, see `ChunkSpec`)
    QKV      decode -> attention   q [T, H_w, D], then k and v [T, H_kv_w, D] of this worker
    OUT      attention -> decode   the attention output [T, H_w, D]
    RELEASE  decode -> attention   request ids whose KV is freed (JSON list)
    ERROR    attention -> decode   why the worker could not compute (UTF-8); it then closes

Tensors travel raw in the dtype both ends agreed at attach; T comes from the STEP.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from shared.transfer.common.frames import ProtocolError
from shared.transfer.common.handshake import Greeting
from shared.transfer.common.sockets import recv_exact
from shared.transfer.tcp.sockets import send_all

GREETING = Greeting(0x4B564154, 1, "kvstack attention link")  # "KVAT"
HEADER = struct.Struct("<BBHI")  # kind, micro-batch, layer, payload bytes
KIND_STEP, KIND_QKV, KIND_OUT, KIND_RELEASE, KIND_ERROR = range(1, 6)
MAX_PAYLOAD = 1 << 30
MAX_MICRO_BATCHES = 255


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """What an attention worker knows of one sequence's chunk in a step (no tokens)."""

    request_id: str
    start_pos: int
    num_tokens: int
    block_ids: tuple[int, ...]

    @property
    def context_len(self) -> int:
        return self.start_pos + self.num_tokens


def encode_step(chunks: Sequence) -> bytes:
    return orjson.dumps(
        [[c.request_id, c.start_pos, c.num_tokens, list(c.block_ids)] for c in chunks]
    )


def decode_step(payload: bytes) -> list[ChunkSpec]:
    try:
        rows = orjson.loads(payload)
        chunks = [ChunkSpec(rid, start, n, tuple(blocks)) for rid, start, n, blocks in rows]
    except (orjson.JSONDecodeError, TypeError, ValueError) as e:
        raise ProtocolError(f"malformed STEP: {e}") from None
    for c in chunks:
        if not (
            isinstance(c.request_id, str)
            and _ints(c.start_pos, c.num_tokens, *c.block_ids)
            and c.num_tokens > 0
            and c.block_ids
        ):
            raise ProtocolError(f"malformed STEP chunk {c}")
    return chunks


def _ints(*values: object) -> bool:
    return all(type(v) is int and v >= 0 for v in values)


def send_frame(
    sock: socket.socket, kind: int, micro_batch: int, layer: int, *payload: memoryview | bytes
) -> int:
    """Send one frame; returns its payload bytes."""
    size = sum(memoryview(p).nbytes for p in payload)
    send_all(
        sock,
        [
            memoryview(HEADER.pack(kind, micro_batch, layer, size)),
            *(memoryview(p) for p in payload),
        ],
    )
    return size


def read_header(sock: socket.socket) -> tuple[int, int, int, int] | None:
    """(kind, micro-batch, layer, payload bytes), or None at a clean close."""
    raw = recv_exact(sock, HEADER.size, eof_ok=True)
    if raw is None:
        return None
    kind, micro_batch, layer, size = HEADER.unpack(raw)
    if not KIND_STEP <= kind <= KIND_ERROR or size > MAX_PAYLOAD:
        raise ProtocolError(f"bad attention-link header (kind {kind}, {size} bytes)")
    return kind, micro_batch, layer, size
