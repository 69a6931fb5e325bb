"""The Mooncake Store pool against a real mooncake_master: blocks go in whole and come
back whole, a miss is a miss, and a damaged or partial object is absent, never served."""

from __future__ import annotations

import asyncio

import pytest
import torch

from shared.kvblocks import BlockLayout
from shared.kvcache.storage import KVStorage
from shared.kvpool.block_header import HEADER_SIZE
from shared.kvpool.mooncake_pool import MooncakePool
from shared.kvpool.mooncake_store import MooncakeBlockStore, MooncakeStoreConfig, block_key
from shared.transfer.inbox import KVInbox

NUM_BLOCKS = 8
LAYOUT = BlockLayout(num_layers=4, block_size=16, half_bytes=16 * 2 * 8 * 2)


def _storage(seed: int) -> KVStorage:
    storage = KVStorage(4, NUM_BLOCKS, 16, 2, 8, torch.bfloat16)
    torch.manual_seed(seed)
    storage.kv.copy_(torch.randn(storage.kv.shape))
    return storage


def _config(master: str) -> MooncakeStoreConfig:
    return MooncakeStoreConfig(master, segment_bytes=64 << 20)


@pytest.fixture(scope="module")
def store(mooncake_master):
    store = MooncakeBlockStore(_config(mooncake_master), LAYOUT)
    yield store
    store.close()


def _blocks(seed: int, n: int) -> list[bytes]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, 256, (LAYOUT.block_bytes,), generator=g, dtype=torch.uint8)
        .numpy()
        .tobytes()
        for _ in range(n)
    ]


def _put(store: MooncakeBlockStore, hashes: list[int], blocks: list[bytes]) -> int:
    def read(i: int, into: memoryview) -> None:
        into[:] = blocks[i]

    return store.put(hashes, read)


def _get(store: MooncakeBlockStore, hashes: list[int]) -> list[bytes] | None:
    got: dict[int, bytes] = {}
    whole = store.get(hashes, lambda i, payload: got.__setitem__(i, bytes(payload)))
    return [got[i] for i in range(len(hashes))] if whole else None


def test_blocks_round_trip_and_a_miss_is_a_miss(store) -> None:
    hashes, blocks = [101, 102, 103], _blocks(1, 3)
    assert store.present(hashes) == [False] * 3
    assert _put(store, hashes, blocks) == 3
    assert store.present([*hashes, 104]) == [True, True, True, False]
    assert _get(store, hashes) == blocks
    assert _put(store, hashes, blocks) == 0  # held already: nothing sent again
    assert _get(store, [101, 104]) is None  # one missing: the whole get misses


def test_damaged_or_partial_objects_are_absent(store) -> None:
    (good,) = _blocks(2, 1)
    assert _put(store, [201], [good]) == 1
    whole = store.client.get(block_key(201))
    flipped = bytearray(whole)
    flipped[HEADER_SIZE + 5] ^= 0xFF  # the payload no longer matches its checksum
    header_hit = bytearray(whole)
    header_hit[3] ^= 0xFF  # the header fails its own checksum
    for key, data in (
        (202, bytes(flipped)),
        (203, bytes(header_hit)),
        (204, whole[: len(whole) // 2]),  # partial
        (205, whole),  # another block's object under this key: the header names 201
    ):
        assert store.client.put(block_key(key), data) == 0
        assert store.present([key]) == [True]
        assert _get(store, [key]) is None, key
    assert _get(store, [201]) == [good]


def test_many_blocks_batch_through_the_staging_buffers(store) -> None:
    hashes = list(range(1000, 1000 + 150))  # more than STAGING_BLOCKS, in three batches
    blocks = _blocks(3, len(hashes))
    assert _put(store, hashes, blocks) == len(hashes)
    assert _get(store, hashes) == blocks


async def test_the_pool_moves_blocks_between_two_workers_kv(mooncake_master) -> None:
    writer_kv, reader_kv = _storage(1), _storage(2)
    loop = asyncio.get_running_loop()
    open_pool = lambda kv, name: MooncakePool.open(
        None,
        kv,
        KVInbox(kv, loop),
        _config(mooncake_master),
        name,  # type: ignore[arg-type]
    )
    writer, reader = await open_pool(writer_kv, "w"), await open_pool(reader_kv, "r")
    try:
        hashes = [301, 302, 303]
        sent: list[bool] = []
        assert await writer.put("put-1", hashes, [5, 6, 7], lambda: sent.append(True)) == 3
        assert sent == [True]
        assert await reader.longest_prefix([301, 302, 303, 304]) == 3
        loads = await reader.get("get-1", hashes, [0, 1, 2])
        assert loads is not None and loads[0].verdict() == ""
        assert loads[0].layers_done == set(range(LAYOUT.num_layers))
        assert torch.equal(reader_kv.kv[:, :, 0:3], writer_kv.kv[:, :, 5:8])
        before = reader_kv.kv[:, :, 4].clone()
        assert await reader.get("get-2", [301, 399], [3, 4]) is None  # a miss, nothing named
        assert reader.inbox.get("get-2") is None
        assert torch.equal(reader_kv.kv[:, :, 4], before)
    finally:
        await writer.close()
        await reader.close()


async def test_the_conductor_hears_the_pool_through_the_workers_reports(
    mooncake_master, secure_nats
) -> None:
    """A worker's pool beats as `<id>-mooncake` and publishes what it stored, allowed by
    that worker's own credentials; the conductor's index then finds the blocks in the pool."""
    from shared import subjects
    from shared.messages import Heartbeat, KVEvent
    from shared.runtime.bus import Bus
    from tests.shared.conductor.builders import conductor

    core = conductor(prefill=("prefill-7",))
    listener = await Bus.connect(secure_nats.url, "listener", secure_nats.auth())
    worker = await Bus.connect(secure_nats.url, "worker", secure_nats.auth("prefill", "prefill-7"))
    heard = asyncio.Event()

    async def on_beat(hb: Heartbeat) -> None:
        core.observe(hb)

    async def on_event(event: KVEvent) -> None:
        core.apply(event)
        heard.set()

    await listener.subscribe(subjects.all_heartbeats(), on_beat, expected=Heartbeat)
    await listener.subscribe(subjects.all_kv_events(), on_event, expected=KVEvent)
    kv = _storage(3)
    pool = await MooncakePool.open(
        worker, kv, KVInbox(kv, asyncio.get_running_loop()), _config(mooncake_master), "prefill-7"
    )
    try:
        hashes = [401, 402]
        assert await pool.put("put-2", hashes, [0, 1], lambda: None) == 2
        for _ in range(50):  # NOTE: the server may still be loading the new worker's rights
            await pool.report()
            if await _wait(heard, 0.2):
                break
            await pool.put("put-2", hashes, [0, 1], lambda: None)  # reported again
        assert core.index.match([401, 402, 403], ["prefill-7"]).pool_blocks == 2
    finally:
        await pool.close()
        await worker.drain()
        await listener.drain()


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), seconds)
        return True
    except TimeoutError:
        return False


def test_a_store_whose_master_is_gone_is_a_miss(tmp_path) -> None:
    from services.stack.mooncake_master import start_master

    master = start_master(tmp_path / "master.log")
    store = MooncakeBlockStore(_config(master.address), LAYOUT)
    try:
        assert _put(store, [501, 502], _blocks(5, 2)) == 2
        master.stop()
        assert store.present([501, 502]) == [False, False]
        assert _get(store, [501, 502]) is None
    finally:
        store.close()
