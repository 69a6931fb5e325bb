"""Asking one source (a kvstore instance or a peer prefill worker) to send blocks here:
the expectation that gates each layer is set up first, then the request goes out, over
the bus (`BlockFetcher`: the source's bytes land through this worker's data-plane
receiver) or on a connection of this worker's to a kvstore's data port, where the
blocks come back (`AskingFetcher`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TypeVar

from shared.codec import MessageError, decode, encode
from shared.kvblocks import BlockLayout
from shared.messages import Ack, BlockGet
from shared.runtime.bus import Bus, ServiceUnavailable
from shared.transfer.inbox import Expected, KVInbox
from shared.transfer.tcp.asker import Asker

log = logging.getLogger("kvstack.block_fetch")
T = TypeVar("T")


class _Fetcher:
    """What both ways share: the expectation and the get, and cancelling."""

    def __init__(self, inbox: KVInbox, layout: BlockLayout, timeout: float) -> None:
        self.inbox, self.layout = inbox, layout
        self.timeout = timeout

    def _expect(
        self,
        transfer_id: str,
        block_hashes: Sequence[int],
        dest_block_ids: Sequence[int],
        dest_addr: str,
    ) -> tuple[Expected, BlockGet]:
        expected = self.inbox.expect(
            transfer_id, list(dest_block_ids), self.layout.num_layers, self.timeout
        )
        message = BlockGet(
            transfer_id,
            tuple(block_hashes),
            tuple(dest_block_ids),
            self.layout,
            dest_addr,
            time.time() + self.timeout,
        )
        return expected, message

    async def cancel(self, expected: Expected) -> None:
        """Stop accepting bytes for a fetch and wait until none is landing."""
        if self.inbox.retire(expected.transfer_id) is not None:
            self._abort(expected.transfer_id)
            try:
                await asyncio.wait_for(expected.idle.wait(), self.timeout)
            except TimeoutError:
                log.error("fetch %s: a frame never finished landing", expected.transfer_id)

    def _abort(self, transfer_id: str) -> None:
        """Cut what may still be landing, if that is this side's to cut."""


class BlockFetcher(_Fetcher):
    def __init__(
        self, bus: Bus, inbox: KVInbox, layout: BlockLayout, data_addr: str, timeout: float
    ) -> None:
        super().__init__(inbox, layout, timeout)
        self.bus = bus
        self.data_addr = data_addr  # where my blocks arrive

    async def fetch(
        self,
        subject: str,
        transfer_id: str,
        block_hashes: Sequence[int],
        dest_block_ids: Sequence[int],
    ) -> Expected | None:
        """Ask the source serving `subject` to send blocks here; None: it refused."""
        expected, message = self._expect(transfer_id, block_hashes, dest_block_ids, self.data_addr)
        try:
            ack = await self.bus.request(subject, message, self.timeout, expected=Ack)
        except (ServiceUnavailable, MessageError) as e:
            ack = Ack(transfer_id, False, str(e), 503)
        if not ack.ok:
            await self.cancel(expected)
            return None
        return expected


class AskingFetcher(_Fetcher):
    """Asking a kvstore on its data connection (`tcp.asking`): the get goes out on a
    connection of this worker's and the blocks come back on it, with no bus round trip.
    The same contract as `BlockFetcher`: an expectation gates each layer; None, a miss."""

    def __init__(self, asker: Asker, inbox: KVInbox, layout: BlockLayout, timeout: float) -> None:
        super().__init__(inbox, layout, timeout)
        self.asker = asker

    async def fetch(
        self,
        data_addr: str,
        transfer_id: str,
        block_hashes: Sequence[int],
        dest_block_ids: Sequence[int],
    ) -> Expected | None:
        """Ask the kvstore at `data_addr` for blocks; None: it does not have them all, or
        did not answer."""
        # "": the blocks come back on the asking connection
        expected, question = self._expect(transfer_id, block_hashes, dest_block_ids, "")
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[bytes | None] = loop.create_future()

        def on_answer(reply: bytes | None) -> None:  # from the asker's thread
            loop.call_soon_threadsafe(settle, answered, reply)
            return None  # nothing to send: a get's frames come from the kvstore

        self.asker.submit(data_addr, transfer_id, encode(question), on_answer)
        if not _accepted(await answer_within(answered, self.timeout)):
            await self.cancel(expected)
            return None
        return expected

    def _abort(self, transfer_id: str) -> None:
        self.asker.abort(transfer_id)  # a stalled answer ends now, not at the read timeout


async def answer_within(answered: asyncio.Future[T], timeout: float) -> T | None:
    """The asker's answer, or None when none came within `timeout` (its threads all busy
    with stalled asks, say)."""
    try:
        return await asyncio.wait_for(answered, timeout)
    except TimeoutError:
        return None


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
