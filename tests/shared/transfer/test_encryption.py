"""`--data-encrypt` on the TCP transport, over real sockets: KV lands byte-exact while the wire
carries none of it in clear, a byte tampered with anywhere in a frame is never delivered as
good, the two ends must agree on encryption, and encryption needs the data token."""

from __future__ import annotations

import time

import pytest
import torch

from shared.errors import KvstackError
from shared.kvcache.storage import KVStorage
from shared.transfer.base import BlockSpan
from shared.transfer.common.encryption import SALT_BYTES, TAG_BYTES
from shared.transfer.common.handshake import PROOF_BYTES
from shared.transfer.factory import make_receiver as factory_receiver
from shared.transfer.factory import make_sender as factory_sender
from shared.transfer.tcp import HEADER, SPAN, TcpKVReceiver, TcpKVSender
from shared.transfer.tensor_bytes import kv_span_bytes
from tests.shared.transfer.proxy import FlipProxy
from tests.shared.transfer.sinks import (
    MOVES,
    ONE_BLOCK,
    TWO_BLOCKS,
    WAIT_S,
    RecordingSink,
    random_storage,
    send_request,
)
from tests.shared.transfer.test_roundtrip import check_requests_land_byte_exact

TOKEN = "a-deployment-data-token"
SEALED = dict(auth_token=TOKEN, encrypt=True)


@pytest.fixture
def transport() -> str:
    return "tcp"


class Proxies:
    """`proxies(address, flip_at=None)`: a FlipProxy in front of `address`; `made` lists them."""

    def __init__(self) -> None:
        self.made: list[FlipProxy] = []

    def __call__(self, address: str, flip_at: int | None = None) -> FlipProxy:
        self.made.append(FlipProxy(address, flip_at))
        return self.made[-1]


@pytest.fixture
def proxies():
    made = Proxies()
    yield made
    for proxy in made.made:
        proxy.close()


def wait_for_log(caplog, text: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while text not in caplog.text:
        assert time.monotonic() < deadline, f"no log line with {text!r}"
        time.sleep(0.01)


# --- what arrives ----------------------------------------------------------------------------


def assert_sealed(proxy: FlipProxy, *request_ids: str) -> None:
    """The sender's stream went through `proxy` without a request id in clear."""
    assert proxy.sent and not any(rid.encode() in proxy.sent for rid in request_ids)


@pytest.mark.parametrize("part_bytes", [64, 1 << 20])  # a part per span, or one per frame
def test_encrypted_requests_land_byte_exact(
    make_receiver, make_sender, proxies, part_bytes
) -> None:
    def through_proxy(sink, **options):
        receiver, address = make_receiver(sink, **options)
        return receiver, proxies(address).address

    check_requests_land_byte_exact(
        through_proxy,
        lambda **options: make_sender(**options, **SEALED),
        torch.float32,
        part_bytes,
        **SEALED,
    )
    assert_sealed(proxies.made[0], *MOVES)


def test_the_wire_carries_no_kv_byte_and_no_request_id_in_clear(
    make_receiver, make_sender, proxies
) -> None:
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink, **SEALED)
    proxy = proxies(address)
    done = send_request(make_sender(**SEALED), proxy.address, source, "req-a", MOVES["req-a"])
    assert done.wait("req-a") == (True, 3, "")
    sink.wait_ends("req-a")
    k, v = kv_span_bytes(source.kv, 0, BlockSpan(0, 0, 4))  # req-a's first source block
    assert bytes(k)[:32] not in proxy.sent and bytes(v)[:32] not in proxy.sent
    assert_sealed(proxy, "req-a")
    assert [f[4] for f in sink.frames("req-a")] == [True] * 3


def test_spans_larger_than_the_sealing_buffer_land_byte_exact(make_receiver, make_sender):
    """Each half of a block is 512 KiB: the sender seals and sends it a buffer at a time,
    the receiver decrypts it a chunk at a time."""
    shape = dict(num_layers=1, num_blocks=2, block_size=1024, num_kv_heads=4, head_dim=32)
    source, sink = KVStorage(**shape), RecordingSink(KVStorage(**shape))
    source.kv.copy_(torch.randn(source.kv.shape, generator=torch.Generator().manual_seed(0)))
    _, address = make_receiver(sink, **SEALED)
    swap = [(0, BlockSpan(1, 0, 1024)), (1, BlockSpan(0, 0, 1024))]
    done = send_request(make_sender(**SEALED), address, source, "big", swap, layers=[0])
    assert done.wait("big") == (True, 1, "")
    sink.wait_ends("big")
    assert [f[4] for f in sink.frames("big")] == [True]
    assert torch.equal(sink.storage.kv, source.kv.flip(2))  # blocks swapped


