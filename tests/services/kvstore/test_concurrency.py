"""Several threads putting and reading at once: counts stay consistent, bytes stay right,
with blocks in private memory or in the shared arena's recycled slots."""

from __future__ import annotations

import random
import threading

import pytest
import xxhash

from services.kvstore import tiers
from services.kvstore.arena import BlockArena
from services.kvstore.blockfile import HEADER_SIZE
from services.kvstore.store import BlockStore
from tests.services.kvstore.blocks import BLOCK, LAYOUT, content, fill, put


def worker(store: BlockStore, seed: int, errors: list[str], rounds: int = 150) -> None:
    rng = random.Random(seed)
    for _ in range(rounds):
        block_hash = rng.randrange(40)
        if rng.random() < 0.5:
            ref = store.reserve(block_hash, LAYOUT)
            if ref is not None:
                fill(ref, content(block_hash))
                store.abandon(ref) if rng.random() < 0.1 else store.commit(ref)
            continue
        refs = store.acquire([block_hash, rng.randrange(40)], LAYOUT)
        for ref in refs:
            if ref is not None and bytes(ref.data()) != content(ref.block_hash):
                errors.append(f"block {ref.block_hash} served wrong bytes")
            if ref is not None and ref.slot >= 0 and ref.checksum not in (0, _digest(ref)):
                errors.append(f"block {ref.block_hash} has a stale checksum")
        store.release(refs)


def _digest(ref) -> int:
    return xxhash.xxh3_64_intdigest(content(ref.block_hash))


def run_threads(store: BlockStore, num_threads: int = 6) -> list[str]:
    errors: list[str] = []
    threads = [
        threading.Thread(target=worker, args=(store, seed, errors)) for seed in range(num_threads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "a worker hung"
    return errors


def check_consistent(store: BlockStore, stored: set[int], tmp_path=None) -> None:
    stats = store.stats()
    assert stats["dram_pending_blocks"] == 0  # nothing left pinned for writing
    assert stats["dram_bytes"] == stats["dram_blocks"] * BLOCK <= stats["dram_capacity"]
    assert stats["disk_bytes"] <= stats["disk_capacity"]
    assert stats["dram_misses"] == stats["disk_hits"] + stats["disk_misses"]
    present = {h for h, here in zip(range(40), store.lookup(range(40))) if here}
    assert present == stored  # the events tell the truth
    if tmp_path is not None:
        assert sum(p.stat().st_size for p in tmp_path.iterdir()) == stats["disk_bytes"]
        assert not list(tmp_path.glob("*.tmp"))


def replay(store: BlockStore, stored: set[int]) -> None:
    added, removed = store.take_events()
    stored.difference_update(removed)
    stored.update(added)


def arena_of(in_arena: bool, dram_bytes: int) -> BlockArena | None:
    return BlockArena.create(dram_bytes) if in_arena else None


@pytest.mark.parametrize("in_arena", [False, True], ids=["private", "arena"])
def test_threads_with_dram_only_keep_counts_consistent(in_arena):
    store = BlockStore(dram_bytes=10 * BLOCK, arena=arena_of(in_arena, 10 * BLOCK))
    assert run_threads(store) == []
    stored: set[int] = set()
    replay(store, stored)
    check_consistent(store, stored)
    assert store.stats()["dram_evictions"] > 0


@pytest.mark.parametrize("in_arena", [False, True], ids=["private", "arena"])
def test_threads_with_an_ssd_keep_counts_consistent(tmp_path, in_arena):
    store = BlockStore(
        dram_bytes=6 * BLOCK,
        disk_dir=tmp_path,
        disk_bytes=20 * (BLOCK + 64),
        arena=arena_of(in_arena, 6 * BLOCK),
    )
    stored: set[int] = set()
    stop = threading.Event()

    def drain_events() -> None:  # the service's housekeeping
        while not stop.is_set():
            replay(store, stored)

    drainer = threading.Thread(target=drain_events)
    drainer.start()
    errors = run_threads(store)
    stop.set()
    drainer.join()
    replay(store, stored)
    assert errors == []
    check_consistent(store, stored, tmp_path)
    stats = store.stats()
    assert stats["promotions"] > 0 and stats["demotions"] > 0
    misses = []
    for block_hash in sorted(stored):  # every stored block reads back...
        (ref,) = store.acquire([block_hash], LAYOUT)
        if ref is None:
            misses.append(block_hash)
            continue
        assert bytes(ref.data()) == content(block_hash)
        store.release([ref])
    # ... unless promoting the ones before it pushed it off a full SSD, which events say
    assert set(misses) <= set(store.take_events()[1])
    assert len(misses) < len(stored)


def test_a_block_read_while_being_demoted_stays_visible_and_kept(tmp_path, monkeypatch):
    store = BlockStore(2 * BLOCK, tmp_path, 4 * (BLOCK + HEADER_SIZE))
    put(store, 1)
    put(store, 2)
    writing, go_on = threading.Event(), threading.Event()
    real_write = tiers.write_block_file

    def slow_write(directory, header, payload):
        if header.block_hash == 1:
            writing.set()
            go_on.wait(5)
        return real_write(directory, header, payload)

    monkeypatch.setattr(tiers, "write_block_file", slow_write)
    reserved = []
    writer = threading.Thread(target=lambda: reserved.append(store.reserve(3, LAYOUT)))
    writer.start()
    assert writing.wait(5)  # 1 is being demoted, the lock is free
    assert store.lookup([1, 2]) == [True, True]  # ... and it stays visible meanwhile
    (ref,) = store.acquire([1], LAYOUT)  # a reader pins it mid-demotion
    go_on.set()
    writer.join(5)
    assert reserved[0] is not None  # room came from 2 instead
    assert bytes(ref.data()) == content(1)
    stats = store.stats()
    assert (stats["dram_evictions"], stats["demotions"], stats["disk_blocks"]) == (1, 1, 2)
    assert stats["dram_bytes"] == 2 * BLOCK
    store.release([ref])
    store.abandon(reserved[0])
