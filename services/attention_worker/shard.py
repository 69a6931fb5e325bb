"""One attention worker's share of a decode group's KV: the heads it holds for every
offloaded request, and attention over them.

The decode worker owns the block table (the same block ids name a request's blocks on
every shard of its group); this shard stores its heads of those blocks, fills them from
prefill (the data plane, through `inbox`) and from each step's new k, v (the link), and
computes attention for the chunk layout each step announces.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import torch

from shared.attention_groups import kv_head_range
from shared.engine.config import DTYPES
from shared.engine.metadata import attention_metadata
from shared.errors import KvstackError
from shared.kvcache.storage import KVStorage
from shared.messages import AttentionAttach
from shared.model.attention import AttentionMetadata, TorchPagedAttention
from shared.transfer.attention.wire import ChunkSpec
from shared.transfer.inbox import KVInbox


@dataclass(frozen=True)
class _Step:
    meta: AttentionMetadata
    num_tokens: int


class AttentionShard:
    def __init__(
        self, spec: AttentionAttach, kv_cache_bytes: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        if spec.dtype not in DTYPES:
            raise KvstackError(f"unknown dtype {spec.dtype!r}; known: {', '.join(DTYPES)}")
        self.spec = spec
        self.kv_heads = kv_head_range(spec.num_kv_heads, spec.group_size, spec.shard)
        self.num_kv_heads = self.kv_heads[1] - self.kv_heads[0]
        self.num_heads = spec.num_heads // spec.group_size
        dtype = getattr(torch, spec.dtype)
        per_block = KVStorage.bytes_per_block(
            spec.num_layers, spec.block_size, self.num_kv_heads, spec.head_dim, dtype
        )
        self.storage = KVStorage(
            spec.num_layers,
            max(1, kv_cache_bytes // per_block),
            spec.block_size,
            self.num_kv_heads,
            spec.head_dim,
            dtype,
        )
        self.backend = TorchPagedAttention(self.storage, spec.head_dim)
        self.inbox = KVInbox(self.storage, loop)
        self._steps: dict[int, _Step] = {}
        self._lock = threading.Lock()
        self.request_blocks: dict[str, frozenset[int]] = {}
        self.num_calls = 0

    @property
    def used_blocks(self) -> int:
        with self._lock:
            return len(frozenset().union(*self.request_blocks.values()))

    def hold(self, request_id: str, block_ids: tuple[int, ...]) -> None:
        self._check_blocks(block_ids)
        with self._lock:
            self.request_blocks[request_id] = frozenset(block_ids)

    # -- AttentionHandler (the link's thread) ------------------------------------------------

    def begin_step(self, micro_batch: int, chunks: list[ChunkSpec]) -> None:
        bs = self.storage.block_size
        for chunk in chunks:
            self._check_blocks(chunk.block_ids)
            if chunk.context_len > len(chunk.block_ids) * bs:
                raise ValueError(
                    f"request {chunk.request_id}: {chunk.context_len} tokens do "
                    f"not fit {len(chunk.block_ids)} blocks"
                )
        _, meta = attention_metadata(chunks, bs, "cpu")
        self._steps[micro_batch] = _Step(meta, sum(c.num_tokens for c in chunks))
        with self._lock:
            for chunk in chunks:
                self.request_blocks[chunk.request_id] = frozenset(chunk.block_ids)

    def qkv_buffers(self, micro_batch: int) -> tuple[torch.Tensor, ...]:
        step = self._step(micro_batch)
        dtype, head_dim = self.storage.kv.dtype, self.spec.head_dim
        return (
            torch.empty((step.num_tokens, self.num_heads, head_dim), dtype=dtype),
            torch.empty((step.num_tokens, self.num_kv_heads, head_dim), dtype=dtype),
            torch.empty((step.num_tokens, self.num_kv_heads, head_dim), dtype=dtype),
        )

    @torch.inference_mode()
    def attend(
        self, micro_batch: int, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if not 0 <= layer < self.spec.num_layers:
            raise ValueError(f"layer {layer} is outside the model's {self.spec.num_layers}")
        self.num_calls += 1
        return self.backend.forward(layer, q, k, v, self._step(micro_batch).meta)

    def release(self, request_ids: list[str]) -> None:
        with self._lock:
            for request_id in request_ids:
                self.request_blocks.pop(request_id, None)

    def _step(self, micro_batch: int) -> _Step:
        step = self._steps.get(micro_batch)
        if step is None:
            raise ValueError(f"QKV for micro-batch {micro_batch} before its STEP")
        return step

    def _check_blocks(self, block_ids) -> None:
        bad = next((b for b in block_ids if not 0 <= b < self.storage.num_blocks), None)
        if bad is not None:
            raise ValueError(f"block {bad} is outside this shard's {self.storage.num_blocks}")
