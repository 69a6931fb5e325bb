"""A model runner whose attention runs on the attention group, with staggered micro-batches:
while one micro-batch's attention is away, the next one's dense work runs here.

On a GPU (Lamina's heterogeneous case: dense work on the GPU, attention on memory-rich CPU
workers) each layer's q, k and v come down to host memory in one wait and the attention
output goes back up; the links carry host bytes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch

from services.decode.attention_group import AttentionGroup
from shared.engine.runner import ModelRunner, SeqChunk, decode_first, in_order
from shared.kvcache.storage import KVStorage
from shared.model.llama import DecoderLayer, ForwardBatch, LlamaModel


@dataclass
class _MicroBatch:
    index: int
    chunks: list[SeqChunk]
    batch: ForwardBatch
    x: torch.Tensor
    residual: torch.Tensor  # the residual stream, from the first layer on


def split_micro_batches(chunks: Sequence[SeqChunk], count: int) -> list[list[SeqChunk]]:
    """At most `count` consecutive runs of chunks with about equal tokens, none empty."""
    count = max(1, min(count, len(chunks)))
    total = sum(c.num_tokens for c in chunks)
    parts: list[list[SeqChunk]] = [[] for _ in range(count)]
    done = 0
    for i, chunk in enumerate(chunks):
        part = min(count - 1, done * count // total, i)
        part = max(part, count - (len(chunks) - i))  # leave one chunk for each later part
        parts[part].append(chunk)
        done += chunk.num_tokens
    return [p for p in parts if p]


class OffloadRunner(ModelRunner):
    def __init__(
        self,
        model: LlamaModel,
        storage: KVStorage,
        group: AttentionGroup,
        num_micro_batches: int = 2,
    ) -> None:
        # NOTE: attention runs on the group: this runner has no backend of its own.
        super().__init__(model, storage, backend=None)  # type: ignore[arg-type]
        self.group = group
        self.num_micro_batches = num_micro_batches

    @torch.inference_mode()
    def execute(
        self,
        chunks: Sequence[SeqChunk],
        backend=None,
        on_layer_done: Callable[[int], None] | None = None,
        before_layer: Callable[[int], None] | None = None,
    ) -> list[torch.Tensor]:
        order, ordered = decode_first(chunks)
        parts = split_micro_batches(ordered, self.num_micro_batches)
        micro_batches = [self._start(i, part) for i, part in enumerate(parts)]
        layers = self._layers()
        for layer_idx, layer in enumerate(layers):
            for mb in micro_batches:
                out = self.group.wait(mb.index, layer_idx).to(self.device)
                mb.x, mb.residual = layer.after_attention(out, mb.residual)
                if layer_idx + 1 < len(layers):
                    self._send(mb, layers[layer_idx + 1], layer_idx + 1)
        return in_order(
            order,
            [
                row
                for mb in micro_batches
                for row in self._logits(self.model.final_norm(mb.x, mb.residual), mb.chunks)
            ],
        )

    def _start(self, index: int, chunks: list[SeqChunk]) -> _MicroBatch:
        input_ids, positions, _ = self.prepare(chunks)
        # NOTE: no attention callable: each layer's attention is sent to the group.
        batch = ForwardBatch(positions=positions, attention=None)  # type: ignore[arg-type]
        self.group.begin_step(index, chunks)
        x = self.model.embed(input_ids, batch)
        (q, k, v), residual = self._layers()[0].before_attention(x, None, batch)
        self.group.send(index, 0, *self._on_host(q, k, v))
        return _MicroBatch(index, chunks, batch, x, residual)

    def _send(self, mb: _MicroBatch, layer: DecoderLayer, layer_idx: int) -> None:
        (q, k, v), mb.residual = layer.before_attention(mb.x, mb.residual, mb.batch)
        self.group.send(mb.index, layer_idx, *self._on_host(q, k, v))

    def _on_host(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The tensors in host memory: as they are on a CPU; from a GPU, copied into pinned
        memory (what a non-blocking copy to the CPU allocates) with one wait for all."""
        if self.device.type == "cpu":
            return tensors
        host = tuple(t.to("cpu", non_blocking=True) for t in tensors)
        torch.cuda.current_stream(self.device).synchronize()
        return host

    def _layers(self) -> list[DecoderLayer]:
        # NOTE: nn.ModuleList types its items as Module; the model holds DecoderLayers only.
        return cast("list[DecoderLayer]", list(self.model.layers))
