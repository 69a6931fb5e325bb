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

The asker hashes each block's bytes where they lie and compares: a damaged, short or
foreign block makes the get's frames bad (a miss), never used. It copies each run of
consecutive block ids into the memory its sink names a group of layers at a time
(`layer_groups`, as frames carry them), reporting each group as a frame of its layers, so
a big get's first layers are usable while the rest copy. It then sends DONE, and only
then does the kvstore unpin the blocks: until then no put can reuse their slots.

A put goes the other way through the asker's own ring, which the kvstore maps too: the
asker copies its blocks there whole (a run of them with one copy), hashes each, and sends
one PLACED message per half ring at most, its ring position after it (each ENTRY's slot
is then the block's index in that part of the ring, its block id the put's slot); the
kvstore copies each block into the slot's memory, hashes it there and reports it as a
frame of every layer (a damaged block is never committed), then answers how far it has
read, as a ring's reader does. The END follows the last of them. The asker never writes
the kvstore's memory.
"""

from __future__ import annotations

import logging
import mmap
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import xxhash

from shared.transfer.base import BlockSpan, KVSink, layer_groups
from shared.transfer.common.frames import Frame, Pieces, ProtocolError
from shared.transfer.common.receiver import call_sink, layer_destinations
from shared.transfer.common.sockets import recv_exact
from shared.transfer.tcp.ring import POSITION, RingWriter, copy_into
from shared.transfer.tcp.wire import HEADER, KIND_PLACED, MAGIC, VERSION, pack_layers

log = logging.getLogger(__name__)

ARENA_BASE = 4096  # the cookie, then (page-aligned) the slots
ARENA = struct.Struct("<IIQ16s")  # pid, fd, size, cookie; all zero: no arena
PLACED_HEAD = struct.Struct("<QI")  # slot bytes, tokens a block
ENTRY = struct.Struct("<IIQ")  # the asker's block id, the arena slot, the block's checksum
YES, NO = b"\x01", b"\x00"
DONE = b"\x02"  # the asker has read a PLACED get's blocks: the kvstore may unpin them


# (layers, spans, bytes copied, error): a group of layers of a placed get landed (error
# "": intact), or not
Report = Callable[[range, tuple[BlockSpan, ...], int, str], None]


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


def take_arena(sock: socket.socket) -> ArenaView | None:
    """The asker's side: map the arena the kvstore names, if this process can see it."""
    pid, fd, size, cookie = ARENA.unpack(recv_exact(sock, ARENA.size))
    if not size:
        return None
    view = ArenaView.shared(pid, fd, size, cookie)
    sock.sendall(YES if view is not None else NO)
    return view


class ArenaView:
    """An asker's read-only mapping of a kvstore's arena: one per arena in a process,
    shared by its connections to that kvstore (a page is mapped once, not once a
    connection), unmapped when the last of them closes (a stopped kvstore's memory is not
    kept alive by it)."""

    _lock = threading.Lock()
    _mapped: ClassVar[dict[tuple[int, int, bytes], ArenaView]] = {}

    def __init__(self, mapping: mmap.mmap, key: tuple[int, int, bytes]) -> None:
        self.mapping = mapping
        self.key = key
        self.users = 1
        self.data = memoryview(mapping)
        self.array = np.frombuffer(mapping, np.uint8)

    @classmethod
    def shared(cls, pid: int, fd: int, size: int, cookie: bytes) -> ArenaView | None:
        """This process's mapping of the arena, made now or by another connection."""
        key = (pid, fd, cookie)
        with cls._lock:
            view = cls._mapped.get(key)
            if view is not None:
                view.users += 1
                return view
        view = cls.open(pid, fd, size, cookie)
        if view is None:
            return None
        with cls._lock:
            mapped = cls._mapped.setdefault(key, view)
            if mapped is not view:
                mapped.users += 1
        if mapped is not view:  # another connection mapped it meanwhile
            view._unmap()
        return mapped

    @classmethod
    def open(cls, pid: int, fd: int, size: int, cookie: bytes) -> ArenaView | None:
        """The arena, if /proc/<pid>/fd/<fd> is that very file: a regular file of this
        user, of the size offered, with the cookie at its start (another pid namespace or
        another user's process fails one of these)."""
        if size <= ARENA_BASE:
            return None
        try:
            handle = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            info = os.fstat(handle)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                return None
            if info.st_size != size:
                return None
            mapping = mmap.mmap(handle, size, mmap.MAP_SHARED, mmap.PROT_READ)
        except OSError:
            return None
        finally:
            os.close(handle)
        if mapping[: len(cookie)] != cookie:
            mapping.close()
            return None
        return cls(mapping, (pid, fd, cookie))

    def slots(self, slot_bytes: int, layers: int) -> np.ndarray:
        """The arena as [slot, layer's K or V, byte] for blocks of `slot_bytes`."""
        count = (len(self.array) - ARENA_BASE) // slot_bytes
        half = slot_bytes // (2 * layers)
        stop = ARENA_BASE + count * slot_bytes
        return self.array[ARENA_BASE:stop].reshape(count, 2 * layers, half)

    def land(self, sink: KVSink, placement: Placement, report: Report) -> None:
        """Check each placed block's checksum where it lies, then copy the blocks into the
        sink's memory a group of layers at a time (a run of consecutive block ids in
        consecutive slots with one copy where the sink names it as one array), reporting
        each group as it lands: a big get's first layers are usable while the rest copy.
        Damaged blocks are copied nowhere; their groups are reported bad."""
        slots = self.slots(placement.slot_bytes, len(placement.layers))
        if any(slot >= len(slots) for _, slot, _ in placement.entries):
            raise ProtocolError(f"a block placed outside the arena of {placement.request_id}")
        runs = [
            (BlockSpan(run[0][0], 0, len(run) * placement.block_tokens), run[0][1], len(run))
            for run in _runs(placement.entries)
        ]
        spans = tuple(span for span, _, _ in runs)
        damaged = self._verify(placement)
        layer_bytes = 2 * placement.half_bytes * len(placement.entries)
        for layers in layer_groups(len(placement.layers), layer_bytes):
            error = damaged
            for span, first, count in runs if not damaged else ():
                if not _copy_run(sink, placement, span, slots[first : first + count], layers):
                    error = "destination refused or wrong size"
            report(layers, spans, 0 if damaged else len(layers) * layer_bytes, error)

    def _verify(self, placement: Placement) -> str:
        size = placement.slot_bytes
        for _, slot, digest in placement.entries:
            at = ARENA_BASE + slot * size
            if xxhash.xxh3_64_intdigest(self.data[at : at + size]) != digest:
                return "checksum mismatch"
        return ""

    def close(self) -> None:
        """A connection is done with it; the last one unmaps it."""
        with self._lock:
            self.users -= 1
            if self.users or self._mapped.get(self.key) is not self:
                return
            del self._mapped[self.key]
        self._unmap()

    def _unmap(self) -> None:
        self.data.release()
        self.array = np.empty(0, np.uint8)
        try:
            self.mapping.close()
        except BufferError:  # a view of it still lives: unmapped when the last one goes
            pass


