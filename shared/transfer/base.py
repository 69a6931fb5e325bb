"""The data-plane contract: how KV bytes of a request move from one worker to another.

A sender streams *frames* (one layer's K and V for a run of blocks) and then an end
marker per request; a receiver writes each span's bytes straight into memory its sink
chose and reports every frame as good or bad. Control (which blocks, which peer) travels
over NATS elsewhere; implementations here only move bytes. `tcp.py` is the default;
others (Mooncake Transfer Engine) implement the same two ABCs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class BlockSpan:
    """A run of token slots, named by the receiver's block id.

    Usually inside one block. With offset 0 and more tokens than a block holds it covers
    consecutive blocks block_id, block_id + 1, ... (their K, and their V, are contiguous in
    KVStorage), which moves many blocks as one span.
    """

    block_id: int
    offset: int
    num_tokens: int
    block_hash: int = 0  # chained hash of a full block; 0 when the block is not full

    def block_ids(self, block_size: int) -> range:
        return range(
            self.block_id, self.block_id + -(-(self.offset + self.num_tokens) // block_size)
        )


# K or V bytes of a span: one buffer, or pieces that travel as one span (TCP gathers them in
# its system calls, and scatters a span into pieces a sink names: no copy on either side).
Half = memoryview | Sequence[memoryview]
# (span, K bytes, V bytes): what a sender reads for one span of one layer.
SpanBytes = tuple[BlockSpan, Half, Half]
# on_done(ok, num_frames, error)
DoneCallback = Callable[[bool, int, str], None]


class KVSender(ABC):
    """Streams KV frames to peers ("host:port"), in order per peer.

    The memory behind every memoryview passed to `send` must stay valid and unchanged
    until that request's `finish` callback has run.
    """

    @abstractmethod
    def send(
        self, peer: str, request_id: str, layer: int, spans: Sequence[SpanBytes], layers: int = 1
    ) -> None:
        """Queue one frame without copying its bytes; returns at once. With `layers` > 1
        (TCP only) the frame carries layers layer .. layer + layers - 1, each span's K (and
        V) holding them one after another, and counts as that many frames: the receiver
        reports one frame per layer, so a request's frames add up alike either way."""

    @abstractmethod
    def finish(self, peer: str, request_id: str, on_done: DoneCallback) -> None:
        """After the request's queued frames are sent, send its end marker, then call
        `on_done(ok, num_frames, error)` from the sender's thread."""

    @abstractmethod
    def close(self) -> None:
        """Stop sending; requests not yet finished get `on_done(False, ...)`."""

    @property
    @abstractmethod
    def bytes_sent(self) -> int:
        """KV payload bytes written so far (headers not counted)."""

    @property
    @abstractmethod
    def frames_sent(self) -> int: ...


class KVSink(Protocol):
    """The receiving worker's side. Callbacks run on the receiver's threads (one per
    connection, so in order per sender); the sink does its own locking."""

    def destination(
        self, request_id: str, layer: int, span: BlockSpan, nbytes: int
    ) -> tuple[Half, Half] | None:
        """Where this span's K and V bytes (`nbytes` each) go, each one buffer or (over TCP)
        pieces in order; None refuses the span (its bytes are read and dropped, and the
        frame is reported bad)."""

    # A sink may also answer for many layers at once (the TCP receiver then asks once a
    # span, not once a layer of it, and reports a frame of many layers in one call):
    #   destinations(request_id, layers: range, span, nbytes) -> [destination per layer]
    # each as `destination` answers, all None (or None for the whole) refusing the span;
    #   on_frames(request_id, layers: range, spans, ok, error): `on_frame` of each layer.
    # And where a span of whole blocks lands in every layer as one array (what a kvstore's
    # get read in place is copied into with one call, `tcp.placed`):
    #   span_array(request_id, span) -> numpy uint8 [layer, K or V, block, byte] or None,
    # then reported through on_frames as a frame of every layer. A sink that keeps blocks
    # whole (the kvstore's put slots) may name one block's memory, in BlockLayout's order:
    #   block_buffer(request_id, index, nbytes, checksum) -> writable memoryview or None,
    # `checksum` (xxh3_64) being what the block hashes to if it lands intact.

    def on_frame(
        self, request_id: str, layer: int, spans: tuple[BlockSpan, ...], ok: bool, error: str
    ) -> None:
        """A frame has landed. When `ok` is False (checksum, size or refusal), the bytes
        written into its destinations must never be used."""

    def on_end(self, request_id: str, num_frames: int) -> None:
        """The sender finished the request after `num_frames` frames."""

    def on_lost(self, request_ids: list[str], error: str) -> None:
        """A connection dropped while these requests still awaited their end marker."""


class KVReceiver(ABC):
    """Accepts senders and feeds their frames to a `KVSink`."""

    @abstractmethod
    def start(self) -> str:
        """Bind and serve; returns the "host:port" actually bound."""

    @abstractmethod
    def stop(self) -> None:
        """Close the listener and every connection (unfinished requests are lost)."""

    @property
    @abstractmethod
    def bytes_received(self) -> int:
        """KV payload bytes read so far (headers not counted)."""

    @property
    @abstractmethod
    def frames_received(self) -> int: ...

    @property
    @abstractmethod
    def frames_rejected(self) -> int:
        """Frames reported with ok=False."""


# NOTE: bytes a frame of several layers carries at least: a frame costs the same Python on
# either side whatever its size, so a block's 30 layers of 12 KB go as one frame, not 30; a
# big transfer still goes in several, so that its first layers are usable while the rest
# arrive.
FRAME_BYTES = 4 << 20


def layer_groups(num_layers: int, layer_bytes: int) -> list[range]:
    """Consecutive layers in groups of at least FRAME_BYTES (the last group maybe less):
    what each frame of a transfer of `layer_bytes` a layer carries."""
    size = max(1, min(num_layers, -(-FRAME_BYTES // max(1, layer_bytes))))
    return [range(first, min(first + size, num_layers)) for first in range(0, num_layers, size)]


def coalesce(
    blocks: Sequence[tuple[int, int, int, int]], block_size: int
) -> list[tuple[int, int, int, int]]:
    """Merge (dest block, source block, offset, num_tokens) pieces into runs where both
    sides are consecutive whole blocks; a run keeps the first block's id on each side."""
    runs: list[list[int]] = []
    for dest, src, offset, num_tokens in blocks:
        last = runs[-1] if runs else None
        whole = offset == 0 and num_tokens == block_size
        if (
            last
            and whole
            and last[2] == 0
            and last[3] % block_size == 0
            and dest == last[0] + last[3] // block_size
            and src == last[1] + last[3] // block_size
        ):
            last[3] += num_tokens
        else:
            runs.append([dest, src, offset, num_tokens])
    return [(dest, src, offset, num_tokens) for dest, src, offset, num_tokens in runs]
