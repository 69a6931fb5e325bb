"""Layer-wise KV streaming: which bytes of a request go out after each layer."""
from __future__ import annotations

from dataclasses import dataclass, field

from shared.engine.runner import SeqChunk
from shared.kvcache.storage import KVStorage
from shared.transfer.base import BlockSpan, SpanBytes, tensor_bytes


@dataclass
class Target:
    """Where one request's KV goes: a decode worker's data address and reserved blocks."""
    request_id: str
    peer: str
    decode_id: str
    block_ids: tuple[int, ...]
    block_hashes: list[int]
    sent_upto: int = 0            # tokens whose KV went out in every layer
    num_layers_sent: dict[int, int] = field(default_factory=dict)


def layer_spans(storage: KVStorage, layer: int, chunk: SeqChunk, target: Target) -> list[SpanBytes]:
    """K and V bytes of this layer for tokens [target.sent_upto, chunk end).

    Starting at `sent_upto`, not at the chunk's first token, sends a prefix-cache hit's
    blocks too: the decode worker has none of this request's KV.
    """
    k_cache, v_cache = storage.layer(layer)
    bs = storage.block_size
    spans, pos = [], target.sent_upto
    while pos < chunk.context_len:
        index, offset = divmod(pos, bs)
        num_tokens = min(bs - offset, chunk.context_len - pos)
        full = offset + num_tokens == bs and index < len(target.block_hashes)
        span = BlockSpan(target.block_ids[index], offset, num_tokens,
                         target.block_hashes[index] if full else 0)
        src = chunk.block_ids[index]
        rows = slice(offset, offset + num_tokens)
        spans.append((span, tensor_bytes(k_cache[src, rows]), tensor_bytes(v_cache[src, rows])))
        pos += num_tokens
    return spans
