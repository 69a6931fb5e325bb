"""Layer-wise KV streaming: which bytes of a request go out after each layer."""
from __future__ import annotations

from dataclasses import dataclass

from shared.engine.runner import SeqChunk
from shared.kvcache.storage import KVStorage
from shared.transfer.base import BlockSpan, SpanBytes, coalesce


@dataclass
class Target:
    """Where one request's KV goes: a decode worker's data address and reserved blocks."""
    request_id: str
    peer: str
    decode_id: str
    block_ids: tuple[int, ...]
    sent_upto: int = 0            # tokens whose KV went out in every layer


def layer_spans(storage: KVStorage, layer: int, chunk: SeqChunk, target: Target) -> list[SpanBytes]:
    """K and V bytes of this layer for tokens [target.sent_upto, chunk end).

    Starting at `sent_upto`, not at the chunk's first token, sends a prefix-cache hit's
    blocks too: the decode worker has none of this request's KV.
    """
    bs = storage.block_size
    pieces, pos = [], target.sent_upto
    while pos < chunk.context_len:
        index, offset = divmod(pos, bs)
        num_tokens = min(bs - offset, chunk.context_len - pos)
        pieces.append((target.block_ids[index], chunk.block_ids[index], offset, num_tokens))
        pos += num_tokens
    return [(BlockSpan(dest, offset, num_tokens), *storage.span_bytes(layer, src, offset,
                                                                       num_tokens))
            for dest, src, offset, num_tokens in coalesce(pieces, bs)]
