"""Which KV bytes a prefill worker streams to decode: none of the prefix the decode worker
holds already, all the rest, layer by layer."""

from __future__ import annotations

import torch

from services.prefill.streaming import Target, held_tokens, kv_handoff, layer_spans, spans_nbytes
from shared.engine.runner import SeqChunk
from shared.kvcache.storage import KVStorage
from shared.messages import KVReservation

BLOCK = 4


def reservation(num_blocks: int, num_held: int) -> KVReservation:
    return KVReservation("r", True, tuple(range(100, 100 + num_blocks)), "addr", num_held=num_held)


def test_held_tokens_stop_short_of_the_prompt_and_the_table():
    assert held_tokens(reservation(4, 2), 14, BLOCK) == 8
    assert held_tokens(reservation(4, 0), 14, BLOCK) == 0
    assert held_tokens(reservation(4, 4), 16, BLOCK) == 15  # the last token's KV always goes
    assert held_tokens(reservation(2, 9), 14, BLOCK) == 8  # no more than the table it named


def storage() -> KVStorage:
    return KVStorage(2, 8, BLOCK, 1, 2, torch.float32, huge_pages=False)


def test_a_held_prefix_is_not_sent_and_the_rest_is():
    kv = storage()
    # the prompt's 14 tokens in source blocks 0..3; the decode worker holds the first 8
    chunk = SeqChunk("r", list(range(6)), start_pos=8, block_ids=[0, 1, 2, 3])
    target = Target("r", "addr", "d", (100, 101, 102, 103), 8, held=8)
    spans = layer_spans(kv, 0, chunk, target)
    sent = [(s.block_id, s.offset, s.num_tokens) for s, _, _ in spans]
    assert sent == [(102, 0, 4), (103, 0, 2)]  # tokens 8..13: blocks 2 and 3 of the table
    token_bytes = 1 * 2 * 4
    assert spans_nbytes(spans) == 6 * token_bytes * 2  # K and V
    target.bytes_sent += spans_nbytes(spans)
    assert kv_handoff([target]) == (96, 8)


def test_a_chunk_that_ends_inside_the_held_prefix_sends_nothing():
    chunk = SeqChunk("r", list(range(4)), start_pos=0, block_ids=[0, 1, 2, 3])
    target = Target("r", "addr", "d", (100, 101, 102, 103), 8, held=8)
    assert layer_spans(storage(), 0, chunk, target) == []