@pytest.mark.parametrize("part_bytes", [64, 1 << 20])
def test_a_refused_span_keeps_the_connection_in_step(
    make_receiver, make_sender, proxies, part_bytes
) -> None:
    """The refused request's ciphertext is still opened (into scratch), so the next request
    on the same connection decrypts."""
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8), refused=frozenset({"unknown"}))
    receiver, address = make_receiver(sink, **SEALED)
    proxy, sender = proxies(address), make_sender(part_bytes=part_bytes, **SEALED)
    for rid in ("unknown", "known"):
        send_request(sender, proxy.address, source, rid, TWO_BLOCKS, layers=[0])
    sink.wait_ends("unknown", "known")
    assert_sealed(proxy, "unknown", "known")
    assert [f[4] for f in sink.frames("unknown")] == [False]
    assert [f[4] for f in sink.frames("known")] == [True]
    assert torch.equal(sink.storage.kv[0, :, 4:6], source.kv[0, :, 0:2])
    assert receiver.connections_accepted == 1 and not any(e[0] == "lost" for e in sink.events)


# --- tampering -------------------------------------------------------------------------------

# The sender's stream: salt and proof, then the first frame (layer 0 of "req", TWO_BLOCKS of
# float32: 2 spans of 512 bytes of K and V): HEADER, sealed id and span table, sealed payload.
FRAME_AT = SALT_BYTES + PROOF_BYTES
META_AT = FRAME_AT + HEADER.size
PAYLOAD_AT = META_AT + len(b"req") + len(TWO_BLOCKS) * SPAN.size + TAG_BYTES
PAYLOAD_BYTES = len(TWO_BLOCKS) * 2 * 4 * 2 * 8 * 4
FLIPS = {
    "header: layer": FRAME_AT + 8,
    "span table: block id": META_AT + len(b"req"),
    "payload": PAYLOAD_AT + 77,
    "payload's tag": PAYLOAD_AT + PAYLOAD_BYTES + 3,
}


@pytest.mark.parametrize("flip_at", FLIPS.values(), ids=FLIPS.keys())
def test_a_tampered_byte_is_never_delivered_as_good(
    make_receiver, make_sender, proxies, caplog, flip_at
) -> None:
    """In clear, the flipped frame alone would be reported bad and the request's other frames
    good; sealed, the connection drops at the first frame and nothing of it is reported."""
    source = random_storage(torch.float32)
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    receiver, address = make_receiver(sink, **SEALED)
    proxy = proxies(address, flip_at)
    send_request(make_sender(**SEALED), proxy.address, source, "req", TWO_BLOCKS)
    wait_for_log(caplog, "failed authentication")
    assert not any(e[0] in ("frame", "end") for e in sink.events)
    assert receiver.frames_received == 0
    if flip_at >= PAYLOAD_AT:  # the frame had begun: its request is lost
        sink.wait_for(lambda: bool(sink.events))
        assert sink.events[0][:2] == ("lost", ("req",))
    assert torch.all(sink.storage.kv[1:] == 0)  # no later layer landed either


# --- agreement and the token -----------------------------------------------------------------


@pytest.mark.parametrize("receiver_encrypts", [True, False])
def test_ends_that_disagree_on_encryption_refuse_and_send_nothing(
    make_receiver, make_sender, proxies, caplog, receiver_encrypts
) -> None:
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    _, address = make_receiver(sink, auth_token=TOKEN, encrypt=receiver_encrypts)
    proxy = proxies(address)
    sender = make_sender(auth_token=TOKEN, encrypt=not receiver_encrypts)
    source = random_storage(torch.float32)
    ok, _, error = send_request(sender, proxy.address, source, "req", ONE_BLOCK).wait("req")
    who = ("the receiver", "this sender") if receiver_encrypts else ("this sender", "the receiver")
    assert not ok
    assert f"{who[0]} encrypts KV bytes (--data-encrypt) and {who[1]} does not" in error
    wait_for_log(caplog, "hung up in the handshake")
    assert proxy.sent == b""  # neither a proof nor a frame, in clear or sealed
    assert sink.events == []


def test_encryption_without_the_token_is_refused() -> None:
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    for make in (
        lambda: TcpKVSender(encrypt=True),
        lambda: TcpKVReceiver(sink, "127.0.0.1", 0, encrypt=True),
        lambda: factory_sender("tcp", None, encrypt=True),
        lambda: factory_receiver("tcp", sink, "127.0.0.1", 0, "", encrypt=True),
    ):
        with pytest.raises(KvstackError, match="--data-encrypt needs the data plane's shared"):
            make()


def test_encryption_covers_the_tcp_transport_only() -> None:
    sink = RecordingSink(KVStorage(3, 8, 4, 2, 8))
    for make in (
        lambda: factory_sender("mooncake", TOKEN, encrypt=True),
        lambda: factory_receiver("mooncake", sink, "127.0.0.1", 0, TOKEN, encrypt=True),
    ):
        with pytest.raises(KvstackError, match="covers the tcp transport only"):
            make()
