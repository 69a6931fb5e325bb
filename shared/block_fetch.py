"""Asking one source (a kvstore instance or a peer prefill worker) to send blocks here:
the expectation that gates each layer is set up first, then the request goes out over
the bus; the source's bytes land through this worker's data-plane receiver."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from shared.bus import Bus, ServiceUnavailable
from shared.codec import MessageError, decode, encode
from shared.kv_inbox import Expected, KVInbox
from shared.kvblocks import BlockLayout
from shared.messages import Ack, BlockGet
from shared.transfer.tcp.asker import Asker

log = logging.getLogger("kvstack.block_fetch")


class BlockFetcher:
    def __init__(
        self, bus: Bus, inbox: KVInbox, layout: BlockLayout, data_addr: str, timeout: float
    ) -> None:
        self.bus, self.inbox, self.layout = bus, inbox, layout
        self.data_addr = data_addr  # where my blocks arrive
        self.timeout = timeout

    async def fetch(
        self,
        subject: str,
        transfer_id: str,
        block_hashes: Sequence[int],
        dest_block_ids: Sequence[int],
    ) -> Expected | None:
        """Ask the source serving `subject` to send blocks here; None: it refused."""
        expected = self.inbox.expect(
            transfer_id, list(dest_block_ids), self.layout.num_layers, self.timeout
        )
        message = BlockGet(
            transfer_id,
            tuple(block_hashes),
            tuple(dest_block_ids),
            self.layout,
            self.data_addr,
            time.time() + self.timeout,
        )
        try:
            ack = await self.bus.request(subject, message, self.timeout, expected=Ack)
        except (ServiceUnavailable, MessageError) as e:
            ack = Ack(transfer_id, False, str(e), 503)
        if not ack.ok:
            await self.cancel(expected)
            return None
        return expected

    async def cancel(self, expected: Expected) -> None:
        """Stop accepting bytes for a fetch and wait until none is landing."""
        if self.inbox.retire(expected.transfer_id) is not None:
            try:
                await asyncio.wait_for(expected.idle.wait(), self.timeout)
            except TimeoutError:
                log.error("fetch %s: a frame never finished landing", expected.transfer_id)


class AskingFetcher:
    """Asking a kvstore on its data connection (`tcp.asking`): the get goes out on a
    connection of this worker's and the blocks come back on it, with no bus round trip.
    The same contract as `BlockFetcher`: an expectation gates each layer; None, a miss."""

    def __init__(self, asker: Asker, inbox: KVInbox, layout: BlockLayout, timeout: float) -> None:
        self.asker, self.inbox, self.layout = asker, inbox, layout
        self.timeout = timeout

    async def fetch(
        self,
        data_addr: str,
        transfer_id: str,
        block_hashes: Sequence[int],
        dest_block_ids: Sequence[int],
    ) -> Expected | None:
        """Ask the kvstore at `data_addr` for blocks; None: it does not have them all, or
        did not answer."""
        expected = self.inbox.expect(
            transfer_id, list(dest_block_ids), self.layout.num_layers, self.timeout
        )
        question = BlockGet(
            transfer_id,
            tuple(block_hashes),
            tuple(dest_block_ids),
            self.layout,
            "",  # the asking connection
            time.time() + self.timeout,
        )
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[bytes | None] = loop.create_future()

        def on_answer(reply: bytes | None) -> None:  # from the asker's thread
            loop.call_soon_threadsafe(settle, answered, reply)
            return None  # nothing to send: a get's frames come from the kvstore

        self.asker.submit(data_addr, transfer_id, encode(question), on_answer)
        if not _accepted(await answered):
            await self.cancel(expected)
            return None
        return expected

    async def cancel(self, expected: Expected) -> None:
        """Stop accepting bytes for a fetch, cut its connection, wait until none lands."""
        if self.inbox.retire(expected.transfer_id) is not None:
            self.asker.abort(expected.transfer_id)
            try:
                await asyncio.wait_for(expected.idle.wait(), self.timeout)
            except TimeoutError:
                log.error("fetch %s: a frame never finished landing", expected.transfer_id)


def settle(future: asyncio.Future, value: object) -> None:
    """Resolve `future` unless it is done (call on its loop)."""
    if not future.done():
        future.set_result(value)


def _accepted(reply: bytes | None) -> bool:
    if reply is None:
        return False
    try:
        return decode(reply, expected=Ack).ok
    except MessageError:
        return False
