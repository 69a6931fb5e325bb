"""Where a step's tokens sit and what they attend to: positions and attention metadata.

Built from the step's chunks alone (no model, no tokens), so an attention worker that
holds a shard of the KV builds the same metadata from the chunk layout it is sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from shared.model.attention import AttentionMetadata, PrefillSpan, causal_mask


class ChunkLayout(Protocol):
    """What metadata needs of a chunk: its KV position and block table."""

    @property
    def start_pos(self) -> int: ...

    @property
    def block_ids(self) -> Sequence[int]: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def context_len(self) -> int: ...


def attention_metadata(
    chunks: Sequence[ChunkLayout], block_size: int, device: torch.device | str
) -> tuple[torch.Tensor, AttentionMetadata]:
    """Positions [T] and metadata of chunks laid out in order; decode chunks must come first."""
    positions: list[int] = []
    slots: list[int] = []
    for chunk in chunks:
        chunk_positions = range(chunk.start_pos, chunk.context_len)
        positions.extend(chunk_positions)
        slots.extend(_slots(chunk.block_ids, chunk_positions, block_size))
    as_long = lambda values: torch.tensor(values, dtype=torch.long, device=device)
    meta = AttentionMetadata(slot_mapping=as_long(slots))
    _add_decode(meta, [c for c in chunks if c.num_tokens == 1], device)
    _add_prefills(meta, chunks, block_size, device)
    return as_long(positions), meta


def _slots(block_ids: Sequence[int], positions: range, block_size: int) -> list[int]:
    return [block_ids[p // block_size] * block_size + p % block_size for p in positions]


def _add_decode(meta: AttentionMetadata, decodes: list[ChunkLayout], device) -> None:
    if not decodes:
        return
    max_blocks = max(len(c.block_ids) for c in decodes)
    table = [list(c.block_ids) + [0] * (max_blocks - len(c.block_ids)) for c in decodes]
    meta.num_decode_tokens = len(decodes)
    meta.decode_block_table = torch.tensor(table, dtype=torch.long, device=device)
    context_lens = [c.context_len for c in decodes]
    meta.decode_context_lens = torch.tensor(context_lens, dtype=torch.long, device=device)
    meta.decode_max_context = max(context_lens)


def _add_prefills(
    meta: AttentionMetadata, chunks: Sequence[ChunkLayout], block_size: int, device
) -> None:
    row = meta.num_decode_tokens
    for chunk in chunks[meta.num_decode_tokens :]:
        span = PrefillSpan(row, chunk.num_tokens, chunk.context_len)
        if chunk.start_pos:
            _add_context(span, chunk, block_size, device)
        meta.prefills.append(span)
        row += chunk.num_tokens


def _add_context(span: PrefillSpan, chunk: ChunkLayout, block_size: int, device) -> None:
    blocks = list(chunk.block_ids[: -(-chunk.context_len // block_size)])
    span.context_blocks = torch.tensor(blocks, dtype=torch.long, device=device)
    if blocks == list(range(blocks[0], blocks[0] + len(blocks))):
        span.first_block = blocks[0]
    span.mask = causal_mask(span.num_tokens, span.context_len).to(device)
