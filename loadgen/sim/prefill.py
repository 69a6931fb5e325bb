"""Prefill nodes of the disaggregated cluster: a FIFO queue, one prompt at a time.

A node binds a request's prefix when its prefill starts, as a live prefill worker does
(services/prefill/admission.py), with the worker's rules (shared/prefill/prefix.py): its
own cache first; then, unless the placement says to recompute, the longest run the pool
holds beyond it, or the peer the placement names when that one holds more (all or
nothing). So a queued request uses the blocks its predecessors added to the node's cache
or the pool while it waited. It is busy while it fetches the remote blocks (the cost
model's transfer time) and then computes the rest (the cost model's prefill time), as the
conductor predicts. Its KV streams to the decode node layer by layer while it computes, so
the KV has landed when both the compute and the transfer of the prompt's KV are done (the
last layer's share of the transfer is not added); the blocks the decode node held already
are not streamed, nor those it got from the pool itself (from its reservation on: the KV
has landed when that get is over too). The prompt's full blocks, computed or fetched, then
enter the node's cache.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from loadgen.sim.cache import BlockCache, BlockPool
from loadgen.sim.job import Job
from loadgen.trace import TRACE_BLOCK_SIZE
from shared.conductor import estimate
from shared.costmodel import CostModel
from shared.engine.stats import EngineStats, tokens_to_compute
from shared.messages import Heartbeat
from shared.prefill.load import tokens_left
from shared.prefill.prefix import KVSTORE, PrefixPlan, after_fetch, plan_prefix, usable_blocks
from shared.prefill.worth import worth_loading
from shared.worker.core import load_heartbeat

BLOCK_SIZE = TRACE_BLOCK_SIZE


def job_usable_blocks(job: Job) -> int:
    return usable_blocks(job.num_prompt_tokens, len(job.row.hash_ids), BLOCK_SIZE)


def full_blocks(job: Job) -> tuple[int, ...]:
    """The prompt's full blocks: what a cache names (a partial last block is not hashed)."""
    return job.row.hash_ids[: job.num_prompt_tokens // BLOCK_SIZE]


def local_plan(job: Job, cache: BlockCache) -> PrefixPlan:
    return PrefixPlan(cache.leading(job.row.hash_ids, job_usable_blocks(job)))


def job_prefix_plan(
    job: Job,
    cache: BlockCache,
    pool: BlockPool | None,
    peers: Mapping[str, BlockCache],
    cost: CostModel | None = None,
) -> PrefixPlan:
    """Where the job's prefix comes from, as PrefixLoader.prepare decides it; the fetch is
    simulated: the pool sends the run it holds, a peer sends all or nothing. With `cost`,
    a fetch is made only where the cost model says loading beats computing, as a live
    worker decides by its measured rates (shared/prefill/worth.py)."""
    local = local_plan(job, cache)
    placement = job.placement
    if placement is None or not placement.load_prefix:
        return local
    hashes, usable, have = job.row.hash_ids, job_usable_blocks(job), local.local_blocks
    pool_blocks = pool.leading(hashes, have, usable) if pool else 0
    plan = plan_prefix(
        usable, have, pool_blocks, placement.prefix_peer, placement.prefix_peer_blocks
    )
    if cost is not None and plan.fetched_blocks and not _worth_loading(cost, job, plan):
        return local
    return after_fetch(plan, _fetch_starts(plan, hashes, peers))


def _worth_loading(cost: CostModel, job: Job, plan: PrefixPlan) -> bool:
    # NOTE: against the fetched blocks' compute only, not the whole rest as live: a node
    # here fetches, then computes (no overlap), so the rest costs the same either way
    load = estimate.transfer_time(cost, plan.fetched_blocks, BLOCK_SIZE)
    n = job.num_prompt_tokens
    computing = estimate.prefill_time(cost, n, plan.local_blocks * BLOCK_SIZE)
    compute = computing - estimate.prefill_time(cost, n, plan.blocks * BLOCK_SIZE)
    return worth_loading(load, compute)


def _fetch_starts(plan: PrefixPlan, hashes: Sequence[int], peers: Mapping[str, BlockCache]) -> bool:
    """Whether the plan's fetch would start: a peer lacking any of the blocks sends none."""
    if not plan.fetched_blocks or plan.source == KVSTORE:
        return True
    peer = peers.get(plan.source)
    return peer is not None and peer.holds_all(hashes[plan.local_blocks : plan.blocks])


def prefill_seconds(cost: CostModel, job: Job, plan: PrefixPlan) -> tuple[float, float]:
    """(fetch, compute) seconds of the job's prefill with `plan`."""
    return (
        estimate.transfer_time(cost, plan.fetched_blocks, BLOCK_SIZE),
        estimate.prefill_time(cost, job.num_prompt_tokens, plan.blocks * BLOCK_SIZE),
    )


def expected_prefill(cost: CostModel, job: Job, plan: PrefixPlan) -> tuple[float, int]:
    """(seconds, tokens to compute) of the job's prefill with `plan`."""
    to_compute = tokens_to_compute(job.num_prompt_tokens, plan.blocks * BLOCK_SIZE)
    return sum(prefill_seconds(cost, job, plan)), to_compute


class PromptQueue:
    """Prompts waiting for their prefill, in order, with the totals heartbeats report."""

    def __init__(self) -> None:
        self.jobs: deque[Job] = deque()
        self.num_tokens = 0  # the waiting jobs' tokens to compute, as expected
        self.seconds = 0.0  # the waiting jobs' expected prefill seconds

    def __len__(self) -> int:
        return len(self.jobs)

    def __getitem__(self, index: int) -> Job:
        return self.jobs[index]

    def push(self, job: Job, expected_seconds: float, expected_tokens: int) -> None:
        job.expected_seconds, job.expected_tokens = expected_seconds, expected_tokens
        self.jobs.append(job)
        self.num_tokens += expected_tokens
        self.seconds += expected_seconds

    def pop(self) -> Job:
        job = self.jobs.popleft()
        self.num_tokens -= job.expected_tokens
        self.seconds -= job.expected_seconds
        return job

    def seconds_from(self, now: float, current_end: float | None) -> float:
        """Seconds of prefill queued: the current one's rest (ending at `current_end`,
        None when none runs) and the waiting ones'."""
        left = max(0.0, current_end - now) if current_end is not None else 0.0
        return left + max(0.0, self.seconds)


def prefill_heartbeat(
    worker_id: str,
    now: float,
    interval: float,
    current: Job | None,
    queue: PromptQueue,
    cache: BlockCache,
) -> Heartbeat:
    """What a live prefill worker reports (shared/prefill/load.py): the tokens it has left
    to compute, of the prefill in progress and of the waiting ones."""
    left = 0
    if current is not None:
        to_compute = tokens_to_compute(current.num_prompt_tokens, current.prefix_tokens)
        computing = current.prefill_start + current.fetch_seconds
        left = tokens_left(to_compute, computing, current.compute_seconds, now)
    load = EngineStats(
        num_running=int(current is not None),
        num_waiting=len(queue),
        queued_tokens=left + queue.num_tokens,
        free_blocks=max(0, cache.capacity - len(cache)),
        total_blocks=cache.capacity,
    )
    return load_heartbeat("prefill", worker_id, now, interval, BLOCK_SIZE, load)


class PrefillNode:
    def __init__(self, worker_id: str, cost: CostModel, cache: BlockCache) -> None:
        self.worker_id = worker_id
        self.cost = cost
        self.cache = cache
        self.queue = PromptQueue()
        self.current: Job | None = None
        self.busy_until = 0.0

    def enqueue(self, job: Job, plan: PrefixPlan) -> None:
        """Queue `job`, whose prefix should come as `plan` says (for load reports; its real
        plan is made when it starts)."""
        self.queue.push(job, *expected_prefill(self.cost, job, plan))

    def start_next(self, now: float, plan: PrefixPlan) -> Job:
        """Start the head of the queue with its prefix `plan`; it ends at busy_until."""
        job = self.queue.pop()
        job.plan, job.prefill_start = plan, now
        job.fetch_seconds, job.compute_seconds = prefill_seconds(self.cost, job, plan)
        self.current, self.busy_until = job, now + job.busy_seconds
        return job

    def finish(self) -> Job:
        job, self.current = self.current, None
        assert job is not None, "finish() with no prefill running"
        self.cache.touch(full_blocks(job))
        return job

    def kv_landed(self, job: Job) -> float:
        """When the job's KV is all on its decode node (streamed while computing)."""
        per_token, transfer = self.cost.kv_bytes_per_token, self.cost.transfer_time
        decode_has = (job.held_blocks + job.pool_blocks) * BLOCK_SIZE
        stream = transfer((job.num_prompt_tokens - decode_has) * per_token)
        streamed = job.prefill_start + job.fetch_seconds + max(job.compute_seconds, stream)
        if not job.pool_blocks:
            return streamed
        return max(streamed, job.reserved_at + transfer(job.pool_blocks * BLOCK_SIZE * per_token))

    def queue_seconds(self, now: float) -> float:
        """Seconds of prefill queued here: the current one's rest and the waiting ones'."""
        return self.queue.seconds_from(now, self.busy_until if self.current else None)

    def heartbeat(self, now: float, interval: float) -> Heartbeat:
        return prefill_heartbeat(
            self.worker_id, now, interval, self.current, self.queue, self.cache
        )
