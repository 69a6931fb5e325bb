"""Pages of the DRAM tier's arena made ready ahead of the puts that will fill them.

A page of the arena's memfd is allocated and zeroed by the kernel when it is first
written, and on this path that costs more than the put's copy itself (a put into fresh
memory ran at a third of one into recycled slots: docs/benchmarks.md, "kvstore"). A
thread keeps the next `AHEAD_BYTES` past the slots handed out populated, so puts land in
pages that exist: the cost moves off the put, onto a thread that runs while the store
waits for its next frame. Memory beyond what blocks use stays bounded by `AHEAD_BYTES`.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading

log = logging.getLogger(__name__)

# NOTE: a 2,048-token request's write-back of SmolLM2's KV is 47 MB in bfloat16, 94 MB in
# float32; 128 MiB keeps one such burst on ready pages while the thread catches up.
AHEAD_BYTES = 128 << 20
CHUNK_BYTES = 8 << 20  # one madvise call: a few ms, so a stop is seen soon
MADV_POPULATE_WRITE = 23  # Linux 5.14; Python's mmap module does not name it

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class PageWarmer:
    """Populates [0, size) of a shared mapping at `address` (fd `fd`), in order, never
    further than `AHEAD_BYTES` past the mark `want` was last given. Thread-safe."""

    def __init__(self, address: int, fd: int, size: int) -> None:
        self.address, self.fd, self.size = address, fd, size
        self.ready = 0  # bytes from the start populated
        self._wanted = min(size, AHEAD_BYTES)
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="arena-warmer", daemon=True)
        self._thread.start()

    def want(self, used_bytes: int) -> None:
        """Bytes from the start are in use up to `used_bytes`: keep ahead of it."""
        target = min(self.size, _page_up(used_bytes + AHEAD_BYTES))
        if target <= self._wanted:
            return
        with self._wake:
            self._wanted = target
            self._wake.notify()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._warm()
        except OSError as e:  # out of memory, or a kernel with neither call: lazy pages
            log.warning("arena pages stay lazy (%s); puts into fresh memory pay for them", e)
        except Exception:
            log.exception("the arena's page warmer failed; puts into fresh memory pay for pages")

    def _warm(self) -> None:
        populate = self._madvise
        while self.ready < self.size:
            stop = self._next_stop()
            try:
                populate(self.ready, stop - self.ready)
            except OSError as e:
                if e.errno != errno.EINVAL or populate == self._fallocate:
                    raise
                populate = self._fallocate  # a kernel before 5.14: page cache only
                continue
            self.ready = stop

    def _next_stop(self) -> int:
        """Where the next chunk ends, once there is one to warm."""
        with self._wake:
            while self._wanted <= self.ready:
                self._wake.wait()
            return min(self._wanted, self.ready + CHUNK_BYTES)

    def _madvise(self, start: int, length: int) -> None:
        # NOTE: ctypes lets the GIL go for the call, so the store's threads run meanwhile.
        if _libc.madvise(self.address + start, length, MADV_POPULATE_WRITE) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    def _fallocate(self, start: int, length: int) -> None:
        os.posix_fallocate(self.fd, start, length)


def _page_up(nbytes: int) -> int:
    # NOTE: each chunk starts where the last one stopped, and madvise wants it page-aligned.
    return -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
