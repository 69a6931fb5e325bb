"""KV blocks in Mooncake Store, synchronously: one object per block, keyed by its chain
hash, holding a BlockHeader (shared/kvpool/block_header.py) and then the block's bytes.

`MooncakeBlockStore` wraps `mooncake.store.MooncakeDistributedStore`, a C++ client whose
calls block: call it from one worker thread (shared/kvpool/mooncake_pool.py does), never from an
event loop. Reads land in a registered staging buffer and are verified there (header,
size, checksum) before anything is copied out: a block is whole and intact, or absent.
"""

from __future__ import annotations

import ctypes
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import xxhash

from shared.errors import KvstackError
from shared.kvblocks import BlockLayout
from shared.kvpool.block_header import HEADER_SIZE, BlockHeader

KEY_PREFIX = "kvstack/"
STAGING_BLOCKS = 64  # blocks per batched call (the staging buffers hold this many)
MISSING_HELP = "apt-get install libibverbs1 librdmacm1; pip install -e '.[rdma]'"


@dataclass(frozen=True, slots=True)
class MooncakeStoreConfig:
    master: str  # mooncake_master's RPC address, host:port
    metadata: str = "P2PHANDSHAKE"  # or the master's HTTP metadata URL
    local_hostname: str = "127.0.0.1"  # where peers reach this client's segment
    segment_bytes: int = 1 << 30  # DRAM this client lends the pool
    replicas: int = 1  # copies of each block (Mooncake's ReplicateConfig.replica_num)
    protocol: str = "tcp"

    def __post_init__(self) -> None:
        host, _, port = self.master.rpartition(":")
        if not host or not port.isdigit():
            raise KvstackError(f"--mooncake-master must be host:port, not {self.master!r}")
        if self.segment_bytes < 0 or self.replicas < 1:
            raise KvstackError("the Mooncake segment must be >= 0 bytes and replicas >= 1")


def available() -> bool:
    """Whether the Mooncake Store client loads here (the wheel and libibverbs)."""
    if importlib.util.find_spec("mooncake") is None:
        return False
    try:
        import mooncake.store  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def block_key(block_hash: int) -> str:
    return f"{KEY_PREFIX}{block_hash:016x}"


class _Staging:
    """A buffer the store client may read from and write into, `slots` objects long."""

    def __init__(self, object_bytes: int, slots: int) -> None:
        self.object_bytes = object_bytes
        self.buffer = bytearray(object_bytes * slots)
        self.view = memoryview(self.buffer)
        self.address = ctypes.addressof((ctypes.c_char * len(self.buffer)).from_buffer(self.buffer))

    def slot(self, i: int) -> memoryview:
        return self.view[i * self.object_bytes : (i + 1) * self.object_bytes]

    def pointer(self, i: int) -> int:
        return self.address + i * self.object_bytes


class MooncakeBlockStore:
    """Blocks of one layout in Mooncake Store. Not thread-safe: one caller thread."""

    def __init__(self, config: MooncakeStoreConfig, layout: BlockLayout) -> None:
        if not available():
            raise KvstackError(f"--kv-pool mooncake needs Mooncake Store: {MISSING_HELP}")
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig

        self.layout = layout
        self.object_bytes = HEADER_SIZE + layout.block_bytes
        self.client = MooncakeDistributedStore()
        code = self.client.setup(
            config.local_hostname,
            config.metadata,
            config.segment_bytes,
            16 << 20,  # NOTE: the client's own buffer; our transfers use registered staging
            config.protocol,
            "",
            config.master,
        )
        if code != 0:
            raise KvstackError(f"Mooncake Store at {config.master}: setup failed ({code})")
        self.replicate = ReplicateConfig()
        self.replicate.replica_num = config.replicas
        self.puts = _Staging(self.object_bytes, STAGING_BLOCKS)
        self.gets = _Staging(self.object_bytes, STAGING_BLOCKS)
        for staging in (self.puts, self.gets):
            self.client.register_buffer(staging.address, len(staging.buffer))

    def close(self) -> None:
        self.client.close()

    def present(self, block_hashes: Sequence[int]) -> list[bool]:
        """Which blocks the store holds (an error counts as absent)."""
        keys = [block_key(h) for h in block_hashes]
        return [flag == 1 for flag in self.client.batch_is_exist(keys)] if keys else []

    def put(
        self, block_hashes: Sequence[int], read_block: Callable[[int, memoryview], None]
    ) -> int:
        """Store the blocks the store lacks; `read_block(i, into)` copies the i-th block's
        bytes. Returns how many were stored."""
        stored = 0
        for start in range(0, len(block_hashes), STAGING_BLOCKS):
            stored += self._put_batch(
                block_hashes[start : start + STAGING_BLOCKS], start, read_block
            )
        return stored

    def _put_batch(
        self, hashes: Sequence[int], first: int, read_block: Callable[[int, memoryview], None]
    ) -> int:
        missing = [i for i, there in enumerate(self.present(hashes)) if not there]
        for slot, i in enumerate(missing):
            self._stage(slot, hashes[i], first + i, read_block)
        if not missing:
            return 0
        results = self.client.batch_put_from(
            [block_key(hashes[i]) for i in missing],
            [self.puts.pointer(slot) for slot in range(len(missing))],
            [self.object_bytes] * len(missing),
            self.replicate,
        )
        return sum(1 for code in results if code == 0)

    def _stage(
        self, slot: int, block_hash: int, index: int, read_block: Callable[[int, memoryview], None]
    ) -> None:
        into = self.puts.slot(slot)
        payload = into[HEADER_SIZE:]
        read_block(index, payload)
        checksum = xxhash.xxh3_64_intdigest(payload)
        header = BlockHeader(block_hash, self.layout, 0, self.layout.block_bytes, checksum)
        into[:HEADER_SIZE] = header.pack()

    def get(
        self, block_hashes: Sequence[int], write_block: Callable[[int, memoryview], None]
    ) -> bool:
        """Fetch the blocks, `STAGING_BLOCKS` at a time, and verify each batch; only a
        batch whose blocks are all whole is written out, `write_block(i, payload)` once per
        block. False: a block is missing or damaged (the batches before it were written;
        the caller treats the whole get as a miss)."""
        for start in range(0, len(block_hashes), STAGING_BLOCKS):
            if not self._get_batch(
                block_hashes[start : start + STAGING_BLOCKS], start, write_block
            ):
                return False
        return True

    def _get_batch(
        self, hashes: Sequence[int], first: int, write_block: Callable[[int, memoryview], None]
    ) -> bool:
        sizes = self.client.batch_get_into(
            [block_key(h) for h in hashes],
            [self.gets.pointer(i) for i in range(len(hashes))],
            [self.object_bytes] * len(hashes),
        )
        if not all(self._intact(i, h, n) for i, (h, n) in enumerate(zip(hashes, sizes))):
            return False
        for i in range(len(hashes)):
            write_block(first + i, self.gets.slot(i)[HEADER_SIZE:])
        return True

    def _intact(self, slot: int, block_hash: int, size: int) -> bool:
        if size != self.object_bytes:
            return False
        data = self.gets.slot(slot)
        header = BlockHeader.unpack(bytes(data[:HEADER_SIZE]))
        want = BlockHeader(block_hash, self.layout, 0, self.layout.block_bytes, 0)
        if header is None or header != _with_checksum(want, header.checksum):
            return False
        return xxhash.xxh3_64_intdigest(data[HEADER_SIZE:]) == header.checksum


def _with_checksum(header: BlockHeader, checksum: int) -> BlockHeader:
    return BlockHeader(header.block_hash, header.layout, header.flags, header.payload_len, checksum)
