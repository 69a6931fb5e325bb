"""Open the KV pool a worker's config names (shared/kv_pool.py)."""

from __future__ import annotations

from shared.bus import Bus
from shared.kv_inbox import KVInbox
from shared.kv_pool import KVPool
from shared.kvcache.storage import KVStorage
from shared.kvstore_client import KvstorePool
from shared.transfer.base import KVSender
from shared.worker import WorkerConfig


async def open_kv_pool(
    config: WorkerConfig,
    worker_id: str,
    bus: Bus,
    sender: KVSender,
    storage: KVStorage,
    inbox: KVInbox,
    data_addr: str,
) -> KVPool:
    if config.mooncake is None:
        return KvstorePool(bus, sender, storage, inbox, data_addr, config.request_timeout)
    from shared.mooncake_pool import MooncakePool  # NOTE: only where it is used

    return await MooncakePool.open(
        bus, storage, inbox, config.mooncake, worker_id, config.heartbeat_interval
    )
