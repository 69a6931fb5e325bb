"""Turns a step's sequence chunks into one forward pass over the paged cache."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from shared.kvcache.storage import KVStorage
from shared.model.attention import (AttentionBackend, AttentionMetadata, PrefillSpan,
                                    causal_mask)
from shared.model.llama import ForwardBatch, LlamaModel


@dataclass(frozen=True, slots=True)
class SeqChunk:
    """One sequence's share of a step: tokens to compute and where their KV lives."""
    request_id: str
    token_ids: Sequence[int]    # the tokens computed in this step
    start_pos: int              # tokens of the sequence already in the KV cache
    block_ids: Sequence[int]    # block table covering start_pos + len(token_ids)
    num_logits: int = 1         # logits wanted for this many trailing tokens

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


class ModelRunner:
    """Owns the model and the KV tensors; knows nothing of requests or scheduling."""

    def __init__(self, model: LlamaModel, storage: KVStorage, backend: AttentionBackend) -> None:
        self.model = model
        self.storage = storage
        self.backend = backend
        self.block_size = storage.block_size
        self.device = storage.kv.device

    @torch.inference_mode()
    def execute(self, chunks: Sequence[SeqChunk], backend: AttentionBackend | None = None,
                on_layer_done: Callable[[int], None] | None = None,
                before_layer: Callable[[int], None] | None = None) -> list[torch.Tensor]:
        """Run the chunks; return float32 logits [num_logits, vocab] per chunk, in order."""
        order = sorted(range(len(chunks)), key=lambda i: len(chunks[i].token_ids) > 1)
        ordered = [chunks[i] for i in order]
        input_ids, positions, meta = self.prepare(ordered)
        backend = backend or self.backend
        batch = ForwardBatch(
            positions=positions, on_layer_done=on_layer_done, before_layer=before_layer,
            attention=lambda layer, q, k, v: backend.forward(layer, q, k, v, meta))
        hidden = self.model(input_ids, batch)
        logits = self._logits(hidden, ordered)
        result: list[torch.Tensor] = [None] * len(chunks)
        for i, chunk_logits in zip(order, logits):
            result[i] = chunk_logits
        return result

    def prepare(self, chunks: Sequence[SeqChunk]) -> tuple[torch.Tensor, ...]:
        """Flat token ids, positions and attention metadata; decode chunks must come first."""
        token_ids, positions, slots = [], [], []
        for chunk in chunks:
            chunk_positions = range(chunk.start_pos, chunk.context_len)
            token_ids.extend(chunk.token_ids)
            positions.extend(chunk_positions)
            slots.extend(self._slots(chunk.block_ids, chunk_positions))
        as_long = lambda values: torch.tensor(values, dtype=torch.long, device=self.device)
        meta = AttentionMetadata(slot_mapping=as_long(slots))
        self._add_decode(meta, [c for c in chunks if len(c.token_ids) == 1])
        self._add_prefills(meta, chunks)
        return as_long(token_ids), as_long(positions), meta

    def _slots(self, block_ids: Sequence[int], positions: range) -> list[int]:
        bs = self.block_size
        return [block_ids[p // bs] * bs + p % bs for p in positions]

    def _add_decode(self, meta: AttentionMetadata, decodes: list[SeqChunk]) -> None:
        if not decodes:
            return
        max_blocks = max(len(c.block_ids) for c in decodes)
        table = [list(c.block_ids) + [0] * (max_blocks - len(c.block_ids)) for c in decodes]
        meta.num_decode_tokens = len(decodes)
        meta.decode_block_table = torch.tensor(table, dtype=torch.long, device=self.device)
        meta.decode_context_lens = torch.tensor(
            [c.context_len for c in decodes], dtype=torch.long, device=self.device)

    def _add_prefills(self, meta: AttentionMetadata, chunks: Sequence[SeqChunk]) -> None:
        row = meta.num_decode_tokens
        for chunk in chunks[meta.num_decode_tokens:]:
            num_tokens = len(chunk.token_ids)
            span = PrefillSpan(row, num_tokens, chunk.context_len)
            if chunk.start_pos:
                self._add_context(span, chunk)
            meta.prefills.append(span)
            row += num_tokens

    def _add_context(self, span: PrefillSpan, chunk: SeqChunk) -> None:
        blocks = list(chunk.block_ids[:-(-chunk.context_len // self.block_size)])
        span.context_blocks = torch.tensor(blocks, dtype=torch.long, device=self.device)
        if blocks == list(range(blocks[0], blocks[0] + len(blocks))):
            span.first_block = blocks[0]
        span.mask = causal_mask(span.num_tokens, span.context_len).to(self.device)

    def _logits(self, hidden: torch.Tensor, chunks: Sequence[SeqChunk]) -> list[torch.Tensor]:
        rows, counts, end = [], [], 0
        for chunk in chunks:
            end += len(chunk.token_ids)
            rows.extend(range(end - chunk.num_logits, end))
            counts.append(chunk.num_logits)
        if not rows:
            return [hidden.new_empty((0, 0))] * len(chunks)
        index = torch.tensor(rows, dtype=torch.long, device=hidden.device)
        return list(self.model.compute_logits(hidden[index]).split(counts))
