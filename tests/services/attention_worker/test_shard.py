"""A shard holds whole KV heads and refuses layouts it cannot hold."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.attention_worker.shard import AttentionShard
from shared.attention_groups import kv_head_range, usable_group_size
from shared.errors import KvstackError
from shared.messages import AttentionAttach
from shared.transfer.attention.wire import ChunkSpec


def attach(group_size: int = 1, shard: int = 0) -> AttentionAttach:
    return AttentionAttach(
        "d",
        group_size,
        shard,
        num_layers=2,
        num_heads=8,
        num_kv_heads=4,
        head_dim=16,
        block_size=4,
        dtype="float32",
    )


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_heads_split_whole_and_in_order():
    assert [kv_head_range(4, 2, i) for i in range(2)] == [(0, 2), (2, 4)]
    assert kv_head_range(3, 1, 0) == (0, 3)


def test_a_group_that_does_not_divide_the_kv_heads_is_a_clear_error():
    with pytest.raises(KvstackError, match="cannot split 3 KV heads evenly"):
        kv_head_range(3, 2, 0)


def test_a_rebuilt_group_is_the_largest_count_that_divides_the_heads():
    assert usable_group_size(3, 2) == 1
    assert usable_group_size(4, 3) == 2
    assert usable_group_size(8, 8) == 8
    assert usable_group_size(3, 0) == 0


def test_pool_size_follows_the_byte_budget_of_its_heads(loop):
    one = AttentionShard(attach(1), 1 << 20, loop)
    half = AttentionShard(attach(2, 1), 1 << 20, loop)
    assert half.storage.num_blocks == 2 * one.storage.num_blocks
    assert half.kv_heads == (2, 4) and half.num_heads == 4


def test_a_step_naming_blocks_outside_the_pool_is_refused(loop):
    shard = AttentionShard(attach(), 1 << 16, loop)
    with pytest.raises(ValueError, match="outside"):
        shard.begin_step(0, [ChunkSpec("r", 0, 1, (shard.storage.num_blocks,))])
    with pytest.raises(ValueError, match="do not fit"):
        shard.begin_step(0, [ChunkSpec("r", 4, 1, (0,))])
    with pytest.raises(ValueError, match="before its STEP"):
        shard.qkv_buffers(3)


def test_attention_appends_kv_and_matches_a_plain_softmax(loop):
    shard = AttentionShard(attach(), 1 << 20, loop)
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 8, 16), torch.randn(3, 4, 16), torch.randn(3, 4, 16)
    shard.begin_step(0, [ChunkSpec("r", 0, 3, (5,))])  # a 3-token prefill
    out = shard.attend(0, 1, q, k, v)
    scores = torch.einsum("thd,shd->hts", q, k.repeat_interleave(2, 1)) / 4.0
    scores = scores.masked_fill(torch.ones(3, 3).triu(1).bool(), float("-inf"))
    want = torch.einsum("hts,shd->thd", scores.softmax(-1), v.repeat_interleave(2, 1))
    assert torch.allclose(out, want, atol=1e-5)
    assert torch.equal(shard.storage.layer(1)[1][5, :3], v)  # V landed in block 5
    assert shard.used_blocks == 1
    shard.release(["r"])
    assert shard.used_blocks == 0
