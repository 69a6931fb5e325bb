"""Decode steps replayed as CUDA graphs: one launch per step instead of hundreds.

A decode step of a small model on a GPU is bound by launches, not by the GPU: a 1B
Llama's step is ~170 kernels of a few microseconds each, and launching them one by one
from Python takes longer than running them. So each decode-only step runs a graph
captured once per (batch bucket, block-table width): the step's token ids, positions,
KV slots, context lengths and block table go to the GPU in one copy into the graph's
static inputs, the graph replays, and the logits come back for sampling.

A batch is padded up to its bucket: padding rows write no KV (slot -1, which the Triton
backend's write skips) and attend to nothing (context length 0). Graphs are captured
lazily, at a shape's first step, and share one memory pool.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from shared.engine.metadata import ChunkLayout
from shared.model.attention import AttentionBackend, AttentionMetadata
from shared.model.llama import ForwardBatch, LlamaModel

log = logging.getLogger(__name__)

# Batch sizes a graph is captured for; a step runs the smallest that holds it.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
MIN_WIDTH = 8  # blocks per row of the smallest block table a graph is captured with
INPUT_ROWS = 4  # token ids, positions, slots, context lengths; then the block table


class DecodeChunk(ChunkLayout, Protocol):
    """What a decode step needs of a sequence (shared/engine/runner.py's SeqChunk)."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def num_logits(self) -> int: ...


@dataclass(frozen=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [batch, vocab] float32, rewritten by every replay


class DecodeGraphs:
    """The captured decode steps of one model over one paged cache."""

    def __init__(
        self,
        model: LlamaModel,
        backend: AttentionBackend,
        device: torch.device,
        block_size: int,
        max_batch: int,
        max_blocks: int,
    ) -> None:
        self.model, self.backend = model, backend
        self.device, self.block_size = device, block_size
        self.buckets = sorted({*(b for b in BATCH_BUCKETS if b < max_batch), max_batch})
        self.max_blocks = max_blocks
        size = self.buckets[-1] * (INPUT_ROWS + max_blocks)
        # One pinned staging buffer and one device buffer: a step is one host-to-device copy.
        pinned = torch.device(device).type == "cuda"  # (the layout is tested on CPU)
        self.staged = torch.zeros(size, dtype=torch.long, pin_memory=pinned)
        self.inputs = torch.zeros(size, dtype=torch.long, device=device)
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.pool: Any = None  # the memory pool the graphs share, from the first capture

    def fits(self, chunks: Sequence[DecodeChunk]) -> bool:
        """A step of decode tokens alone, no larger than the largest bucket."""
        return (
            0 < len(chunks) <= self.buckets[-1]
            and all(c.num_tokens == 1 and c.num_logits == 1 for c in chunks)
            and max(self._blocks(c) for c in chunks) <= self.max_blocks
        )

    def run(self, chunks: Sequence[DecodeChunk]) -> list[torch.Tensor]:
        """Logits [1, vocab] per chunk, in order; valid until the next step."""
        batch = next(b for b in self.buckets if b >= len(chunks))
        width = self._width(max(self._blocks(c) for c in chunks))
        graph = self.graphs.get((batch, width)) or self._capture(batch, width)
        size = self._stage(chunks, batch, width)
        self.inputs[:size].copy_(self.staged[:size], non_blocking=True)
        graph.graph.replay()
        return list(graph.logits[: len(chunks)].split(1))

    def _blocks(self, chunk: DecodeChunk) -> int:
        return -(-chunk.context_len // self.block_size)

    def _width(self, blocks: int) -> int:
        width = MIN_WIDTH
        while width < blocks:
            width *= 2
        return min(width, self.max_blocks)

    def _stage(self, chunks: Sequence[DecodeChunk], batch: int, width: int) -> int:
        """The step's inputs into the staging buffer, laid out as `_views` reads them."""
        n, size = len(chunks), batch * (INPUT_ROWS + width)
        staged = self.staged.numpy()[:size]
        ids, positions, slots, lens = (staged[i * batch : (i + 1) * batch] for i in range(4))
        table = staged[INPUT_ROWS * batch :].reshape(batch, width)
        ids[:n] = [c.token_ids[0] for c in chunks]
        positions[:n] = [c.start_pos for c in chunks]
        slots[:n] = [self._slot(c) for c in chunks]
        lens[:n] = [c.context_len for c in chunks]
        ids[n:], positions[n:], slots[n:], lens[n:] = 0, 0, -1, 0  # padding rows
        for row, c in enumerate(chunks):  # table entries past a row's context are never read
            blocks = self._blocks(c)
            table[row, :blocks] = c.block_ids[:blocks]
        return size

    def _slot(self, chunk: DecodeChunk) -> int:
        block = chunk.block_ids[chunk.start_pos // self.block_size]
        return block * self.block_size + chunk.start_pos % self.block_size

    def _views(self, batch: int, width: int) -> tuple[torch.Tensor, ...]:
        ids, positions, slots, lens = (
            self.inputs[i * batch : (i + 1) * batch] for i in range(INPUT_ROWS)
        )
        table = self.inputs[INPUT_ROWS * batch : batch * (INPUT_ROWS + width)].view(batch, width)
        return ids, positions, slots, lens, table

    def _capture(self, batch: int, width: int) -> _Graph:
        ids, positions, slots, lens, table = self._views(batch, width)
        # The warm-up and capture passes read token 0 at position 0, write no KV (slot -1)
        # and attend to nothing: whatever a step of another shape left here is overwritten.
        ids.zero_()
        positions.zero_()
        slots.fill_(-1)
        lens.zero_()
        meta = AttentionMetadata(
            slot_mapping=slots,
            num_decode_tokens=batch,
            decode_block_table=table,
            decode_context_lens=lens,
        )

        def forward() -> torch.Tensor:
            attend = lambda layer, q, k, v: self.backend.forward(layer, q, k, v, meta)
            hidden = self.model(ids, ForwardBatch(positions=positions, attention=attend))
            return self.model.compute_logits(hidden)

        with torch.cuda.device(self.device):
            # NOTE: a pass first, off the capture: Triton compiles and cuBLAS picks its
            # kernels there, neither of which a capture may do.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                forward()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                logits = forward()
        self.pool = graph.pool()
        captured = self.graphs[(batch, width)] = _Graph(graph, logits)
        log.info("captured a decode CUDA graph: batch %d, block table width %d", batch, width)
        return captured
