"""kvstore processes with the worker-side pool client: placement by consistent hashing,
losing an instance, and an SSD tier that survives a restart."""

from __future__ import annotations

import asyncio
import random
import signal

import torch

from services.stack.stack import Stack, StackConfig
from shared import subjects
from shared.kvcache.storage import KVStorage
from shared.kvpool.kvstore_client import KvstorePool
from shared.messages import Heartbeat, StatsRequest, StoreStats
from shared.runtime.bus import Bus
from shared.transfer.common.handshake import PROOF_BYTES
from shared.transfer.inbox import KVInbox
from shared.transfer.tcp import HEADER, KIND_KV, KIND_RING, SPAN, TcpKVReceiver, TcpKVSender
from shared.transfer.tcp.arena_view import ArenaView
from shared.worker.pool import asker_for
from tests.e2e.conftest import free_port
from tests.shared.transfer.proxy import FlipProxy

NUM_BLOCKS = 48


def start_stores(tmp_path, num: int, args: tuple[str, ...] = ()) -> Stack:
    stack = Stack(
        StackConfig(
            num_prefill=0,
            num_decode=0,
            num_kvstore=num,
            kvstore_args=args,
            with_conductor=False,
            with_gateway=False,
            log_dir=tmp_path,
            worker_args=(),
        )
    )
    stack.start()
    stack.wait_ready()
    return stack


class Client:
    """A stand-in worker: a small KV tensor, the data plane and the pool client."""

    def __init__(self, bus: Bus, seed: int, token: str | None, encrypt: bool = False) -> None:
        self.storage = KVStorage(4, NUM_BLOCKS, 16, 2, 8, torch.bfloat16)
        torch.manual_seed(seed)
        self.storage.kv.copy_(torch.randn(self.storage.kv.shape))
        self.inbox = KVInbox(self.storage, asyncio.get_running_loop())
        self.receiver = TcpKVReceiver(self.inbox, "127.0.0.1", 0, token, encrypt=encrypt)
        self.sender = TcpKVSender(auth_token=token, encrypt=encrypt)
        data_addr = self.receiver.start()
        # gets asked on the stores' data connections, as workers do (over the bus under
        # encryption: asker_for gives none)
        asker = asker_for(self.receiver, 10.0)
        self.pool = KvstorePool(bus, self.sender, self.storage, self.inbox, data_addr, asker=asker)

    def close(self) -> None:
        if self.pool.asker is not None:
            self.pool.asker.close()
        self.receiver.stop()
        self.sender.close()


async def connect(stack: Stack, encrypt: bool = False) -> tuple[Bus, list[Client]]:
    bus = await stack.bus("test-client")
    clients = [Client(bus, seed, stack.data_token, encrypt) for seed in (1, 2)]
    for client in clients:
        await bus.subscribe(subjects.all_heartbeats(), _observer(client.pool), expected=Heartbeat)
    stores = sum(p.service == "kvstore" for p in stack.processes)
    while len(clients[0].pool.ring().members) < stores:
        await asyncio.sleep(0.1)
    return bus, clients


async def disconnect(bus: Bus, clients: list[Client]) -> None:
    """Close what `connect` opened, before its stores stop: a bus left open to a stopped NATS
    keeps reconnecting, and the test's event loop then cannot close (pytest hung there)."""
    for client in clients:
        client.close()
    await bus.drain()


def _observer(pool: KvstorePool):
    async def observe(hb: Heartbeat) -> None:
        pool.observe(hb)

    return observe


async def put_all(client: Client, hashes: list[int], batch: int = 8) -> None:
    """In batches, as requests would: a later batch can push earlier ones to the SSD."""
    loop = asyncio.get_running_loop()
    for start in range(0, len(hashes), batch):
        done = asyncio.Event()
        await client.pool.put(
            f"put-{start}",
            hashes[start : start + batch],
            list(range(start, start + batch)),
            lambda done=done: loop.call_soon_threadsafe(done.set),
        )
        await asyncio.wait_for(done.wait(), 10)
        await asyncio.sleep(0.2)  # each block commits when its transfer's END arrives


async def stats(bus: Bus, worker_id: str) -> StoreStats:
    return await bus.request(
        subjects.worker_stats("kvstore", worker_id), StatsRequest(), 5, expected=StoreStats
    )


async def test_blocks_spread_over_three_stores_and_losing_one_loses_only_its_share(tmp_path):
    stack = await asyncio.to_thread(start_stores, tmp_path, 3)
    bus, clients = await connect(stack)
    writer, reader = clients
    try:
        hashes = [random.Random(i).getrandbits(64) for i in range(NUM_BLOCKS)]
        await put_all(writer, hashes)
        counts = [(await stats(bus, f"kvstore-{i}")).dram_blocks for i in range(3)]
        assert sum(counts) == NUM_BLOCKS and min(counts) > 0, counts
        owners = {h: writer.pool.ring().owner(h) for h in hashes}

        loads = await reader.pool.get("get-1", hashes, list(range(NUM_BLOCKS)))
        for expected in loads:
            await asyncio.wait_for(expected.settled.wait(), 10)
            assert not expected.verdict()
        assert torch.equal(reader.storage.kv, writer.storage.kv)
        # one host: every store's blocks read in place, each store's arena mapped once
        block_bytes = reader.storage.bytes_per_block(4, 16, 2, 8, torch.bfloat16)
        assert reader.receiver.bytes_placed == NUM_BLOCKS * block_bytes
        assert len(ArenaView._mapped) == 3

        victim = next(p for p in stack.processes if p.name == "kvstore-1")
        victim.popen.send_signal(signal.SIGKILL)
        stack.processes.remove(victim)
        while "kvstore-1" in reader.pool.ring().members:
            await asyncio.sleep(0.2)
        present = await asyncio.gather(*(reader.pool.longest_prefix([h]) for h in hashes))
        lost = {h for h, n in zip(hashes, present) if n == 0}
        assert lost == {h for h in hashes if owners[h] == "kvstore-1"}
        assert await reader.pool.get("get-2", hashes, list(range(NUM_BLOCKS))) is None
    finally:
        await disconnect(bus, clients)
        stack.stop()
    assert not ArenaView._mapped  # gone with the connections: no store's memory kept alive


