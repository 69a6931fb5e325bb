"""A span whose K and V are pieces (the kvstore's blocks, each its own buffer): TCP gathers
them on send and scatters them into the pieces a sink names, with the checksum of the
joined bytes; a transport that cannot gather refuses them before anything is queued."""

from __future__ import annotations

import pytest
import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.base import BlockSpan
from shared.transfer.common.frames import checked_frame, checksum
from shared.transfer.tensor_bytes import kv_span_bytes
from tests.shared.transfer.sinks import Done, RecordingSink, random_storage

SOURCE_BLOCKS = (6, 1, 3)  # a run's blocks where the sender keeps them: anywhere
DEST_BLOCKS = (0, 5, 2)  # and where the sink puts them: anywhere else
LAYER = 2
SEALED = dict(auth_token="a-deployment-data-token", encrypt=True)  # --data-encrypt


@pytest.fixture
def transport() -> str:
    return "tcp"


class PieceSink(RecordingSink):
    """Names each of its `blocks` as a piece of the span, whatever the span."""

    def __init__(self, storage: KVStorage, blocks: tuple[int, ...]) -> None:
        super().__init__(storage)
        self.blocks = blocks

    def destination(self, request_id, layer, span, nbytes):
        halves = [kv_span_bytes(self.storage.kv, layer, BlockSpan(b, 0, 4)) for b in self.blocks]
        return tuple(h[0] for h in halves), tuple(h[1] for h in halves)


def pieces(storage: KVStorage, blocks: tuple[int, ...], layer: int = LAYER):
    halves = [kv_span_bytes(storage.kv, layer, BlockSpan(b, 0, 4)) for b in blocks]
    return tuple(h[0] for h in halves), tuple(h[1] for h in halves)


def send_run(make_sender, address: str, source: KVStorage) -> tuple[bool, int, str]:
    k, v = pieces(source, SOURCE_BLOCKS)
    sender, done = make_sender(), Done()
    sender.send(address, "run", LAYER, [(BlockSpan(0, 0, 4 * len(SOURCE_BLOCKS)), k, v)])
    sender.finish(address, "run", done.callback("run"))
    return done.wait("run")


def send_every_layer(
    make_sender, address: str, source: KVStorage, **sealed
) -> tuple[bool, int, str]:
    """The run's 3 layers as one frame: K of layer 0, then 1, then 2; V likewise."""
    halves = [pieces(source, SOURCE_BLOCKS, layer) for layer in range(3)]
    k = tuple(p for layer_k, _ in halves for p in layer_k)
    v = tuple(p for _, layer_v in halves for p in layer_v)
    sender, done = make_sender(**sealed), Done()
    sender.send(address, "all", 0, [(BlockSpan(0, 0, 12), k, v)], layers=3)
    sender.finish(address, "all", done.callback("all"))
    return done.wait("all")


def test_a_run_in_pieces_lands_in_the_pieces_the_sink_names(make_receiver, make_sender) -> None:
    source = random_storage(torch.float32)
    sink = PieceSink(KVStorage(3, 8, 4, 2, 8, torch.float32), DEST_BLOCKS)
    _, address = make_receiver(sink)
    assert send_run(make_sender, address, source) == (True, 1, "")
    sink.wait_ends("run")
    assert [f[4] for f in sink.frames("run")] == [True]
    for src, dest in zip(SOURCE_BLOCKS, DEST_BLOCKS, strict=True):
        assert torch.equal(sink.storage.kv[LAYER, :, dest], source.kv[LAYER, :, src])
    untouched = [b for b in range(8) if b not in DEST_BLOCKS]
    assert not sink.storage.kv[:, :, untouched].any()


def test_pieces_of_the_wrong_size_refuse_the_span(make_receiver, make_sender) -> None:
    source = random_storage(torch.float32)
    sink = PieceSink(KVStorage(3, 8, 4, 2, 8, torch.float32), DEST_BLOCKS[:2])  # one short
    _, address = make_receiver(sink)
    assert send_run(make_sender, address, source)[0]  # sent; the receiver refuses it
    sink.wait_ends("run")
    assert [f[4] for f in sink.frames("run")] == [False]
    assert not sink.storage.kv.any()  # nothing written where the sink pointed


