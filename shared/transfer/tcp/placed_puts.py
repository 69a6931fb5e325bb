"""A put's blocks whole through the asker's own ring (`placed`): the asker places them,
the kvstore takes each into its slot, checked where it landed."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

from shared.transfer.base import BlockSpan, KVSink
from shared.transfer.common.frames import Frame, ProtocolError
from shared.transfer.common.receiver import call_sink
from shared.transfer.tcp.placed import Placement, encode_placed
from shared.transfer.tcp.ring import POSITION, RingWriter, copy_into


@dataclass(frozen=True)
class BlocksOut:
    """A put's blocks as an asker sends them: whole through its ring where the receiver took
    it (`place_blocks`), else `frames()` over the socket. Either is made only when it goes
    (reading a GPU worker's blocks copies them to the host)."""

    frames: Callable[[], Sequence[Frame]]
    # (first slot, the run as [layer, K or V, block, byte]) of each run
    runs: Callable[[], Sequence[tuple[int, np.ndarray]]]
    num_layers: int
    slot_bytes: int  # a block's bytes
    block_tokens: int


def place_blocks(sock: socket.socket, writer: RingWriter, request_id: str, out: BlocksOut) -> int:
    """Copy the put's blocks into the ring, whole, a part of at most half the ring at a
    time, and send each part's PLACED message and position; returns how many parts."""
    size = out.slot_bytes
    parts = _parts(out.runs(), max(1, writer.size // 2 // size))
    ring = np.frombuffer(writer.data, np.uint8)
    for part in parts:
        nbytes = sum(blocks.shape[2] for _, blocks in part) * size
        start = writer.room(sock, nbytes)
        offset, entries = start % writer.size, list[tuple[int, int, int]]()
        for first_slot, blocks in part:
            layers, _, count, half = blocks.shape
            place = ring[offset : offset + count * size].reshape(count, layers, 2, half)
            np.copyto(place, blocks.transpose(2, 0, 1, 3))
            for i in range(count):
                at = offset + i * size
                digest = xxhash.xxh3_64_intdigest(writer.data[at : at + size])
                entries.append((first_slot + i, len(entries), digest))
            offset += count * size
        writer.head = start + nbytes
        message = encode_placed(request_id, out.num_layers, size, out.block_tokens, entries)
        sock.sendall(message + POSITION.pack(start))
    return len(parts)


def _parts(
    runs: Sequence[tuple[int, np.ndarray]], max_blocks: int
) -> list[list[tuple[int, np.ndarray]]]:
    """The runs cut into parts of at most `max_blocks` blocks (a run may be cut)."""
    parts: list[list[tuple[int, np.ndarray]]] = [[]]
    room = max_blocks
    for first_slot, blocks in runs:
        at = 0
        while at < blocks.shape[2]:
            if not room:
                parts.append([])
                room = max_blocks
            take = min(room, blocks.shape[2] - at)
            parts[-1].append((first_slot + at, blocks[:, :, at : at + take]))
            at, room = at + take, room - take
    return parts if parts[0] else []


def take_blocks(
    sink: KVSink, placement: Placement, part: memoryview
) -> tuple[tuple[BlockSpan, ...], str]:
    """The receiver's side of a put's PLACED part (`part`: its bytes in the ring): each
    block copied into the whole-block memory the sink names (`block_buffer`, told the
    checksum the block should have) and hashed there: (the blocks' spans, why they must not
    be kept, or "")."""
    size, error = placement.slot_bytes, ""
    if any(index >= len(placement.entries) for _, index, _ in placement.entries):
        raise ProtocolError(f"a put's block placed outside its part ({placement.request_id})")
    whole = getattr(sink, "block_buffer", None)
    for slot, index, digest in placement.entries:
        dest = None if whole is None else call_sink(whole, placement.request_id, slot, size, digest)
        if not (isinstance(dest, memoryview) and dest.nbytes == size and not dest.readonly):
            error = error or "destination refused or wrong size"
            continue
        copy_into(dest, part[index * size : (index + 1) * size])
        if xxhash.xxh3_64_intdigest(dest) != digest:
            error = error or "checksum mismatch"
    spans = tuple(BlockSpan(slot, 0, placement.block_tokens) for slot, _, _ in placement.entries)
    return spans, error
