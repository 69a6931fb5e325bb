"""Layer-wise KV streaming: which bytes of a request go out after each layer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shared.engine.runner import SeqChunk
from shared.kvcache.storage import KVStorage
from shared.messages import KVReservation
from shared.transfer.base import BlockSpan, SpanBytes, coalesce
from shared.transfer.common.frames import pieces, size
from shared.transfer.tensor_bytes import tensor_bytes


@dataclass
class Target:
    """Where one request's KV goes: a decode worker's (or one attention worker's) data
    address and reserved blocks; with `kv_heads`, only those KV heads go there."""

    request_id: str
    peer: str
    decode_id: str
    block_ids: tuple[int, ...]
    sent_upto: int = 0  # tokens whose KV went out in every layer (or decode held already)
    held: int = 0  # the prompt's first tokens whose KV the decode worker held (not sent)
    bytes_sent: int = 0  # KV bytes queued for it so far
    kv_heads: tuple[int, int] | None = None
    # Copies of head slices queued for sending: the sender needs them alive until the end.
    staged: list[torch.Tensor] = field(default_factory=list)


def held_tokens(reservation: KVReservation, num_prompt_tokens: int, block_size: int) -> int:
    """The prompt's first tokens whose KV the decode worker holds already (not sent); at
    least the last token's KV always goes (a reply claiming more is held to that)."""
    held = min(reservation.num_held, len(reservation.block_ids)) * block_size
    return max(0, min(held, num_prompt_tokens - 1))


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
    return [
        (
            BlockSpan(dest, offset, num_tokens),
            *_source(storage, layer, src, offset, num_tokens, target),
        )
        for dest, src, offset, num_tokens in coalesce(pieces, bs)
    ]


def _source(
    storage: KVStorage, layer: int, block_id: int, offset: int, num_tokens: int, target: Target
):
    storage.to_host(layer, block_id, offset, num_tokens)  # from a GPU, where the KV is there
    if target.kv_heads is None:
        return storage.span_bytes(layer, block_id, offset, num_tokens)
    # A head slice is strided in the cache: copy it out once, to send without another copy.
    num_blocks = -(-(offset + num_tokens) // storage.block_size)
    heads = slice(*target.kv_heads)
    k_cache, v_cache = storage.host()[layer]
    views = []
    for cache in (k_cache, v_cache):
        tokens = cache[block_id : block_id + num_blocks].flatten(0, 1)[offset : offset + num_tokens]
        staged = tokens[:, heads].contiguous()
        target.staged.append(staged)
        views.append(tensor_bytes(staged))
    return views


def kv_handoff(targets: list[Target]) -> tuple[int, int]:
    """(KV bytes sent to the decode side, prompt tokens whose KV it held already)."""
    return sum(t.bytes_sent for t in targets), targets[0].held


def spans_nbytes(spans: list[SpanBytes]) -> int:
    return sum(size(pieces(k)) + size(pieces(v)) for _, k, v in spans)
