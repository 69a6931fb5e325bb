"""Same host: a kvstore's get answered where the blocks lie, in its shared-memory arena.

Right after an asker's ring for answers was taken (`ring`: the two share a host and a
/dev/shm), the kvstore tells the asker where its DRAM tier lives (an ARENA record: its
pid, the arena's fd, size and a cookie at its start; all zero when it has none). The asker
maps /proc/<pid>/fd/<fd> read-only, checks size, owner and cookie, and answers YES or NO.

From then on a get whose blocks all lie in the arena is answered with the answer, one
PLACED message and the END, with no KV frame:

    PLACED  header: kind PLACED, the request id, layers 0..n-1, count = blocks
            body:   the request id, PLACED_HEAD (slot bytes, tokens a block),
                    an ENTRY per block (the asker's block id, the arena slot, xxh3_64 of
                    the block's bytes, taken by the kvstore when the block was committed)

The asker (`arena_view`) hashes each block's bytes where they lie and compares: a
damaged, short or foreign block makes the get's frames bad (a miss), never used. It copies
each run of consecutive block ids into the memory its sink names a group of layers at a
time (`layer_groups`, as frames carry them), reporting each group as a frame of its
layers, so a big get's first layers are usable while the rest copy. It then sends DONE,
and only then does the kvstore unpin the blocks: until then no put can reuse their slots.

A put goes the other way through the asker's own ring (`placed_puts`), which the kvstore
maps too: the asker copies its blocks there whole (a run of them with one copy), hashes
each, and sends one PLACED message per half ring at most, its ring position after it
(each ENTRY's slot is then the block's index in that part of the ring, its block id the
put's slot); the kvstore copies each block into the slot's memory, hashes it there and
reports it as a frame of every layer (a damaged block is never committed), then answers
how far it has read, as a ring's reader does. The END follows the last of them. The
asker never writes the kvstore's memory.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from shared.transfer.common.frames import ProtocolError
from shared.transfer.common.sockets import recv_exact
from shared.transfer.tcp.wire import (
    HEADER,
    KIND_PLACED,
    MAGIC,
    VERSION,
    check_header,
    pack_layers,
    unpack_layers,
)

ARENA_BASE = 4096  # the cookie, then (page-aligned) the slots
ARENA = struct.Struct("<IIQ16s")  # pid, fd, size, cookie; all zero: no arena
PLACED_HEAD = struct.Struct("<QI")  # slot bytes, tokens a block
ENTRY = struct.Struct("<IIQ")  # the asker's block id, the arena slot, the block's checksum
YES, NO = b"\x01", b"\x00"
DONE = b"\x02"  # the asker has read a PLACED get's blocks: the kvstore may unpin them


@dataclass(frozen=True)
class ArenaOffer:
    pid: int
    fd: int
    size: int
    cookie: bytes


@dataclass(frozen=True)
class Placement:
    """A PLACED message, parsed."""

    request_id: str
    layers: range
    slot_bytes: int
    block_tokens: int
    entries: tuple[tuple[int, int, int], ...]  # (block id, slot, checksum)

    @property
    def half_bytes(self) -> int:
        return self.slot_bytes // (2 * len(self.layers))

    @property
    def nbytes(self) -> int:
        return self.slot_bytes * len(self.entries)


# -- the handshake: after the asker's ring for answers was taken -----------------------------


def offer_arena(sock: socket.socket, offer: ArenaOffer | None) -> bool:
    """The kvstore's side: tell the asker where its arena is; True when it mapped it."""
    if offer is None:
        sock.sendall(ARENA.pack(0, 0, 0, bytes(16)))
        return False
    sock.sendall(ARENA.pack(offer.pid, offer.fd, offer.size, offer.cookie))
    answer = recv_exact(sock, 1)
    if answer not in (YES, NO):
        raise ProtocolError(f"an arena offer answered {answer!r}")
    return answer == YES


# -- the PLACED message ----------------------------------------------------------------------


def encode_placed(
    request_id: str,
    num_layers: int,
    slot_bytes: int,
    block_tokens: int,
    entries: Sequence[tuple[int, int, int]],
) -> bytes:
    """A PLACED message: header and body."""
    rid = request_id.encode()
    table = b"".join(ENTRY.pack(*entry) for entry in entries)
    body = rid + PLACED_HEAD.pack(slot_bytes, block_tokens) + table
    layers = pack_layers(0, num_layers)
    header = HEADER.pack(MAGIC, VERSION, KIND_PLACED, len(rid), layers, len(entries), len(body))
    return header + body


def read_placed(sock: socket.socket, header: bytes) -> Placement:
    """A PLACED message whose header was read: its body read and parsed."""
    _, rid_len, layers, count, body = check_header(header)
    return parse_placed(recv_exact(sock, body), rid_len, unpack_layers(layers), count)


def parse_placed(body: bytes, rid_len: int, layers: range, count: int) -> Placement:
    if len(body) != rid_len + PLACED_HEAD.size + count * ENTRY.size or not count:
        raise ProtocolError(f"a PLACED body of {len(body)} bytes for {count} blocks")
    slot_bytes, block_tokens = PLACED_HEAD.unpack_from(body, rid_len)
    if not block_tokens or not slot_bytes or slot_bytes % (2 * len(layers)) or layers.start:
        raise ProtocolError(f"absurd PLACED head ({slot_bytes} bytes, {block_tokens} tokens)")
    entries = tuple(ENTRY.iter_unpack(body[rid_len + PLACED_HEAD.size :]))
    return Placement(
        body[:rid_len].decode(errors="replace"), layers, slot_bytes, block_tokens, entries
    )
