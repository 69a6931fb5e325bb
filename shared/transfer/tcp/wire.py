"""The frame format: constants, header and span records, and how frames are encoded and
decoded (see the package docstring for the layout)."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from shared.transfer.base import BlockSpan
from shared.transfer.common.frames import (
    MAX_HALF_BYTES,
    MAX_REQUEST_ID,
    Frame,
    Pieces,
    ProtocolError,
    checksum,
    size,
)
from shared.transfer.common.handshake import Greeting

MAGIC = 0x5453564B  # b"KVST" read as little endian
# 2: a frame may carry several layers; 3: a ring in shared memory (`ring`); 4: asks and
# answers on the data connection (`asking`); 5: an asker's ring for its answers; 6: a
# kvstore's gets answered where the blocks lie in its shared-memory arena (`placed`)
VERSION = 6
KIND_KV, KIND_KV_MORE, KIND_END, KIND_RING, KIND_ASK, KIND_ANSWER = 1, 2, 3, 4, 5, 6
KIND_PLACED = 7
HEADER = struct.Struct("<IBBHIIQ")  # magic, version, kind, id length, layers, count, body bytes
SPAN = struct.Struct("<IIIQQQ")  # block id, offset, tokens, bytes per half, block hash, checksum
GREETING = Greeting(MAGIC, VERSION, f"kvstack v{VERSION}")
KINDS = (KIND_KV, KIND_KV_MORE, KIND_END, KIND_RING, KIND_ASK, KIND_ANSWER, KIND_PLACED)
NOTES = (KIND_ASK, KIND_ANSWER)  # a body of a peer's own encoding; no request id, no spans

PART_BYTES = 1 << 20  # payload per wire part: hashed, then sent while still in L2
# NOTE: limits that make garbage fail fast (common.frames has those both transports share).
MAX_SPANS = 1 << 16
MAX_BODY_BYTES = 1 << 32
MAX_NOTE_BYTES = 1 << 24  # an ask's or an answer's body (a get of 65,536 blocks is 2 MB)
LAYER_BITS = 16  # the header's layers field: the first layer, then how many more above it


def blocks_per_part(layers: int, half_bytes: int) -> int:
    """Whole blocks (K and V of `layers` layers, `half_bytes` each) that fit one wire part:
    a span no longer is hashed whole right before it is sent, so it is still in cache when
    the send copies it (runs_of cannot cut a span)."""
    return max(1, PART_BYTES // (2 * layers * half_bytes))


def pack_layers(first: int, count: int) -> int:
    return first | (count - 1) << LAYER_BITS


def unpack_layers(field: int) -> range:
    first = field & ((1 << LAYER_BITS) - 1)
    return range(first, first + (field >> LAYER_BITS) + 1)


# --- encoding (sender) ----------------------------------------------------------------------


SpanPieces = tuple[BlockSpan, Pieces, Pieces]


def runs_of(spans: Sequence[SpanPieces], part_bytes: int) -> list[tuple[Sequence[SpanPieces], int]]:
    """Consecutive runs of spans and their payload bytes, each closed once it holds
    `part_bytes` or MAX_SPANS spans (one run at least, maybe empty)."""
    runs, start, nbytes = [], 0, 0
    for i, (_, k, v) in enumerate(spans):
        nbytes += size(k) + size(v)
        if nbytes >= part_bytes or i + 1 - start == MAX_SPANS:
            runs.append((spans[start : i + 1], nbytes))
            start, nbytes = i + 1, 0
    return runs + [(spans[start:], nbytes)] if start < len(spans) or not runs else runs


@dataclass(frozen=True, slots=True)
class Part:
    """One wire part of a frame, not yet encoded: its header fields and its spans."""

    kind: int
    rid: bytes
    layers: int  # as `pack_layers` makes it (a layer's number, for a frame of one)
    spans: Sequence[SpanPieces]
    payload_bytes: int  # its spans' K and V bytes (counted once, by `runs_of`)


def parts_of(frame: Frame, part_bytes: int = PART_BYTES) -> list[Part]:
    """The wire parts of a frame; each is encoded (and hashed) only when the sender is
    ready to send it, so its bytes are still in cache when they are copied."""
    rid = frame.request_id.encode()
    runs = runs_of(frame.spans, part_bytes)
    layers = pack_layers(frame.layer, frame.layers)
    return [
        Part(KIND_KV if i == len(runs) - 1 else KIND_KV_MORE, rid, layers, run, nbytes)
        for i, (run, nbytes) in enumerate(runs)
    ]


def encode_part(
    kind: int,
    rid: bytes,
    layers: int,
    spans: Sequence[SpanPieces],
    digests: Sequence[int] | None = None,
) -> list[memoryview]:
    """Header, span table and payload views of one wire part, checksums computed now
    unless `digests` has them (a ring's sender hashes its copy of the spans)."""
    if digests is None:
        digests = [checksum(k, v) for _, k, v in spans]
    table, payload, nbytes = [rid], list[memoryview](), 0
    for (span, k, v), digest in zip(spans, digests, strict=True):
        half = size(k)
        table.append(
            SPAN.pack(span.block_id, span.offset, span.num_tokens, half, span.block_hash, digest)
        )
        payload += k
        payload += v
        nbytes += half + size(v)
    body = len(rid) + len(spans) * SPAN.size + nbytes
    header = HEADER.pack(MAGIC, VERSION, kind, len(rid), layers, len(spans), body)
    return [memoryview(header + b"".join(table)), *payload]


def encode_kv(frame: Frame, part_bytes: int = PART_BYTES) -> Iterator[list[memoryview]]:
    """The wire parts of a frame, encoded lazily (`parts_of`)."""
    for part in parts_of(frame, part_bytes):
        yield encode_part(part.kind, part.rid, part.layers, part.spans)


def encode_ring_offer(offer_bytes: int, for_answers: bool = False) -> bytes:
    """The header of a RING message (its body, `offer_bytes` long, is `ring.OFFER`); its
    `count` says who writes: 0 the one who offers (a sender), 1 the one who takes it (the
    receiver an asker asks: it writes its answers' payload there)."""
    return HEADER.pack(MAGIC, VERSION, KIND_RING, 0, 0, int(for_answers), offer_bytes)


def encode_note(kind: int, body: bytes, frames_follow: bool = False) -> list[memoryview]:
    """An ASK or an ANSWER; an answer's `count` says whether a request's frames and its
    END follow it on the same connection."""
    return [
        memoryview(HEADER.pack(MAGIC, VERSION, kind, 0, 0, int(frames_follow), len(body)) + body)
    ]


def encode_end(request_id: str, num_frames: int) -> list[memoryview]:
    rid = request_id.encode()
    return [
        memoryview(HEADER.pack(MAGIC, VERSION, KIND_END, len(rid), 0, num_frames, len(rid)) + rid)
    ]


# --- decoding (receiver) --------------------------------------------------------------------


def check_header(raw: bytes) -> tuple[int, int, int, int, int]:
    """(kind, request-id length, layer, count, body bytes) of a header that makes sense."""
    magic, version, kind, rid_len, layer, count, body = HEADER.unpack(raw)
    if magic != MAGIC or version != VERSION or kind not in KINDS:
        raise ProtocolError(f"bad frame header {raw.hex()}")
    spans = count if kind in (KIND_KV, KIND_KV_MORE) else 0
    if kind in NOTES and (rid_len or count > 1 or layer or body > MAX_NOTE_BYTES):
        raise ProtocolError(f"absurd ask or answer header {raw.hex()}")
    if kind == KIND_RING and (rid_len or count > 1 or layer):
        raise ProtocolError(f"absurd ring offer header {raw.hex()}")
    if kind == KIND_PLACED and (not rid_len or not count or body > MAX_NOTE_BYTES):
        raise ProtocolError(f"absurd placed header {raw.hex()}")
    if (
        rid_len > MAX_REQUEST_ID
        or spans > MAX_SPANS
        or body > MAX_BODY_BYTES
        or body < rid_len + spans * SPAN.size
    ):
        raise ProtocolError(f"absurd frame header {raw.hex()}")
    return kind, rid_len, layer, count, body


def parse_spans(table: bytes) -> list[tuple[BlockSpan, int, int]]:
    """(span, bytes per half, checksum) of each SPAN record."""
    spans = []
    for block_id, offset, num_tokens, nbytes, block_hash, digest in SPAN.iter_unpack(table):
        if nbytes > MAX_HALF_BYTES:
            raise ProtocolError(f"span of {nbytes} bytes per half")
        spans.append((BlockSpan(block_id, offset, num_tokens, block_hash), nbytes, digest))
    return spans
