"""The CUDA graphs' static inputs, checked where no GPU is: what a step stages must read,
through the views a graph was captured with, as the eager step's metadata."""

from __future__ import annotations

import torch

from shared.engine.cuda_graphs import DecodeGraphs
from shared.engine.metadata import attention_metadata
from shared.engine.runner import SeqChunk


def test_staged_inputs_read_as_the_eager_metadata():
    graphs = DecodeGraphs(None, None, torch.device("cpu"), 4, max_batch=6, max_blocks=20)
    assert graphs.buckets == [1, 2, 4, 6]
    chunks = [
        SeqChunk("a", [7], 9, [3, 8, 1, 5]),  # position 9: block 8's slot 1
        SeqChunk("b", [11], 0, [2]),
        SeqChunk("c", [4], 35, list(range(10, 19))),  # 9 blocks: the 16-wide table
    ]
    assert graphs.fits(chunks)
    batch, width = 4, graphs._width(9)
    assert width == 16
    size = graphs._stage(chunks, batch, width)
    graphs.inputs[:size].copy_(graphs.staged[:size])
    ids, positions, slots, lens, table = graphs._views(batch, width)
    expected_positions, meta = attention_metadata(chunks, 4, "cpu")
    assert ids.tolist() == [7, 11, 4, 0]
    assert positions[:3].tolist() == expected_positions.tolist()
    assert slots.tolist() == [*meta.slot_mapping.tolist(), -1]  # padding writes nothing
    assert lens.tolist() == [*meta.decode_context_lens.tolist(), 0]  # nor attends
    for row, chunk in enumerate(chunks):
        blocks = -(-chunk.context_len // 4)
        assert table[row, :blocks].tolist() == list(chunk.block_ids[:blocks])


def test_steps_a_graph_cannot_take():
    graphs = DecodeGraphs(None, None, torch.device("cpu"), 4, max_batch=2, max_blocks=3)
    decode = SeqChunk("a", [1], 5, [0, 1])
    assert not graphs.fits([SeqChunk("p", [1, 2], 0, [0])])  # a prefill
    assert not graphs.fits([decode] * 3)  # more than the largest bucket
    assert not graphs.fits([SeqChunk("l", [1], 12, [0, 1, 2, 3])])  # past the widest table
    assert not graphs.fits([])
    assert graphs.fits([decode, decode])