async def test_the_ssd_tier_survives_a_restart(tmp_path):
    disk = tmp_path / "ssd"
    args = ("--dram-gib", "0.0001", "--disk-dir", str(disk), "--disk-gib", "0.01")  # ~26 blocks
    stack = await asyncio.to_thread(start_stores, tmp_path, 1, args)
    bus, clients = await connect(stack)
    writer = clients[0]
    try:
        hashes = [random.Random(100 + i).getrandbits(64) for i in range(NUM_BLOCKS)]
        await put_all(writer, hashes)
        before = await stats(bus, "kvstore-0")
        assert before.disk_blocks > 0 and before.dram_blocks < NUM_BLOCKS  # DRAM overflowed
        await disconnect(bus, clients)
        stack.stop()
        stack = await asyncio.to_thread(start_stores, tmp_path, 1, args)
        bus, clients = await connect(stack)
        reader = clients[1]
        after = await stats(bus, "kvstore-0")
        # A clean stop (SIGTERM) wrote what DRAM held to the SSD tier as well.
        assert after.disk_blocks == before.disk_blocks + before.dram_blocks
        on_disk = [h for h in hashes if await reader.pool.longest_prefix([h]) == 1]
        assert len(on_disk) == after.disk_blocks
        loads = await reader.pool.get("get-3", on_disk[:4], [0, 1, 2, 3])
        for expected in loads:
            await asyncio.wait_for(expected.settled.wait(), 10)
            assert not expected.verdict()
        for i, h in enumerate(on_disk[:4]):
            source = hashes.index(h)
            assert torch.equal(reader.storage.kv[:, :, i], writer.storage.kv[:, :, source])
    finally:
        await disconnect(bus, clients)
        stack.stop()


async def test_a_store_started_with_data_encrypt_serves_clients_that_encrypt(tmp_path):
    """Puts and gets go through only if the store's data plane encrypts as its clients do
    (a sender and a receiver that differ refuse each other)."""
    stack = await asyncio.to_thread(start_stores, tmp_path, 1, ("--data-encrypt",))
    bus, clients = await connect(stack, encrypt=True)
    writer, reader = clients
    try:
        hashes = [random.Random(200 + i).getrandbits(64) for i in range(8)]
        await put_all(writer, hashes)
        assert (await stats(bus, "kvstore-0")).dram_blocks == len(hashes)
        loads = await reader.pool.get("get-sealed", hashes, list(range(len(hashes))))
        for expected in loads:
            await asyncio.wait_for(expected.settled.wait(), 10)
            assert not expected.verdict()
        assert torch.equal(reader.storage.kv[:, :, :8], writer.storage.kv[:, :, :8])
    finally:
        await disconnect(bus, clients)
        stack.stop()


async def test_a_put_damaged_on_the_data_connection_is_not_kept_and_a_clean_one_is(tmp_path):
    """Puts go out on the worker's own connection to the kvstore (asked: slots, then the
    blocks); a byte flipped on the way keeps the damaged blocks out, and the same put
    again, undamaged, is stored and read back intact."""
    data_port = free_port()
    proxy = FlipProxy(f"127.0.0.1:{data_port}", flip_at=2_000)  # in the first put's payload
    args = ("--no-shared-memory", "--data-port", str(data_port))
    args += ("--advertise-data-addr", proxy.address)
    stack = await asyncio.to_thread(start_stores, tmp_path, 1, args)
    bus, clients = await connect(stack)
    writer = clients[0]  # NOTE: the proxy serves one connection: the writer's, both ways
    try:
        assert writer.pool.asker is not None
        hashes = [random.Random(200 + i).getrandbits(64) for i in range(2)]
        await put_all(writer, hashes, batch=2)
        assert await writer.pool.longest_prefix(hashes) == 0  # one span: both blocks bad
        assert in_first_payload(bytes(proxy.sent), 2_000)  # not in the ask: in the KV
        await put_all(writer, hashes, batch=2)
        assert await writer.pool.longest_prefix(hashes) == 2
        loads = await writer.pool.get("get-back", hashes, [10, 11])
        for expected in loads:
            await asyncio.wait_for(expected.settled.wait(), 10)
            assert not expected.verdict()
        assert torch.equal(writer.storage.kv[:, :, 10:12], writer.storage.kv[:, :, 0:2])
    finally:
        await disconnect(bus, clients)
        stack.stop()
        proxy.close()


def in_first_payload(stream: bytes, offset: int) -> bool:
    """Whether `offset` of an asker's stream (its proof in the handshake, maybe its ring
    offer, an ASK, then a KV frame) is in the frame's payload, past its header and span
    table."""
    ask = PROOF_BYTES
    if HEADER.unpack_from(stream, ask)[2] == KIND_RING:  # refused: the kvstore takes none
        ask += HEADER.size + HEADER.unpack_from(stream, ask)[6]
    ask += HEADER.size + HEADER.unpack_from(stream, ask)[6]
    _, _, kind, rid_len, _, count, body = HEADER.unpack_from(stream, ask)
    payload = ask + HEADER.size + rid_len + count * SPAN.size
    return kind == KIND_KV and payload <= offset < ask + HEADER.size + body
