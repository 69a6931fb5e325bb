"""Mooncake Store beside the kvstore in `python -m bench kvstore`: a real mooncake_master,
one holder process lending the store its DRAM (as a kvstore process would hold it), and
the bench process as a worker that lends nothing, so every byte crosses loopback TCP."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from shared.errors import KvstackError
from shared.kvcache.storage import KVStorage
from shared.kvpool.mooncake_pool import MooncakePool
from shared.kvpool.mooncake_store import MooncakeStoreConfig
from shared.runtime.bus import Bus
from shared.transfer.inbox import KVInbox

# NOTE: a separate process, so the store's memory is not the bench's (a get would be a
# local copy); it holds its segment until its stdin closes
HOLDER = """
import sys
from mooncake.store import MooncakeDistributedStore
store = MooncakeDistributedStore()
code = store.setup("127.0.0.1", "P2PHANDSHAKE", int(sys.argv[2]), 16 << 20, "tcp", "", sys.argv[1])
print("ready" if code == 0 else f"setup failed {code}", flush=True)
sys.stdin.read()
store.close()
"""


@contextmanager
def mooncake_store(work: Path, segment_bytes: int):
    """A master and a holder lending `segment_bytes`; yields the master's address."""
    from services.stack.mooncake_master import start_master

    master = start_master(work / "mooncake-master.log")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, master.address, str(segment_bytes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        if (line := holder.stdout.readline().strip()) != "ready":
            raise KvstackError(f"the Mooncake segment holder did not start: {line!r}")
        yield master.address
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(30)
        master.stop()


async def open_pool(bus: Bus, storage: KVStorage, inbox: KVInbox, master: str) -> MooncakePool:
    config = MooncakeStoreConfig(master, segment_bytes=0)
    return await MooncakePool.open(bus, storage, inbox, config, "bench")
