"""Test doubles for the workers on either side: a sink that records, on_done results, KV data,
and the moves that the scenarios send."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.base import BlockSpan, KVSender
from shared.transfer.tensor_bytes import kv_span_bytes

WAIT_S = 5.0
# request id -> (source block, destination span); offsets > 0 are partial blocks
MOVES = {
    "req-a": [
        (0, BlockSpan(5, 0, 4, block_hash=0xA1)),
        (1, BlockSpan(2, 0, 4, 0xA2)),
        (2, BlockSpan(7, 1, 2)),
    ],
    "req-b": [(3, BlockSpan(0, 0, 4, 0xB1)), (4, BlockSpan(1, 2, 1))],
    "req-c": [(6, BlockSpan(3, 3, 1))],
}
ONE_BLOCK = [(0, BlockSpan(1, 0, 4))]
TWO_BLOCKS = [(0, BlockSpan(4, 0, 4)), (1, BlockSpan(5, 0, 4))]


class RecordingSink:
    """Lands spans in `storage` (refusing `refused` request ids) and records every event."""

    def __init__(self, storage: KVStorage, refused: frozenset[str] = frozenset()) -> None:
        self.storage = storage
        self.refused = refused
        self.events: list[tuple] = []
        self.changed = threading.Condition()

    def destination(self, request_id, layer, span, nbytes):
        if request_id in self.refused:
            return None
        return kv_span_bytes(self.storage.kv, layer, span)

    def on_frame(self, request_id, layer, spans, ok, error) -> None:
        self._record("frame", request_id, layer, spans, ok, error)

    def on_end(self, request_id, num_frames) -> None:
        self._record("end", request_id, num_frames)

    def on_lost(self, request_ids, error) -> None:
        self._record("lost", tuple(request_ids), error)

    def frames(self, request_id: str) -> list[tuple]:
        return [e for e in self.events if e[0] == "frame" and e[1] == request_id]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = WAIT_S) -> None:
        with self.changed:
            assert self.changed.wait_for(predicate, timeout), f"timed out; events {self.events}"

    def wait_ends(self, *request_ids: str) -> None:
        self.wait_for(lambda: {e[1] for e in self.events if e[0] == "end"} >= set(request_ids))

    def _record(self, *event) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()


class Done:
    """Collects on_done(ok, num_frames, error) results by request id."""

    def __init__(self) -> None:
        self.results: dict[str, tuple[bool, int, str]] = {}
        self.changed = threading.Condition()

    def callback(self, request_id: str):
        def on_done(ok: bool, num_frames: int, error: str) -> None:
            with self.changed:
                self.results[request_id] = (ok, num_frames, error)
                self.changed.notify_all()

        return on_done

    def wait(self, request_id: str, timeout: float = WAIT_S) -> tuple[bool, int, str]:
        with self.changed:
            assert self.changed.wait_for(lambda: request_id in self.results, timeout)
            return self.results[request_id]


def random_storage(dtype: torch.dtype, seed: int = 0, num_blocks: int = 8) -> KVStorage:
    storage = KVStorage(
        num_layers=3, num_blocks=num_blocks, block_size=4, num_kv_heads=2, head_dim=8, dtype=dtype
    )
    gen = torch.Generator().manual_seed(seed)
    storage.kv.copy_(torch.randn(storage.kv.shape, generator=gen))
    return storage


def source_spans(source: KVStorage, layer: int, moves: list[tuple[int, BlockSpan]]):
    """(span, K, V) that send source block `src` into the span's destination block."""
    return [
        (span, *kv_span_bytes(source.kv, layer, BlockSpan(src, span.offset, span.num_tokens)))
        for src, span in moves
    ]


def send_request(
    sender: KVSender,
    address: str,
    source: KVStorage,
    request_id: str,
    moves: list[tuple[int, BlockSpan]],
    layers=range(3),
) -> Done:
    """One frame per layer, then the END; the Done to wait on."""
    done = Done()
    for layer in layers:
        sender.send(address, request_id, layer, source_spans(source, layer, moves))
    sender.finish(address, request_id, done.callback(request_id))
    return done
