"""Shared-token authentication: HMAC over a nonce, the token itself never on the wire (of
either transport's connection)."""

from __future__ import annotations

import pytest
import torch

from shared.kvcache.storage import KVStorage
from tests.shared.transfer.proxy import FlipProxy
from tests.shared.transfer.sinks import ONE_BLOCK, RecordingSink, random_storage, send_request

TOKEN = "s3cret-token-for-kv"


def transfer(make_receiver, make_sender, receiver_token, sender_token, via_proxy=False):
    """Send one frame and END; returns (sink, on_done result, proxy or None)."""
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink, auth_token=receiver_token)
    proxy = FlipProxy(address) if via_proxy else None
    peer = proxy.address if proxy else address
    sender = make_sender(auth_token=sender_token)
    result = send_request(
        sender, peer, random_storage(torch.float32), "r", ONE_BLOCK, layers=[0]
    ).wait("r")
    if result[0]:
        sink.wait_ends("r")  # every byte has passed the proxy
    if proxy:
        proxy.close()
    return sink, result, proxy


@pytest.mark.parametrize("receiver_token, sender_token", [(TOKEN, TOKEN), (None, None)])
def test_matching_configuration_transfers(
    make_receiver, make_sender, receiver_token, sender_token
) -> None:
    sink, result, _ = transfer(make_receiver, make_sender, receiver_token, sender_token)
    assert result == (True, 1, "")
    assert [f[4] for f in sink.frames("r")] == [True]


@pytest.mark.parametrize("sender_token", ["wrong-token", None])
def test_wrong_or_missing_token_is_refused(make_receiver, make_sender, sender_token) -> None:
    sink, (ok, num_frames, error), _ = transfer(make_receiver, make_sender, TOKEN, sender_token)
    assert not ok and num_frames == 0 and "authentication failed" in error
    assert sink.events == []


def test_token_never_travels(make_receiver, make_sender) -> None:
    _, result, proxy = transfer(make_receiver, make_sender, TOKEN, TOKEN, via_proxy=True)
    assert result == (True, 1, "")
    assert len(proxy.sent) > 32 and TOKEN.encode() not in proxy.sent
