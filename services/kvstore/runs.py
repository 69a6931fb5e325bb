"""Runs of blocks as one span. The pool keeps each block in its own buffer, so a run of
blocks that are consecutive at the client travels as one span whose K and V are the
blocks' own buffers in pieces (the data plane gathers them on send and scatters them on
receipt): per-span work, not bytes, is what limits the data plane, and no byte is copied
on the way."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

from services.kvstore.dram import BlockRef
from shared.kvblocks import BlockLayout
from shared.transfer.base import BlockSpan
from shared.transfer.common.frames import Pieces
from shared.transfer.tcp.wire import blocks_per_part


def consecutive(ids: Sequence[int]) -> list[tuple[int, int]]:
    """(start index, length) of each run of consecutive ids."""
    runs: list[list[int]] = []
    for i, value in enumerate(ids):
        if runs and value == ids[runs[-1][0]] + runs[-1][1]:
            runs[-1][1] += 1
        else:
            runs.append([i, 1])
    return [(start, length) for start, length in runs]


def get_spans(
    layers: range, dest_ids: Sequence[int], refs: Sequence[BlockRef], layout: BlockLayout
) -> list[tuple[BlockSpan, Pieces, Pieces]]:
    """A frame of a get: a span per run of consecutive destination blocks, its K (and V)
    every layer of `layers` in turn."""
    spans: list[tuple[BlockSpan, Pieces, Pieces]] = []
    for start, length in runs_within(
        consecutive(dest_ids), blocks_per_part(len(layers), layout.half_bytes)
    ):
        run = refs[start : start + length]
        tokens = length * layout.block_size
        span = BlockSpan(dest_ids[start], 0, tokens, run[0].block_hash if length == 1 else 0)
        spans.append((span, *run_halves(run, layers)))
    return spans


def run_halves(run: Sequence[BlockRef], layers: range) -> tuple[Pieces, Pieces]:
    """A run's K and V pieces over `layers`: each layer's K of every block in turn, then the
    same of V (made by C loops: a 16-block get has 960 pieces)."""
    k_of = [ref.views[2 * layers.start : 2 * layers.stop : 2] for ref in run]
    v_of = [ref.views[2 * layers.start + 1 : 2 * layers.stop : 2] for ref in run]
    if len(run) == 1:
        return k_of[0], v_of[0]
    return tuple(chain.from_iterable(zip(*k_of))), tuple(chain.from_iterable(zip(*v_of)))


def runs_within(runs: list[tuple[int, int]], most: int) -> list[tuple[int, int]]:
    """(start, length) runs cut into runs of at most `most`."""
    return [
        (start + at, min(most, length - at))
        for start, length in runs
        for at in range(0, length, most)
    ]


def halves(run: Sequence[BlockRef], layer: int, half: int) -> tuple[memoryview, ...]:
    """A run's K (half 0) or V (half 1) of one layer, block after block."""
    return tuple(ref.view(layer, half) for ref in run)