def test_the_checksum_of_pieces_is_that_of_their_bytes_joined() -> None:
    source = random_storage(torch.float32)
    k, v = pieces(source, SOURCE_BLOCKS)
    joined = memoryview(b"".join(k)), memoryview(b"".join(v))
    assert checksum(k, v) == checksum(*joined)
    assert checksum(k, v) != checksum(tuple(reversed(k)), v)


def test_a_transport_that_cannot_gather_refuses_pieces_before_queueing() -> None:
    k, v = pieces(random_storage(torch.float32), SOURCE_BLOCKS)
    span = BlockSpan(0, 0, 12)
    with pytest.raises(ValueError, match="one buffer"):
        checked_frame("run", LAYER, [(span, k, v)], gather=False)
    assert len(checked_frame("run", LAYER, [(span, k, v)]).spans[0][1]) == 3


def test_a_frame_of_layers_that_do_not_split_evenly_is_refused_before_queueing() -> None:
    k, v = pieces(random_storage(torch.float32), SOURCE_BLOCKS)
    with pytest.raises(ValueError, match="K has"):
        checked_frame("all", 0, [(BlockSpan(0, 0, 12), k[:2], v[:2])], layers=3)  # 2 of 3 parts
    with pytest.raises(ValueError, match="one layer a frame"):
        checked_frame("all", 0, [(BlockSpan(0, 0, 12), k, v)], gather=False, layers=3)


class RefusesLayerOne(PieceSink):
    def destination(self, request_id, layer, span, nbytes):
        return None if layer == 1 else super().destination(request_id, layer, span, nbytes)


class NamesManyLayers(PieceSink):
    """Answers for every layer of a span in one call (`destinations`), as workers do."""

    def __init__(self, storage: KVStorage, blocks: tuple[int, ...]) -> None:
        super().__init__(storage, blocks)
        self.calls: list[range] = []
        self.reports: list[range] = []

    def destination(self, request_id, layer, span, nbytes):
        raise AssertionError("asked a layer at a time")

    def destinations(self, request_id, layers, span, nbytes):
        self.calls.append(layers)
        return [PieceSink.destination(self, request_id, i, span, nbytes) for i in layers]

    def on_frames(self, request_id, layers, spans, ok, error):
        self.reports.append(layers)
        for layer in layers:
            self.on_frame(request_id, layer, spans, ok, error)


class ManyRefusesLayerOne(NamesManyLayers):
    def destinations(self, request_id, layers, span, nbytes):
        found = super().destinations(request_id, layers, span, nbytes)
        return [None if i == 1 else dest for i, dest in zip(layers, found, strict=True)]


class ManyAnswersTooFew(NamesManyLayers):
    def destinations(self, request_id, layers, span, nbytes):
        return super().destinations(request_id, layers, span, nbytes)[:-1]


WHOLE = (PieceSink, NamesManyLayers)


@pytest.mark.parametrize("sealed", [{}, SEALED], ids=["plain", "encrypted"])
@pytest.mark.parametrize(
    "sink_class",
    [PieceSink, RefusesLayerOne, NamesManyLayers, ManyRefusesLayerOne, ManyAnswersTooFew],
)
def test_a_frame_of_every_layer_reaches_the_sink_as_a_frame_per_layer(
    make_receiver, make_sender, sink_class, sealed
) -> None:
    """Whole, or refused whole when the sink refuses any layer of it (nothing written); a
    sink that names many layers at once is asked once for the span's 3 layers, and hears
    of the frame once."""
    source = random_storage(torch.float32)
    sink = sink_class(KVStorage(3, 8, 4, 2, 8, torch.float32), DEST_BLOCKS)
    _, address = make_receiver(sink, **sealed)
    assert send_every_layer(make_sender, address, source, **sealed) == (True, 3, "")
    sink.wait_ends("all")
    if isinstance(sink, NamesManyLayers):
        assert sink.calls == [range(0, 3)] and sink.reports == [range(0, 3)]
    whole = sink_class in WHOLE
    assert [(f[2], f[4]) for f in sink.frames("all")] == [(0, whole), (1, whole), (2, whole)]
    assert [e[2] for e in sink.events if e[0] == "end"] == [3]
    for src, dest in zip(SOURCE_BLOCKS, DEST_BLOCKS, strict=True):
        landed = sink.storage.kv[:, :, dest]
        assert torch.equal(landed, source.kv[:, :, src]) if whole else not landed.any()
