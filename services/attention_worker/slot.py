"""The shard a decode worker attached, as the long-lived listeners see it: the data plane's
sink (prefill KV) and the attention link's handler both outlive re-attaches."""

from __future__ import annotations

import logging

from services.attention_worker.shard import AttentionShard
from shared.transfer.attention.wire import ChunkSpec

log = logging.getLogger("kvstack.attention")


class ShardSlot:
    def __init__(self) -> None:
        self.shard: AttentionShard | None = None

    def attached(self) -> AttentionShard:
        if self.shard is None:
            raise ValueError("no decode worker has attached this attention worker")
        return self.shard

    # -- KVSink: KV from prefill workers ----------------------------------------------------

    def destination(self, request_id: str, layer: int, span, nbytes: int):
        return (
            None
            if self.shard is None
            else self.shard.inbox.destination(request_id, layer, span, nbytes)
        )

    def on_frame(self, request_id: str, layer: int, spans, ok: bool, error: str) -> None:
        if self.shard is not None:
            self.shard.inbox.on_frame(request_id, layer, spans, ok, error)

    def on_end(self, request_id: str, num_frames: int) -> None:
        if self.shard is not None:
            self.shard.inbox.on_end(request_id, num_frames)

    def on_lost(self, request_ids: list[str], error: str) -> None:
        if self.shard is not None:
            self.shard.inbox.on_lost(request_ids, error)

    # -- AttentionHandler: the decode worker's link ------------------------------------------

    def begin_step(self, micro_batch: int, chunks: list[ChunkSpec]) -> None:
        self.attached().begin_step(micro_batch, chunks)

    def qkv_buffers(self, micro_batch: int):
        return self.attached().qkv_buffers(micro_batch)

    def attend(self, micro_batch: int, layer: int, q, k, v):
        return self.attached().attend(micro_batch, layer, q, k, v)

    def release(self, request_ids: list[str]) -> None:
        self.attached().release(request_ids)

    def link_opened(self) -> AttentionShard | None:
        return self.shard  # a decode worker attaches first, then opens its link

    def link_closed(self, opened: object) -> None:
        """The shard whose link closed is dead: its decode worker recomputes every request
        on a re-formed group, or is gone. Dropped, its blocks and requests cannot outlive it
        (holding up a drain) when a re-formed group leaves this worker out."""
        shard = self.shard
        if shard is None or opened is not shard:
            return  # an older link, of a shard already replaced
        self.shard = None
        log.info(
            "the link of this shard's decode worker closed; dropping the shard (%d requests)",
            len(shard.request_blocks),
        )
