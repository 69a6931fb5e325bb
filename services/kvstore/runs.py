"""Runs of blocks as one span. The pool keeps each block in its own buffer, so a run of
blocks that are consecutive at the client travels through one staging buffer per layer
(one copy) instead of as one small span per block: per-span work, not bytes, is what
limits the data plane."""

from __future__ import annotations

from collections.abc import Sequence

from services.kvstore.dram import BlockRef
from shared.kvblocks import BlockLayout
from shared.transfer.base import BlockSpan, SpanBytes


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
    layer: int, dest_ids: Sequence[int], refs: Sequence[BlockRef], layout: BlockLayout
) -> list[SpanBytes]:
    """One layer of a get: a span per run of consecutive destination blocks."""
    spans: list[SpanBytes] = []
    for start, length in consecutive(dest_ids):
        run = refs[start : start + length]
        tokens = length * layout.block_size
        span = BlockSpan(dest_ids[start], 0, tokens, run[0].block_hash if length == 1 else 0)
        k, v = (_joined([r.view(layer, half) for r in run]) for half in (0, 1))
        spans.append((span, k, v))
    return spans


def _joined(views: list[memoryview]) -> memoryview:
    if len(views) == 1:
        return views[0]
    staging = bytearray(sum(v.nbytes for v in views))
    at = 0
    for view in views:
        staging[at : at + view.nbytes] = view
        at += view.nbytes
    return memoryview(staging)


def scatter(staging: tuple[memoryview, memoryview], refs: Sequence[BlockRef], layer: int) -> None:
    """A run that landed in staging buffers, copied into its blocks' own buffers."""
    for half, joined in enumerate(staging):
        at = 0
        for ref in refs:
            view = ref.view(layer, half)
            view[:] = joined[at : at + view.nbytes]
            at += view.nbytes
