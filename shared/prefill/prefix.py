"""Where a prompt's cached prefix comes from: the local cache, then the kvstore pool, or
the peer prefill worker the placement names when that one holds more. Only leading full
blocks count, and one prompt token is always computed (it yields the first token)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import PREFIX_LOAD_FAILED

KVSTORE = "kvstore"  # the source named for the pool; any other source is a peer's worker id


@dataclass(frozen=True, slots=True)
class PrefixPlan:
    """Leading blocks a prefill finds in its own cache, and fetches from `source`."""

    local_blocks: int = 0
    fetched_blocks: int = 0
    source: str = ""  # KVSTORE, a peer prefill worker's id, or "" (nothing fetched)

    @property
    def blocks(self) -> int:
        return self.local_blocks + self.fetched_blocks


NO_PREFIX = PrefixPlan()


def usable_blocks(num_prompt_tokens: int, num_hashes: int, block_size: int) -> int:
    """Leading full blocks a prefix can cover: one prompt token is always computed."""
    return min(num_hashes, (num_prompt_tokens - 1) // block_size)


def plan_prefix(
    usable: int, local: int, pool_blocks: int, peer: str = "", peer_blocks: int = 0
) -> PrefixPlan:
    """The plan, given `local` blocks cached here, a run of `pool_blocks` more that the
    pool holds right after them, and the placement's `peer` said to hold `peer_blocks`
    (counted from the first block). The peer wins only when it holds more; a plan that
    fetches nothing keeps the local blocks."""
    source, upto = KVSTORE, local + pool_blocks
    peer_blocks = min(peer_blocks, usable)
    if peer and peer_blocks > upto:
        source, upto = peer, peer_blocks
    if upto <= local:
        return PrefixPlan(local)
    return PrefixPlan(local, upto - local, source)


def after_reserve(plan: PrefixPlan, num_local: int) -> PrefixPlan:
    """The plan once blocks were reserved: the cache may hold another number of leading
    blocks by then; the fetch fills the rest up to the planned end."""
    return PrefixPlan(num_local, plan.blocks - num_local, plan.source)


def after_fetch(plan: PrefixPlan, started: bool) -> PrefixPlan:
    """A fetch that did not start brings nothing (a peer lacking any block sends none:
    all or nothing): the fetched part is computed instead."""
    return plan if started else PrefixPlan(plan.local_blocks)


def source_kind(source: str) -> str:
    """What a load counts as in the worker's stats: "kvstore" or "peer"."""
    return KVSTORE if source == KVSTORE else "peer"


def load_failure(error: str, layer: int) -> str:
    """Why a request is invalidated when a layer of its fetched prefix did not land intact
    before that layer computes: its KV cannot be trusted, and the step ends it with an error
    worth retrying elsewhere. Its later layers are not waited for."""
    return f"{PREFIX_LOAD_FAILED}: {error or f'layer {layer} did not arrive in time'}"
