"""The arena's pages are made ready ahead of the slots handed out, never much further, and
by fallocate where the kernel lacks MADV_POPULATE_WRITE."""

from __future__ import annotations

import errno
import mmap
import os
import time

import pytest

from services.kvstore import warmer
from services.kvstore.arena import BlockArena
from shared.transfer.tcp.placed import ARENA_BASE

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd here")
PAGE = mmap.PAGESIZE
SLOT = 16 * PAGE


def resident_bytes(arena: BlockArena) -> int:
    return os.fstat(arena.fd).st_blocks * 512  # a memfd counts the pages it holds


def settled(arena: BlockArena, ready: int) -> int:
    """The warmer's mark once it reached `ready` (or after 5 s)."""
    deadline = time.monotonic() + 5
    while arena.warmer.ready < ready and time.monotonic() < deadline:
        time.sleep(0.01)
    return arena.warmer.ready


def test_a_small_arena_is_ready_whole_before_its_first_put() -> None:
    arena = BlockArena(8 * SLOT)
    arena.warmer.join(timeout=5)  # nothing left to warm: the thread ends
    assert arena.warmer.ready == ARENA_BASE + 8 * SLOT
    assert resident_bytes(arena) >= ARENA_BASE + 8 * SLOT


def test_pages_are_ready_ahead_of_the_slots_handed_out_and_no_further(monkeypatch) -> None:
    monkeypatch.setattr(warmer, "AHEAD_BYTES", 4 * SLOT)
    monkeypatch.setattr(warmer, "CHUNK_BYTES", SLOT)
    arena = BlockArena(64 * SLOT)
    assert settled(arena, 4 * SLOT) == 4 * SLOT
    time.sleep(0.1)  # had it no bound, it would go on now
    assert arena.warmer.ready == 4 * SLOT and resident_bytes(arena) == 4 * SLOT
    for _ in range(10):
        arena.allocate(SLOT)
    used = ARENA_BASE + 10 * SLOT
    assert settled(arena, used + 4 * SLOT) == used + 4 * SLOT
    time.sleep(0.1)
    assert resident_bytes(arena) == used + 4 * SLOT


def test_a_kernel_without_populate_gets_its_pages_by_fallocate(monkeypatch) -> None:
    calls = []

    def refused(self, start: int, length: int) -> None:
        calls.append(start)
        raise OSError(errno.EINVAL, "no MADV_POPULATE_WRITE")

    monkeypatch.setattr(warmer.PageWarmer, "_madvise", refused)
    arena = BlockArena(8 * SLOT)
    arena.warmer.join(timeout=5)
    assert calls == [0]  # asked once, then never again
    assert arena.warmer.ready == ARENA_BASE + 8 * SLOT
    assert resident_bytes(arena) >= ARENA_BASE + 8 * SLOT
