"""A frame as the sender queues it: the checks both wire formats need before anything is
queued, and the checksum both send along."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import xxhash

from shared.transfer.base import BlockSpan, Half, SpanBytes

# NOTE: limits that make garbage fail fast instead of allocating or waiting on absurd sizes.
MAX_REQUEST_ID = 1024
MAX_HALF_BYTES = 1 << 30
MAX_LAYERS = 1 << 16  # a frame's layers, the last of them included, are below this
U32, U64 = 1 << 32, 1 << 64


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; the connection is dropped."""


Pieces = tuple[memoryview, ...]  # a half as flat byte views, in order
_NBYTES = attrgetter("nbytes")


@dataclass(frozen=True, slots=True)
class Frame:
    request_id: str
    layer: int  # the first layer it carries
    spans: tuple[tuple[BlockSpan, Pieces, Pieces], ...]
    layers: int = 1  # how many layers, each span's K (and V) holding them one after another


def as_bytes(buffer: memoryview) -> memoryview:
    if type(buffer) is memoryview and buffer.format == "B" and buffer.ndim == 1:
        return buffer  # NOTE: most pieces are such already; a get of 16 blocks has 960
    view = memoryview(buffer)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def pieces(half: Half) -> Pieces:
    """A half as flat byte views: one buffer is one piece."""
    if isinstance(half, (tuple, list)):
        return tuple(as_bytes(piece) for piece in half)
    return (as_bytes(half),)  # type: ignore[arg-type]  # a buffer, not a sequence of them


def size(half: Pieces) -> int:
    return sum(map(_NBYTES, half))  # NOTE: a C loop; a kvstore get of 16 blocks has 960


def contiguous(frame: Frame) -> list[tuple[BlockSpan, memoryview, memoryview]]:
    """The spans of a frame whose halves are one buffer each (checked_frame's
    `gather=False`), for a transport that moves a span as one region."""
    return [(span, k[0], v[0]) for span, k, v in frame.spans]


def checksum(k: Half, v: Half) -> int:
    """xxh3_64 of K then V, whatever pieces they are in (the same as of the joined bytes)."""
    digest = xxhash.xxh3_64()
    for half in (k, v):
        # NOTE: any contiguous buffer hashes as its bytes: no flat views made for it; and
        # the pieces are fed in a C loop (a kvstore get of 16 blocks hashes 960 of them)
        deque(map(digest.update, half if isinstance(half, (tuple, list)) else (half,)), 0)
    return digest.intdigest()


def check_request_id(request_id: str) -> None:
    if len(request_id.encode()) > MAX_REQUEST_ID:
        raise ValueError(f"request id longer than {MAX_REQUEST_ID} bytes")


def checked_frame(
    request_id: str, layer: int, spans: Sequence[SpanBytes], gather: bool = True, layers: int = 1
) -> Frame:
    """The frame with flat byte views; ValueError (in the caller's thread, before anything
    is queued) for whatever the wire cannot carry, or halves in pieces and frames of
    several layers unless the transport `gather`s them."""
    check_request_id(request_id)
    frame = Frame(request_id, layer, tuple((s, pieces(k), pieces(v)) for s, k, v in spans), layers)
    if layer < 0 or layers < 1 or layer + layers > MAX_LAYERS:
        raise ValueError(f"layers {layer}..{layer + layers - 1} out of range")
    if not gather and layers > 1:
        raise ValueError("this transport sends one layer a frame")
    for span, k, v in frame.spans:
        if not gather and max(len(k), len(v)) > 1:
            raise ValueError(f"{span}: this transport sends each half as one buffer")
        k_bytes, v_bytes = size(k), size(v)
        if k_bytes != v_bytes or k_bytes > MAX_HALF_BYTES or k_bytes % layers:
            raise ValueError(f"{span}: K has {k_bytes} bytes, V has {v_bytes}")
        if not (
            max(span.block_id, span.offset, span.num_tokens) < U32
            and span.block_hash < U64
            and min(span.block_id, span.offset, span.num_tokens, span.block_hash) >= 0
        ):
            raise ValueError(f"{span} does not fit the wire format")
    return frame
