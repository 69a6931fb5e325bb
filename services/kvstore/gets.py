"""A get of blocks: checked, pinned, counted and cut into frames, whichever way it came:
over the bus (the blocks then go to the asker's data address) or on a data connection
(`shared/transfer/tcp/asking.py`: they go back on that connection)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import Counter

from services.kvstore.dram import UNKNOWN_CHECKSUM, BlockRef
from services.kvstore.runs import get_spans
from services.kvstore.store import BlockStore
from shared.codec import encode
from shared.messages import Ack, BlockGet
from shared.transfer.base import layer_groups
from shared.transfer.common.frames import Frame, check_request_id
from shared.transfer.tcp.asking import Answer
from shared.transfer.tcp.placed import encode_placed


class Gets:
    def __init__(self, store: BlockStore, served_bytes: Counter) -> None:
        self.store = store
        self.served_bytes = served_bytes  # block bytes sent to clients
        self.num_misses = 0
        self.asked_bytes = 0  # block bytes sent back on data connections (not by the sender)

    @staticmethod
    def refused(msg: BlockGet) -> Ack | None:
        """Why a get cannot be served as asked, before anything is pinned."""
        if len(msg.block_hashes) != len(msg.dest_block_ids):
            return Ack(
                msg.request_id, False, "block_hashes and dest_block_ids differ in length", 400
            )
        return None

    def counted(self, msg: BlockGet, refs: list[BlockRef | None]) -> Ack:
        """All pinned, or a miss (what was pinned is let go)."""
        if any(ref is None for ref in refs):
            self.store.release([ref for ref in refs if ref is not None])
            self.num_misses += 1
            return Ack(msg.request_id, False, "some blocks are not here (any more)", 404)
        self.served_bytes.inc(msg.layout.block_bytes * len(refs))
        return Ack(msg.request_id, True)

    @staticmethod
    def frames(msg: BlockGet, refs: Sequence[BlockRef]) -> Iterator[Frame]:
        """A few layers a frame (`layer_groups`): a big get's first layers are usable while
        the rest are on the way (each frame made as it is due)."""
        layout = msg.layout
        check_request_id(msg.request_id)
        for layers in layer_groups(layout.num_layers, 2 * layout.half_bytes * len(refs)):
            spans = get_spans(layers, msg.dest_block_ids, refs, layout)
            # NOTE: not checked_frame: the pieces are the blocks' own flat byte views
            # already, and making them again cost a fifth of a 16-block get's Python
            yield Frame(msg.request_id, layers.start, tuple(spans), len(layers))

    def answer(self, msg: BlockGet) -> Answer:
        """A get asked on a data connection (its thread: promoting from SSD may read files)."""
        ack = self.refused(msg)
        if ack is not None:
            return Answer(encode(ack))
        refs = self.store.pin_resident(msg.block_hashes, msg.layout)
        if None in refs:
            refs = self.store.acquire(msg.block_hashes, msg.layout, refs)
        ack = self.counted(msg, refs)
        if not ack.ok:
            return Answer(encode(ack))
        pinned = [ref for ref in refs if ref is not None]
        self.asked_bytes += msg.layout.block_bytes * len(pinned)
        return Answer(
            encode(ack),
            msg.request_id,
            self.frames(msg, pinned),
            lambda ok: self.store.release(pinned),
            placed_message(msg, pinned),
        )


def placed_message(msg: BlockGet, refs: Sequence[BlockRef]) -> bytes:
    """The PLACED message of a get whose every block lies in the shared arena, hashed;
    empty otherwise (its frames go instead). An asker on this host copies them out."""
    if any(ref.slot < 0 or ref.checksum == UNKNOWN_CHECKSUM for ref in refs):
        return b""
    layout = msg.layout
    check_request_id(msg.request_id)
    entries = [(dest, ref.slot, ref.checksum) for dest, ref in zip(msg.dest_block_ids, refs)]
    return encode_placed(
        msg.request_id, layout.num_layers, layout.block_bytes, layout.block_size, entries
    )
