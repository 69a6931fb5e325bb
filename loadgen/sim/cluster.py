"""The simulated nodes and what the conductor hears of them: heartbeats and KV events.

Disaggregated: prefill nodes `prefill-NN`, each with a DRAM cache that is also its share
of the global pool, published twice as live caches publish (the prefill worker's own
cache, and the kvstore instance `kvstore-NN` on the same node), and decode nodes
`decode-NN`. Without the pool (`--no-pool`: a stack with no kvstore), only the prefill
workers' caches are published, and a prefill loads only from a peer the conductor names.
Colocated: nodes `node-NN`, each a prefill worker (its local cache) and a decode worker
(`node-NN/decode`) to the conductor.
"""

from __future__ import annotations

from collections.abc import Iterator

from loadgen.sim.cache import BlockCache, BlockPool
from loadgen.sim.colocated import ColocatedNode
from loadgen.sim.config import SimConfig
from loadgen.sim.decode import DecodeNode
from loadgen.sim.job import Job
from loadgen.sim.prefill import BLOCK_SIZE, PrefillNode
from shared.costmodel import CostModel
from shared.kvpool.events import kv_events
from shared.messages import Heartbeat, KVEvent


def pool_id(prefill_id: str) -> str:
    """The kvstore instance on a prefill node (its DRAM cache, seen as part of the pool)."""
    return prefill_id.replace("prefill", "kvstore", 1)


class Cluster:
    def __init__(self, config: SimConfig, cost: CostModel) -> None:
        self.config = config
        self.pool = BlockPool() if config.pool and not config.colocated else None
        blocks = config.cache_blocks
        self.prefill = {
            f"prefill-{i:02}": PrefillNode(f"prefill-{i:02}", cost, BlockCache(blocks, self.pool))
            for i in range(config.num_prefill)
        }
        self.decode = {
            f"decode-{i:02}": DecodeNode(f"decode-{i:02}", cost, config.kv_tokens)
            for i in range(config.num_decode)
        }
        self.colocated = {
            f"node-{i:02}": ColocatedNode(
                f"node-{i:02}", cost, config.kv_tokens, BlockCache(blocks)
            )
            for i in range(config.num_colocated)
        }
        with_cache: dict[str, PrefillNode | ColocatedNode] = {**self.prefill, **self.colocated}
        self.caches = {name: node.cache for name, node in with_cache.items()}
        # stepped by advance
        self.lazy: list[DecodeNode | ColocatedNode] = [
            *self.decode.values(),
            *self.colocated.values(),
        ]

    @property
    def names(self) -> list[str]:
        """Every node, in the order they beat."""
        return [*self.prefill, *self.decode, *self.colocated]

    def advance(self, t: float) -> None:
        for node in self.lazy:
            if node.step_end is not None and node.step_end <= t:
                node.advance(t)

    def take_done(self) -> Iterator[Job]:
        """Jobs that finished decoding since the last call."""
        for node in self.lazy:
            if node.done:
                done, node.done = node.done, []
                yield from done

    def heartbeats(self, name: str, now: float) -> list[Heartbeat]:
        interval = self.config.heartbeat_interval
        if name in self.prefill:
            beats = [self.prefill[name].heartbeat(now, interval)]
            if self.pool is not None:
                beats.append(Heartbeat("kvstore", pool_id(name), now, interval))
            return beats
        if name in self.decode:
            return [self.decode[name].heartbeat(now, interval, BLOCK_SIZE)]
        return list(self.colocated[name].heartbeats(now, interval))

    def kv_events(self) -> list[KVEvent]:
        """The caches' changes since the last call, as their workers publish them."""
        events = []
        for name, cache in self.caches.items():
            stored, removed = cache.take_events()
            if stored or removed:
                events += kv_events(name, "prefill", stored, removed)
                if self.pool is not None:
                    events += kv_events(pool_id(name), "kvstore", stored, removed)
        return events
