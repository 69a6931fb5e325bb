"""A decode worker's get of a prompt's prefix from the KV pool
(services/decode/pool_prefix.py), against real kvstore processes: the run the pool holds
lands in the reserved blocks; a get that stalls is refused within the grace, stops the
worker taking from the pool, and is retired (its link cut) before its blocks may be
freed."""

from __future__ import annotations

import asyncio
import random
import time

import torch

from services.decode import pool_prefix
from services.decode.pool_prefix import PoolPrefix
from tests.e2e.conftest import free_port
from tests.e2e.proxy import CuttingProxy
from tests.e2e.test_kvstore_reuse import kvstore_behind
from tests.services.kvstore.test_service import connect, disconnect, put_all, start_stores

HASHES = [random.Random(300 + i).getrandbits(64) for i in range(12)]
RESERVED = list(range(20, 32))  # the blocks a reservation got for the prompt


async def test_the_run_the_pool_holds_lands_in_the_reserved_blocks(tmp_path):
    stack = await asyncio.to_thread(start_stores, tmp_path, 1)
    bus, (writer, reader) = await connect(stack)
    try:
        await put_all(writer, HASHES[:8])  # from the writer's blocks 0-7
        prefix = PoolPrefix(reader.pool, reader.inbox)
        assert await prefix.leading(HASHES) == 8  # the pool holds the first 8
        assert await prefix.fetch("r1", HASHES[:8], RESERVED[:8]) == 8
        assert await prefix.verdict("r1") == ""
        assert torch.equal(reader.storage.kv[:, :, 20:28], writer.storage.kv[:, :, :8])
        prefix.take("r1")
        assert len(reader.inbox) == 0
        assert await prefix.leading(HASHES[8:]) == 0  # it holds none of these
        assert await prefix.fetch("r2", HASHES[8:], RESERVED[:4]) == 0  # a miss: none taken
        assert prefix.blocks_asked == 8 and prefix.num_failed == 0
        assert len(reader.inbox) == 0  # the miss left no expectation behind
    finally:
        await disconnect(bus, [writer, reader])
        stack.stop()


async def test_a_get_that_stalls_is_refused_within_the_grace_and_pauses_the_pool(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(pool_prefix, "LAND_GRACE_S", 0.5)
    data_port = free_port()
    # the puts' answers are a few hundred bytes; the get's 8 blocks of 4 KiB stall half way
    proxy = CuttingProxy(data_port, cut_after=16_000, on_cut=lambda: None, hold=True, answers=True)
    stack = await asyncio.to_thread(start_stores, tmp_path, 1, kvstore_behind(proxy, data_port))
    bus, (writer, reader) = await connect(stack)
    try:
        await put_all(writer, HASHES[:8])
        prefix = PoolPrefix(reader.pool, reader.inbox)
        assert await prefix.leading(HASHES) == 8
        assert await prefix.fetch("r1", HASHES[:8], RESERVED[:8]) == 8  # answered, then silent
        began = time.monotonic()
        problem = await prefix.verdict("r1")
        assert proxy.cut and proxy.error is None, proxy.error  # it stalled mid-get
        assert "had not landed" in problem and time.monotonic() - began < 2.0
        assert prefix.num_failed == 1
        assert await prefix.leading(HASHES) == 0  # paused: nothing asked
        assert prefix.blocks_asked == 8
        began = time.monotonic()
        assert await prefix.drop("r1")  # retired: no byte lands in its blocks from here
        assert time.monotonic() - began < 2.0  # its stalled link cut, not waited out (10 s)
        assert reader.inbox.get("r1:pool:0") is None and len(reader.inbox) == 0
    finally:
        proxy.close()
        await disconnect(bus, [writer, reader])
        stack.stop()
