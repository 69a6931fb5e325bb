"""A GPU worker's KV goes through a host mirror: senders copy spans to it, receivers copy
the spans they filled back. Tested on CPU with the mirror forced (KVSTACK_KV_HOST_MIRROR):
a call site that forgets its copy sends, or computes on, the other side's stale bytes."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.prefill.streaming import Target, layer_spans
from shared.engine.runner import SeqChunk
from shared.kvcache.storage import HOST_MIRROR_ENV, KVStorage
from shared.transfer.inbox import KVInbox


@pytest.fixture(autouse=True)
def mirrored(monkeypatch):
    monkeypatch.setenv(HOST_MIRROR_ENV, "1")


def random_storage() -> KVStorage:
    storage = KVStorage(2, 8, 4, 2, 8, torch.bfloat16)
    storage.kv.normal_()
    return storage


def test_spans_reach_the_mirror_only_when_copied_and_back_only_their_tokens():
    storage = random_storage()
    assert storage.mirrored and storage.host() is not storage.kv
    assert not any(storage.span_bytes(1, 2, 1, 6)[0])  # nothing copied yet: zeros
    storage.to_host(1, 2, 1, 6)  # block 2 from slot 1, on into block 3
    k, _ = storage.span_bytes(1, 2, 1, 6)
    assert (
        bytes(k)
        == storage.kv[1, 0].flatten(0, 1)[9:15].contiguous().view(torch.uint8).numpy().tobytes()
    )
    before = storage.kv.clone()
    k[:] = bytes(len(k))  # the data plane writes zeros into the mirror ...
    storage.to_device(1, 2, 1, 6)  # ... and hands the run over
    changed = (storage.kv != before).flatten(4).any(-1)  # [layer, k/v, block, slot]
    assert storage.kv[1, 0].flatten(0, 1)[9:15].eq(0).all()
    assert changed[1, 0].flatten().nonzero().flatten().tolist() == list(range(9, 15))
    assert not changed[1, 1].any() and not changed[0].any()  # V was written back unchanged


def test_a_layer_wise_stream_lands_on_the_receivers_device_side(make_receiver, make_sender):
    """Prefill's layer spans (copied to its mirror) over a real transport into a KVInbox
    (copied off its mirror): the receiver's KV equals the sender's, token for token."""

    async def scenario() -> None:
        source, dest = random_storage(), KVStorage(2, 8, 4, 2, 8, torch.bfloat16)
        inbox = KVInbox(dest, asyncio.get_running_loop())
        _, address = make_receiver(inbox)
        sender = make_sender()
        chunk = SeqChunk("r", list(range(10)), 0, [5, 1, 6])  # 10 tokens over 3 blocks
        target = Target("r", address, "decode-0", (2, 3, 7))
        expected = inbox.expect("r", [2, 3, 7], num_layers=2, ttl=30)
        for layer in range(2):
            sender.send(address, "r", layer, layer_spans(source, layer, chunk, target))
        sender.finish(address, "r", lambda *_: None)
        await asyncio.wait_for(expected.settled.wait(), 30)
        assert expected.verdict() == ""
        for src, dst, tokens in ((5, 2, 4), (1, 3, 4), (6, 7, 2)):
            assert torch.equal(dest.kv[:, :, dst, :tokens], source.kv[:, :, src, :tokens])

    asyncio.run(scenario())
