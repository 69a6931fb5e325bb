"""The attention link over real sockets: frames, counters, refusals and a dead peer."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from services.attention_worker.shard import AttentionShard
from shared.messages import AttentionAttach
from shared.transfer.attention.client import AttentionLink, AttentionLost
from shared.transfer.attention.server import AttentionServer
from shared.transfer.attention.wire import ChunkSpec, decode_step, encode_step
from shared.transfer.common.frames import ProtocolError


@pytest.fixture
def served():
    loop = asyncio.new_event_loop()
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
    shard = AttentionShard(spec, 1 << 20, loop)
    server = AttentionServer(shard, "127.0.0.1", 0, "secret")
    addr = server.start()
    yield shard, server, addr
    server.stop()
    loop.close()


def test_step_layout_round_trips_and_garbage_is_refused():
    chunks = [ChunkSpec("a", 0, 3, (1, 2)), ChunkSpec("b", 7, 1, (4, 5))]
    assert decode_step(encode_step(chunks)) == chunks
    for bad in (b"{", b'[["a", -1, 1, [0]]]', b'[["a", 0, 0, [0]]]', b'[["a", 0, 1, []]]'):
        with pytest.raises(ProtocolError):
            decode_step(bad)


def test_qkv_out_and_counters(served):
    _shard, server, addr = served
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
