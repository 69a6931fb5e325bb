import asyncio

import torch

from shared.kvcache.storage import KVStorage
from shared.transfer.base import FRAME_BYTES, BlockSpan, coalesce, layer_groups
from shared.transfer.inbox import KVInbox


def test_consecutive_whole_blocks_merge_into_one_run() -> None:
    pieces = [(10, 4, 0, 16), (11, 5, 0, 16), (12, 6, 0, 16), (20, 7, 0, 16), (21, 8, 0, 5)]
    assert coalesce(pieces, 16) == [(10, 4, 0, 48), (20, 7, 0, 16), (21, 8, 0, 5)]


def test_partial_blocks_and_gaps_stay_apart() -> None:
    pieces = [(1, 1, 3, 13), (2, 2, 0, 16), (3, 9, 0, 16)]
    assert coalesce(pieces, 16) == [(1, 1, 3, 13), (2, 2, 0, 16), (3, 9, 0, 16)]


def test_a_run_span_lands_in_every_block_it_covers() -> None:
    async def scenario() -> None:
        storage = KVStorage(2, 8, 4, 1, 2, torch.float32)
        inbox = KVInbox(storage, asyncio.get_running_loop())
        inbox.expect("r", [2, 3, 4], 2, 10)
        k, _v = inbox.destination("r", 1, BlockSpan(2, 0, 12), 0)
        assert k.nbytes == 12 * storage.token_bytes
        k[:] = bytes(range(k.nbytes))
        assert bytes(storage.span_bytes(1, 4, 0, 4)[0]) == bytes(range(64, 96))  # third block
        assert inbox.destination("r", 1, BlockSpan(3, 0, 12), 0) is None  # block 5 not its
        assert inbox.destination("r", 1, BlockSpan(2, 1, 6), 0) is None  # runs start at 0
        many = inbox.destinations("r", range(0, 2), BlockSpan(2, 0, 12), 0)
        assert many == [inbox.destination("r", i, BlockSpan(2, 0, 12), 0) for i in (0, 1)]
        assert inbox.destinations("r", range(0, 2), BlockSpan(3, 0, 12), 0) is None
        inbox.on_frames("r", range(0, 2), (BlockSpan(2, 0, 12),), True, "")
        expected = inbox.take("r")
        assert expected is not None and expected.layers_done == {0, 1}
        assert expected.frames_ok == 2 and not expected.writing

    asyncio.run(scenario())


def test_layer_groups_cover_every_layer_once_in_frames_of_a_few_megabytes() -> None:
    assert layer_groups(30, 12_288) == [range(0, 30)]  # one block: one frame
    big = layer_groups(30, 3 << 20)  # a 2,048-token prefix in float32: 3 MiB a layer
    assert [layer for group in big for layer in group] == list(range(30))
    assert all(len(group) * (3 << 20) >= FRAME_BYTES for group in big[:-1])
    assert len(big) == 15  # its first layers usable while the rest arrive
    assert layer_groups(4, 1 << 30) == [range(i, i + 1) for i in range(4)]
