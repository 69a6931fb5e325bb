"""Asking one source (a kvstore instance or a peer prefill worker) to send blocks here:
the expectation that gates each layer is set up first, then the request goes out over
the bus; the source's bytes land through this worker's data-plane receiver."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from shared.bus import Bus, ServiceUnavailable
from shared.codec import MessageError
from shared.kv_inbox import Expected, KVInbox
from shared.kvblocks import BlockLayout
from shared.messages import Ack, BlockGet

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
