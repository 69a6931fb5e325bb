"""A frame as the sender queues it: the checks both wire formats need before anything is
queued, and the checksum both send along."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from shared.transfer.base import SpanBytes

# NOTE: limits that make garbage fail fast instead of allocating or waiting on absurd sizes.
MAX_REQUEST_ID = 1024
MAX_HALF_BYTES = 1 << 30
U32, U64 = 1 << 32, 1 << 64


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; the connection is dropped."""


@dataclass(frozen=True, slots=True)
class Frame:
    request_id: str
    layer: int
    spans: tuple[SpanBytes, ...]


def as_bytes(buffer: memoryview) -> memoryview:
    view = memoryview(buffer)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def checksum(k: memoryview, v: memoryview) -> int:
    digest = xxhash.xxh3_64(k)
    digest.update(v)
    return digest.intdigest()


def check_request_id(request_id: str) -> None:
    if len(request_id.encode()) > MAX_REQUEST_ID:
        raise ValueError(f"request id longer than {MAX_REQUEST_ID} bytes")


def checked_frame(request_id: str, layer: int, spans: Sequence[SpanBytes]) -> Frame:
    """The frame with flat byte views; ValueError (in the caller's thread, before anything
    is queued) for whatever the wire cannot carry."""
    check_request_id(request_id)
    frame = Frame(request_id, layer, tuple((s, as_bytes(k), as_bytes(v)) for s, k, v in spans))
    if not 0 <= layer < U32:
        raise ValueError(f"layer {layer} out of range")
    for span, k, v in frame.spans:
        if k.nbytes != v.nbytes or k.nbytes > MAX_HALF_BYTES:
            raise ValueError(f"{span}: K has {k.nbytes} bytes, V has {v.nbytes}")
        if not (
            max(span.block_id, span.offset, span.num_tokens) < U32
            and span.block_hash < U64
            and min(span.block_id, span.offset, span.num_tokens, span.block_hash) >= 0
        ):
            raise ValueError(f"{span} does not fit the wire format")
    return frame
