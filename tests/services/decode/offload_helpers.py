"""An attention group served in this process: real shards behind real link sockets."""

from __future__ import annotations

import asyncio
import dataclasses
from contextlib import contextmanager

from services.attention_worker.shard import AttentionShard
from services.attention_worker.slot import ShardSlot
from services.decode.attention_group import AttentionGroup
from services.decode.offload_runner import OffloadRunner
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.messages import AttentionAttach
from shared.transfer.attention.server import AttentionServer

KV_BYTES = 64 << 20


@contextmanager
def offloaded_engine(config: EngineConfig, group_size: int, micro_batches: int = 2):
    """An engine like `LLMEngine(config)` whose attention runs on `group_size` shards."""
    probe = LLMEngine(dataclasses.replace(config, num_blocks=1))
    mc, dtype = probe.info.model, config.resolved_dtype
    ids = [f"aw{i}" for i in range(group_size)]
    group = AttentionGroup(None, "decode-test", ids, mc, dtype, config.block_size, None, 10.0)
    loop = asyncio.new_event_loop()
    shards = [
        AttentionShard(
            AttentionAttach(
                "decode-test",
                group_size,
                i,
                mc.num_layers,
                mc.num_heads,
                mc.num_kv_heads,
                mc.head_dim,
                config.block_size,
                dtype,
            ),
            KV_BYTES,
            loop,
        )
        for i in range(group_size)
    ]
    servers = [AttentionServer(_slot(shard), "127.0.0.1", 0, None) for shard in shards]
    try:
        addrs = [server.start() for server in servers]
        group.connect(ids, addrs, addrs)
        num_blocks = min(shard.storage.num_blocks for shard in shards)
        engine = LLMEngine(
            dataclasses.replace(
                config, num_blocks=num_blocks, local_kv=False, enable_prefix_cache=False
            )
        )
        engine.use_runner(
            lambda runner: OffloadRunner(runner.model, runner.storage, group, micro_batches)
        )
        yield engine, group, shards, servers
    finally:
        group.close()
        for server in servers:
            server.stop()
        loop.close()


def record_logits(engine: LLMEngine) -> list:
    """Every step's logits, as the runner returns them."""
    recorded = []

    def record(runner):
        execute = runner.execute

        def recording(chunks, *args, **kwargs):
            logits = execute(chunks, *args, **kwargs)
            recorded.append({c.request_id: row for c, row in zip(chunks, logits)})
            return logits

        runner.execute = recording
        return runner

    engine.use_runner(record)
    return recorded


def _slot(shard: AttentionShard) -> ShardSlot:
    slot = ShardSlot()
    slot.shard = shard
    return slot
