"""A reservation's prefix that the KV pool holds, fetched by the decode worker itself, so
the prefill worker does not send it again (issue 52).

At reservation the worker asks the pool how many of the prompt's next blocks (past the
ones its own prefix cache holds) it has, and starts a get of them into the reserved
blocks; once the pool answered, those blocks count as held in the reply, and the prefill
worker sends only the rest. The get lands while the prefill computes. At commit it must
have landed whole and intact within `LAND_GRACE_S`, or the request is refused like a
damaged transfer (the gateway places it again) and the worker takes nothing from the pool
for `PAUSE_S`, so the retry (and the requests after it) get their whole KV from prefill.
A get the pool does not answer at all holds the reservation up to the pool's own timeout
(as a prefill worker's fetch waits for its answer) and pauses it too.
A reservation let go first stops the get (`KVPool.cancel`: a stalled link is cut) before
its blocks are freed, so no byte lands in a block that is another request's by then.
"""

from __future__ import annotations

import asyncio
import logging
import time

from shared.kvpool.pool import KVPool
from shared.transfer.inbox import Expected, KVInbox

log = logging.getLogger("kvstack.decode")

# NOTE: the get started at reservation and had the whole prefill to land; at memory or
# network speed a prompt's prefix takes milliseconds, so a get not over by then is stalled
LAND_GRACE_S = 2.0
PAUSE_S = 30.0  # after a get failed or stalled: prefill sends everything meanwhile


class PoolPrefix:
    def __init__(self, pool: KVPool, inbox: KVInbox) -> None:
        self.pool, self.inbox = pool, inbox
        self._gets: dict[str, list[Expected]] = {}  # request id -> its get, by owner
        self.blocks_asked = 0  # blocks the pool answered for (counted in replies as held)
        self.num_failed = 0  # gets that failed or stalled (their requests were refused)
        self._paused_until = 0.0  # time.monotonic(): take nothing from the pool before it

    def owns(self, transfer_id: str) -> bool:
        """Whether an inbox entry is one of these gets (not a reservation of its own)."""
        return any(e.transfer_id == transfer_id for gets in self._gets.values() for e in gets)

    async def leading(self, hashes: list[int]) -> int:
        """How many of a prompt's first blocks the pool holds (0: none, no pool to ask, or
        paused). Asked while the engine reserves, so it adds no round trip of its own."""
        if not hashes or not self.pool.num_members() or time.monotonic() < self._paused_until:
            return 0
        return await self.pool.longest_prefix(hashes)

    async def fetch(self, request_id: str, hashes: list[int], block_ids: list[int]) -> int:
        """Start getting the blocks of `hashes` (which the pool was seen to hold) into
        `block_ids`; how many it answered for: all, or 0 (a miss after all)."""
        if not hashes:
            return 0
        asked = time.monotonic()
        started = await self.pool.get(f"{request_id}:pool", hashes, block_ids)
        if started is None:  # evicted meanwhile, or its owner went: prefill sends them
            if time.monotonic() - asked > LAND_GRACE_S:  # no answer for long: a stalled pool
                self._pause(request_id, "the KV pool did not answer its get")
            return 0
        self._gets[request_id] = started
        self.blocks_asked += len(hashes)
        return len(hashes)

    async def verdict(self, request_id: str) -> str:
        """Empty when the request's get (if any) landed whole and intact."""
        problem = await self._problem(request_id)
        if problem:
            self.num_failed += 1
            self._pause(request_id, problem)
        return problem

    def _pause(self, request_id: str, why: str) -> None:
        self._paused_until = time.monotonic() + PAUSE_S
        log.warning("request %s: %s; taking nothing from the pool for %.0fs",
                    request_id, why, PAUSE_S)  # fmt: skip

    async def _problem(self, request_id: str) -> str:
        for expected in self._gets.get(request_id, ()):
            try:
                await asyncio.wait_for(expected.settled.wait(), LAND_GRACE_S)
            except TimeoutError:
                return f"the prefix from the KV pool had not landed {LAND_GRACE_S:.0f}s later"
            problem = expected.verdict()
            if problem:
                return f"the prefix from the KV pool: {problem}"
        return ""

    def take(self, request_id: str) -> None:
        """The request was adopted: its get is over."""
        for expected in self._gets.pop(request_id, ()):
            self.inbox.take(expected.transfer_id)

    async def drop(self, request_id: str) -> bool:
        """The reservation is let go: stop its get (a stalled one's connection is cut, so
        this does not wait for it). True once no byte can land in its blocks any more
        (False: a frame never finished landing; the blocks must leak)."""
        safe = True
        for expected in self._gets.pop(request_id, ()):
            await self.pool.cancel(expected)
            safe = safe and expected.idle.is_set()
            self.inbox.take(expected.transfer_id)
        return safe
