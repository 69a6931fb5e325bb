"""The asker's side of a kvstore's gets read where the blocks lie (`placed`): its
mapping of the kvstore's arena, and the blocks copied out of it into the asker's sink."""

from __future__ import annotations

import logging
import mmap
import os
import socket
import stat
import threading
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np
import xxhash

from shared.transfer.base import BlockSpan, KVSink, layer_groups
from shared.transfer.common.frames import Pieces, ProtocolError
from shared.transfer.common.receiver import call_sink, layer_destinations
from shared.transfer.common.sockets import recv_exact
from shared.transfer.tcp.placed import ARENA, ARENA_BASE, NO, YES, Placement

log = logging.getLogger(__name__)

# (layers, spans, bytes copied, error): a group of layers of a placed get landed (error
# "": intact), or not
Report = Callable[[range, tuple[BlockSpan, ...], int, str], None]


def take_arena(sock: socket.socket) -> ArenaView | None:
    """The asker's side: map the arena the kvstore names, if this process can see it."""
    pid, fd, size, cookie = ARENA.unpack(recv_exact(sock, ARENA.size))
    if not size:
        return None
    view = ArenaView.shared(pid, fd, size, cookie)
    if view is None:  # another pid namespace, user or host: its gets come through the ring
        log.info("cannot map the arena of process %d: gets come through the ring", pid)
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
