"""Open the KV pool a worker's config names (shared/kvpool/pool.py)."""

from __future__ import annotations

from shared.kvcache.storage import KVStorage
from shared.kvpool.kvstore_client import KvstorePool
from shared.kvpool.pool import KVPool
from shared.runtime.bus import Bus
from shared.transfer.base import KVReceiver, KVSender
from shared.transfer.inbox import KVInbox
from shared.transfer.tcp import TcpKVReceiver
from shared.transfer.tcp.asker import Asker
from shared.worker.config import WorkerConfig


async def open_kv_pool(
    config: WorkerConfig,
    worker_id: str,
    bus: Bus,
    sender: KVSender,
    storage: KVStorage,
    inbox: KVInbox,
    data_addr: str,
    receiver: KVReceiver | None = None,
) -> KVPool:
    if config.mooncake is None:
        timeout = config.request_timeout
        asker = asker_for(receiver, timeout)
        return KvstorePool(bus, sender, storage, inbox, data_addr, timeout, asker)
    from shared.kvpool.mooncake_pool import MooncakePool  # NOTE: only where it is used

    return await MooncakePool.open(
        bus, storage, inbox, config.mooncake, worker_id, config.heartbeat_interval
    )


def asker_for(receiver: KVReceiver | None, timeout: float) -> Asker | None:
    """Gets on the kvstores' data connections, read by the worker's own TCP receiver; not
    under --data-encrypt (those asks go over the bus) nor over another transport."""
    if not isinstance(receiver, TcpKVReceiver) or receiver.encrypt:
        return None
    return Asker(receiver, read_timeout_s=timeout)
