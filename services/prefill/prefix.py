"""A prompt's cached prefix, wherever it is: the local cache, then the KV pool, then
a peer prefill worker. Remote blocks are fetched into blocks reserved for the request,
layer by layer, while the engine computes: before each layer the gate waits until that
layer of every fetched block has landed intact, so loading layer l + 1 overlaps
computing layer l. A fetch that fails mid-step, or stalls past its bound
(shared/prefill/worth.py: stall_bound), invalidates the request (its KV is never used or
named), and the worker computes the prefix in its place (PrefillService._recompute). A
prefix is fetched only where the worker's measured rates say loading beats computing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from shared import subjects
from shared.engine.interface import EngineInterface
from shared.engine.loop import EngineLoop
from shared.engine.runner import SeqChunk
from shared.kvpool.block_fetch import BlockFetcher
from shared.kvpool.pool import KVPool
from shared.messages import PrefillRequest
from shared.prefill.prefix import (
    KVSTORE,
    NO_PREFIX,
    PrefixPlan,
    after_fetch,
    after_reserve,
    load_failure,
    plan_prefix,
    source_kind,
    usable_blocks,
)
from shared.prefill.worth import (
    Rates,
    after_load,
    after_prefill,
    seconds,
    stall_bound,
    worth_loading,
)
from shared.runtime.tasks import Tasks
from shared.transfer.inbox import Expected, KVInbox

log = logging.getLogger("kvstack.prefill")


@dataclass
class PrefixLoad:
    """What one request fetches, from where, and how it went."""

    request_id: str
    num_local_blocks: int
    fetched_hashes: list[int]
    source: str  # KVSTORE or a peer's worker id
    expectations: list[Expected] = field(default_factory=list)
    failed: bool = False
    nbytes: int = 0  # the fetched blocks' KV bytes
    began: float = 0.0  # time.monotonic() when the fetch was asked for
    deadline: float = float("inf")  # time.monotonic() past which it has stalled

    def measured(self) -> tuple[int, float]:
        """(bytes, seconds) of the fetch, from its start until the last of its layers
        landed intact; (0, 0.0) for one that failed or has not landed whole (yet)."""
        whole = self.expectations and all(
            len(e.layers_done) == e.num_layers for e in self.expectations
        )
        if self.failed or not whole:
            return 0, 0.0
        return self.nbytes, max(0.0, max(e.landed_at for e in self.expectations) - self.began)


class PrefixLoader:
    def __init__(
        self,
        engine_loop: EngineLoop,
        pool: KVPool,
        peers: BlockFetcher,
        inbox: KVInbox,
        layer_timeout: float = 10.0,
        tasks: Tasks | None = None,
    ) -> None:
        self.engine_loop = engine_loop
        self.pool = pool
        self.peers = peers  # peer prefill workers' caches
        self.inbox = inbox
        self.layer_timeout = layer_timeout
        self.tasks = tasks or Tasks("prefix loader")
        self.loads: dict[str, PrefixLoad] = {}  # fetches in flight, or failed (until forget)
        self.landed: dict[str, PrefixLoad] = {}  # fetches that landed whole (until forget)
        self.blocks_loaded = {KVSTORE: 0, "peer": 0}
        self.rates = Rates()  # the service adds its prefills' (after_prefill)
        self.declined = 0  # prefixes computed: predicted faster than loading them
        self.stalled = 0  # fetches given up past their bound

    async def plan(self, req: PrefillRequest, hashes: list[int]) -> PrefixPlan:
        """Where the prompt's prefix would come from now; nothing reserved or fetched."""
        block_size = self.pool.layout.block_size
        usable = usable_blocks(len(req.prompt_token_ids), len(hashes), block_size)
        local = await self.engine_loop.call(lambda e: e.cached_prefix_blocks(hashes, usable))
        if not req.load_prefix:  # the conductor found recomputing cheaper than loading
            return PrefixPlan(local)
        pool_blocks = await self._pool_blocks(hashes[local:usable])
        return plan_prefix(usable, local, pool_blocks, req.prefix_peer, req.prefix_peer_blocks)

    async def prepare(self, req: PrefillRequest, hashes: list[int]) -> PrefixPlan:
        """Reserve and start fetching what is cached elsewhere; returns the plan, whose
        blocks need no compute (NO_PREFIX: nothing remote, the engine matches locally)."""
        if not req.load_prefix:
            return NO_PREFIX
        plan = await self.plan(req, hashes)
        if not plan.fetched_blocks or not self._worth_loading(plan, len(req.prompt_token_ids)):
            return NO_PREFIX
        reserved = await self.engine_loop.call(
            lambda e: e.reserve_prefix(req.request_id, hashes, plan.blocks)
        )
        if reserved is None:
            return NO_PREFIX
        num_local, new_ids = reserved
        plan = after_reserve(plan, num_local)
        fetched = hashes[num_local : plan.blocks]
        nbytes = len(fetched) * self.pool.layout.block_bytes
        began = time.monotonic()
        bound = stall_bound(self.rates, nbytes, len(req.prompt_token_ids), self.layer_timeout)
        load = PrefixLoad(
            req.request_id, num_local, fetched, plan.source, nbytes=nbytes, began=began
        )
        started = await self._fetch(req, load, new_ids)
        # NOTE: from here, not from asking: asking ran before the prompt could compute
        load.deadline = time.monotonic() + bound
        plan = after_fetch(plan, started)
        log.info(
            "request %s: %d prefix blocks local, %d from %s%s",
            req.request_id,
            num_local,
            len(load.fetched_hashes),
            load.source,
            "" if started else " (refused: computing)",
        )
        if started:
            self.loads[req.request_id] = load
            self.tasks.spawn(self._settle(load), f"settling the prefix load of {req.request_id}")
        return plan

    def _worth_loading(self, plan: PrefixPlan, num_prompt_tokens: int) -> bool:
        """Whether loading beats computing: the load overlaps computing the rest of the
        prompt layer by layer, so it is weighed against computing all the prompt past its
        local prefix, what this prefill computes without it."""
        layout = self.pool.layout
        load = seconds(plan.fetched_blocks * layout.block_bytes, self.rates.load_bytes_per_s)
        without = num_prompt_tokens - plan.local_blocks * layout.block_size
        compute = seconds(without, self.rates.prefill_tokens_per_s)
        if worth_loading(load, compute):
            return True
        self.declined += 1
        log.info("prefix of %d blocks: computing (%.3fs) beats loading (%.3fs)",
                 plan.fetched_blocks, compute, load)  # fmt: skip
        return False

    async def _pool_blocks(self, hashes: list[int]) -> int:
        """How many of `hashes`, from the first, the kvstore pool holds (0: no pool)."""
        return await self.pool.longest_prefix(hashes) if self.pool.num_members() else 0

    async def _fetch(self, req: PrefillRequest, load: PrefixLoad, dest_ids: list[int]) -> bool:
        transfer = f"{req.request_id}:prefix"
        if load.source == KVSTORE:
            started = await self.pool.get(transfer, load.fetched_hashes, dest_ids)
        else:
            one = await self.peers.fetch(
                subjects.prefill_get(load.source), transfer, load.fetched_hashes, dest_ids
            )
            started = None if one is None else [one]
        load.expectations = started or []
        return started is not None

    async def _settle(self, load: PrefixLoad) -> None:
        """Once every transfer ended, drop them from the inbox and count what came. A failed
        load stays known until the request ends (`forget`): the gate of a layer not yet
        computed must still see it fail, or that layer would read blocks that never came."""
        for expected in load.expectations:
            await expected.settled.wait()
            self.inbox.take(expected.transfer_id)
        if any(e.verdict() for e in load.expectations):
            return
        self.blocks_loaded[source_kind(load.source)] += len(load.fetched_hashes)
        self.rates = after_load(self.rates, *load.measured())
        if self.loads.pop(load.request_id, None) is not None:
            self.landed[load.request_id] = load

    def prefilled(self, num_computed: int, compute_seconds: float) -> None:
        """A prompt that fetched nothing computed `num_computed` tokens in that time."""
        self.rates = after_prefill(self.rates, num_computed, compute_seconds)

    def forget(self, request_id: str) -> PrefixLoad | None:
        """The request ended: its load, failed or not, is of no more use here; returned
        for its measures."""
        load = self.loads.pop(request_id, None)
        return self.landed.pop(request_id, None) or load

    # -- engine thread ------------------------------------------------------------------

    def gate(self, engine: EngineInterface, layer: int, chunks: list[SeqChunk]) -> None:
        """Before `layer` computes: wait for that layer of every block being fetched.

        A failed load invalidates the request once; its later layers are not waited for.
        """
        for chunk in chunks:
            load = self.loads.get(chunk.request_id)
            if load is None or load.failed:
                continue
            for expected in load.expectations:
                wait = min(self.layer_timeout, load.deadline - time.monotonic())
                if not self.inbox.wait_layer(expected, layer, max(0.0, wait)):
                    self._give_up(engine, chunk, load, expected, layer)
                    break

    def _give_up(
        self,
        engine: EngineInterface,
        chunk: SeqChunk,
        load: PrefixLoad,
        expected: Expected,
        layer: int,
    ) -> None:
        stalled = not expected.error and time.monotonic() >= load.deadline
        error = f"stalled past {load.deadline - load.began:.3f}s" if stalled else expected.error
        why = load_failure(error, layer)
        log.warning("request %s: %s", load.request_id, why)
        engine.invalidate(chunk.request_id, why)
        load.failed = True
        self.stalled += stalled