def _runs(entries: Sequence[tuple[int, int, int]]) -> list[list[tuple[int, int, int]]]:
    """The entries cut into runs whose block ids and slots are both consecutive: a span of
    whole blocks, read by slicing the arena (a request's blocks, put together, usually
    lie in consecutive slots)."""
    runs: list[list[tuple[int, int, int]]] = []
    for entry in entries:
        last = runs[-1][-1] if runs else None
        if last is not None and entry[0] == last[0] + 1 and entry[1] == last[1] + 1:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return runs


def _copy_run(
    sink: KVSink, placement: Placement, span: BlockSpan, blocks: np.ndarray, layers: range
) -> bool:
    """`layers` of a run's blocks ([block, layer's K or V, byte]) into the sink's memory
    for `span`: with one copy where the sink names the span as one array, else layer by
    layer."""
    source = blocks[:, 2 * layers.start : 2 * layers.stop]
    whole = getattr(sink, "span_array", None)
    if whole is not None:
        dest = call_sink(whole, placement.request_id, span)
        return isinstance(dest, np.ndarray) and _copy_whole(
            dest[layers.start : layers.stop], source
        )
    half = placement.half_bytes
    dests = layer_destinations(sink, placement.request_id, layers, span, len(blocks) * half)
    if any(dest is None for dest in dests):
        return False
    for i, dest in enumerate(dests):
        for h, pieces in enumerate(dest):  # type: ignore[arg-type]
            _scatter(source[:, 2 * i + h], pieces)
    return True


def _copy_whole(dest: np.ndarray, blocks: np.ndarray) -> bool:
    """[block, layer's K or V, byte] into a sink's [layer, K or V, block, byte]."""
    count, halves, half = blocks.shape
    source = blocks.transpose(1, 0, 2).reshape(halves // 2, 2, count, half)
    if dest.shape != source.shape or dest.dtype != np.uint8:
        return False
    np.copyto(dest, source)
    return True


def _scatter(source: np.ndarray, pieces: Pieces) -> None:
    """One layer's K or V of a run's blocks ([block, byte]) into `pieces`, in order:
    straight into one flat piece, else through a copy."""
    if len(pieces) == 1:
        np.copyto(np.frombuffer(pieces[0], np.uint8).reshape(source.shape), source)
        return
    flat, at = source.reshape(-1), 0
    for piece in pieces:
        np.frombuffer(piece, np.uint8)[:] = flat[at : at + piece.nbytes]
        at += piece.nbytes


# -- a put's blocks through the asker's ring ---------------------------------------------------


@dataclass(frozen=True)
class BlocksOut:
    """A put's blocks as an asker sends them: whole through its ring where the receiver took
    it (`place_blocks`), else `frames()` over the socket."""

    frames: Callable[[], Sequence[Frame]]
    runs: Sequence[tuple[int, np.ndarray]]  # (first slot, the run as [layer, K or V, block, byte])
    block_tokens: int

    @property
    def slot_bytes(self) -> int:
        layers, halves, _, half = self.runs[0][1].shape
        return layers * halves * half


def place_blocks(sock: socket.socket, writer: RingWriter, request_id: str, out: BlocksOut) -> int:
    """Copy the put's blocks into the ring, whole, a part of at most half the ring at a
    time, and send each part's PLACED message and position; returns how many parts."""
    size = out.slot_bytes
    parts = _parts(out.runs, max(1, writer.size // 2 // size))
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
        message = encode_placed(request_id, layers, size, out.block_tokens, entries)
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
