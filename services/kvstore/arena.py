"""The DRAM tier's memory in one shared-memory file, so that a worker on this host reads a
get's blocks where they lie (shared/transfer/tcp/placed.py) instead of through a copy.

The file is a memfd (no name in /dev/shm, so no tmpfs quota and no SIGBUS on a full
/dev/shm); a worker that proved the data token on a connection, and showed it shares this
host by taking that connection's ring, is told this process's pid, the fd and a cookie,
and maps /proc/<pid>/fd/<fd> read-only. Its pages are made ready a little ahead of the
slots first written (services/kvstore/warmer.py) and kept afterwards, so no put waits
for the kernel to zero a page.

Slots all have the size of the first block allocated (a kvstore serves one model's
layout in practice); a block of another size, or one that finds no free slot, gets
private memory and is served through the ring or the socket as before.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
import threading

import numpy as np

from services.kvstore.warmer import PageWarmer
from shared.transfer.tcp.placed import ARENA_BASE, ArenaOffer

log = logging.getLogger(__name__)


class BlockArena:
    """Slots of one block size in a shared-memory file. Thread-safe."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.fd = os.memfd_create("kvstack-kvstore-blocks", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, ARENA_BASE + capacity)
            self.mapping = mmap.mmap(self.fd, ARENA_BASE + capacity)
        except OSError:
            os.close(self.fd)
            raise
        self.cookie = secrets.token_bytes(16)
        self.mapping[: len(self.cookie)] = self.cookie
        self.slot_bytes = 0  # set by the first allocation
        self.num_slots = 0
        self._next = 0  # slots below it have been handed out at least once
        self._free: list[int] = []
        self._lock = threading.Lock()
        address = np.frombuffer(self.mapping, np.uint8).ctypes.data
        self.warmer = PageWarmer(address, self.fd, ARENA_BASE + capacity)

    @classmethod
    def create(cls, capacity: int) -> BlockArena | None:
        """An arena of `capacity` bytes, or None where this system has no memfd (the DRAM
        tier then allocates each block privately)."""
        if capacity <= 0 or not hasattr(os, "memfd_create"):
            return None
        try:
            return cls(capacity)
        except OSError as e:
            log.warning("no shared-memory arena for the DRAM tier (%s): gets copy", e)
            return None

    def offer(self) -> ArenaOffer:
        return ArenaOffer(os.getpid(), self.fd, ARENA_BASE + self.capacity, self.cookie)

    def allocate(self, nbytes: int) -> tuple[int, np.ndarray] | None:
        """(slot, its bytes) for a block of `nbytes`, or None (another size, or no slot)."""
        with self._lock:
            if not self.slot_bytes:
                self.slot_bytes, self.num_slots = nbytes, self.capacity // nbytes
            if nbytes != self.slot_bytes:
                return None
            if self._free:
                slot = self._free.pop()
            elif self._next < self.num_slots:
                slot, self._next = self._next, self._next + 1
            else:
                return None
        offset = ARENA_BASE + slot * nbytes
        self.warmer.want(offset + nbytes)
        return slot, np.frombuffer(self.mapping, np.uint8, nbytes, offset)

    def free(self, slot: int) -> None:
        """Give a slot back; its buffer must not be used any more."""
        with self._lock:
            self._free.append(slot)
