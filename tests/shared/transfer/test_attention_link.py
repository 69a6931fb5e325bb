"""The attention link over real sockets: frames, counters, refusals and a dead peer."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from services.attention_worker.shard import AttentionShard
from services.attention_worker.slot import ShardSlot
from shared.messages import AttentionAttach
from shared.transfer.attention.client import AttentionLink, AttentionLost
from shared.transfer.attention.server import AttentionServer
from shared.transfer.attention.wire import ChunkSpec, decode_step, encode_step
from shared.transfer.common.frames import ProtocolError


def _shard(loop) -> AttentionShard:
    spec = AttentionAttach(
        "d",
        1,
        0,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        block_size=4,
        dtype="float32",
    )
    return AttentionShard(spec, 1 << 20, loop)


@pytest.fixture
def served():
    loop = asyncio.new_event_loop()
    slot = ShardSlot()
    slot.shard = _shard(loop)
    server = AttentionServer(slot, "127.0.0.1", 0, "secret")
    addr = server.start()
    yield slot, server, addr
    server.stop()
    loop.close()


def test_step_layout_round_trips_and_garbage_is_refused():
    chunks = [ChunkSpec("a", 0, 3, (1, 2)), ChunkSpec("b", 7, 1, (4, 5))]
    assert decode_step(encode_step(chunks)) == chunks
    for bad in (b"{", b'[["a", -1, 1, [0]]]', b'[["a", 0, 0, [0]]]', b'[["a", 0, 1, []]]'):
        with pytest.raises(ProtocolError):
            decode_step(bad)


def test_qkv_out_and_counters(served):
    _slot, server, addr = served
    link = AttentionLink(addr, 4, 8, torch.float32, "secret")
    try:
        link.begin_step(0, [ChunkSpec("a", 0, 2, (0,))])
        q, k, v = torch.randn(2, 4, 8), torch.randn(2, 2, 8), torch.randn(2, 2, 8)
        link.send_qkv(0, 1, q, k, v)
        out, arrived = link.result(0, 1)
        assert out.shape == (2, 4, 8) and arrived > 0
        assert link.counters["qkv_bytes"] == (2 * 4 + 2 * 2 * 2) * 8 * 4
        assert link.counters["out_bytes"] == 2 * 4 * 8 * 4
        # NOTE: the server counts after its send returns, which may be after we read it.
        deadline = time.monotonic() + 5
        while server.bytes_sent != link.counters["out_bytes"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.bytes_sent == link.counters["out_bytes"]
    finally:
        link.close()


def test_a_wrong_token_is_refused(served):
    _, _, addr = served
    with pytest.raises(AttentionLost, match="authentication"):
        AttentionLink(addr, 4, 8, torch.float32, "wrong")


def test_a_refused_step_reaches_the_caller_as_lost_with_the_reason(served):
    _, _, addr = served
    link = AttentionLink(addr, 4, 8, torch.float32, "secret", timeout=10)
    try:
        link.begin_step(0, [ChunkSpec("a", 0, 1, (10_000,))])
        with pytest.raises(AttentionLost, match="outside"):
            link.result(0, 0)
    finally:
        link.close()


def test_a_dead_worker_fails_the_waiting_caller_at_once(served):
    _, server, addr = served
    link = AttentionLink(addr, 4, 8, torch.float32, "secret", timeout=30)
    try:
        link.begin_step(0, [ChunkSpec("a", 0, 1, (0,))])
        server.stop()
        with pytest.raises(AttentionLost):
            link.result(0, 0)
    finally:
        link.close()


def _until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_closed_link_drops_its_shard_and_its_requests(served):
    """Its decode worker re-formed the group without this worker (or is gone): the shard's
    requests would otherwise be held for ever, and the worker's drain would wait on them."""
    slot, _, addr = served
    shard = slot.shard
    link = AttentionLink(addr, 4, 8, torch.float32, "secret")
    link.begin_step(0, [ChunkSpec("a", 0, 1, (0,))])
    assert _until(lambda: "a" in shard.request_blocks)
    link.close()
    assert _until(lambda: slot.shard is None)


def test_the_link_of_a_replaced_shard_leaves_the_new_one_alone(served):
    """A re-formed group attaches (a new shard) before it closes its old links."""
    slot, _, addr = served
    old_link = AttentionLink(addr, 4, 8, torch.float32, "secret")
    old_link.begin_step(0, [ChunkSpec("a", 0, 1, (0,))])
    assert _until(lambda: "a" in slot.shard.request_blocks)
    new_shard = slot.shard = _shard(asyncio.new_event_loop())
    new_link = AttentionLink(addr, 4, 8, torch.float32, "secret")
    try:
        old_link.close()
        new_link.begin_step(0, [ChunkSpec("b", 0, 1, (0,))])
        assert _until(lambda: "b" in new_shard.request_blocks)
        assert slot.shard is new_shard
    finally:
        new_link.close()
    assert _until(lambda: slot.shard is None)
