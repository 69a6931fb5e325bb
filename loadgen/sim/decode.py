"""Decode nodes: continuous batching over a KV pool of fixed size, advanced step by step.

A step takes cost.decode_step_time(batch, total context) and gives every running request
one token; requests whose KV arrived join at the next step, in arrival order, while the
pool has room for their whole KV (prompt and output: the simulator knows the output length
and so never preempts). A request decodes on every step from joining to finishing, so its
token times are a slice of its node's step end times: a step costs O(1) plus the requests
that finish in it, whatever the batch size.

Nodes advance lazily: `advance(t)` runs the steps that end by t. The simulator advances
every node to the time of each event before handling it.

A node keeps the prompt blocks of the requests it decoded in an LRU cache of its KV pool's
size; as a live decode worker does (`LLMEngine.reserve_reusing`), a request reserved on it
takes the leading blocks the cache holds (never the last token's block), then gets the
next ones the pool holds itself (services/decode/pool_prefix.py); neither is streamed to
it.
"""

from __future__ import annotations

import heapq
from collections import deque

from loadgen.sim.cache import BlockCache, BlockPool
from loadgen.sim.job import Job
from loadgen.sim.prefill import BLOCK_SIZE, full_blocks
from shared.costmodel import CostModel
from shared.decode.admission import reusable_blocks
from shared.decode.commit import current_tbt
from shared.engine.stats import EngineStats
from shared.engine.step_time import smoothed
from shared.messages import Heartbeat
from shared.worker.core import load_heartbeat


class Batch:
    """The requests decoding on one node, their KV and the node's step end times."""

    def __init__(self, cost: CostModel, capacity_tokens: int) -> None:
        self.cost = cost
        self.capacity = capacity_tokens
        self.size = 0
        self.context = 0  # KV tokens of the running requests (the step's cost)
        self.reserved = 0  # KV tokens they (and reserved joiners) will hold
        self.step_ends: list[float] = []
        self._finishing: list[tuple[int, int, Job]] = []  # (last step, index, job)

    def fits(self, job: Job) -> bool:
        """Room for the job's whole KV; one larger than the pool runs alone."""
        return self.reserved + job.final_tokens <= self.capacity or not self.reserved

    def reserve(self, job: Job) -> None:
        self.reserved += job.final_tokens

    def join(self, job: Job) -> None:
        """A reserved job with its first token takes part from the next step on."""
        job.join_step = len(self.step_ends)
        last = job.join_step + job.num_output_tokens - 2  # tokens 2..n come from steps
        heapq.heappush(self._finishing, (last, job.index, job))
        self.size += 1
        self.context += job.num_prompt_tokens + 1

    def step_seconds(self) -> float:
        return self.cost.decode_step_time(self.size, self.context)

    def complete_step(self, end: float) -> list[Job]:
        """A step ended at `end`: every running job has one more token; the done leave."""
        step = len(self.step_ends)
        self.step_ends.append(end)
        self.context += self.size
        done = []
        while self._finishing and self._finishing[0][0] == step:
            job = heapq.heappop(self._finishing)[2]
            job.token_ends = self.step_ends[job.join_step :]
            self.size -= 1
            self.context -= job.final_tokens
            self.reserved -= job.final_tokens
            done.append(job)
        return done

    def load(self, block_size: int, num_waiting: int = 0, queued_tokens: int = 0) -> EngineStats:
        """The batch's load as a decode worker reports it, in blocks of `block_size`."""
        return EngineStats(
            num_running=self.size,
            num_waiting=num_waiting,
            queued_tokens=queued_tokens,
            context_tokens=self.context,
            free_blocks=max(0, self.capacity - self.reserved) // block_size,
            total_blocks=self.capacity // block_size,
        )

    @property
    def usage(self) -> float:
        return min(1.0, self.reserved / self.capacity) if self.capacity else 1.0


class DecodeNode:
    def __init__(self, worker_id: str, cost: CostModel, capacity_tokens: int) -> None:
        self.worker_id = worker_id
        self.batch = Batch(cost, capacity_tokens)
        self.waiting: deque[Job] = deque()  # KV arrived, no room yet
        self.step_start = 0.0  # of the step that ends at step_end
        self.step_end: float | None = None  # None: idle
        self.mean_step_seconds = 0.0
        self.done: list[Job] = []  # finished since the simulator last looked
        self.cache = BlockCache(capacity_tokens // BLOCK_SIZE)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.batch.size or self.waiting)

    @property
    def tbt(self) -> float:
        """The TBT this node gives now (what the live decode worker checks)."""
        return current_tbt(self.mean_step_seconds, self.has_unfinished)

    def advance(self, t: float) -> None:
        while self.step_end is not None and self.step_end <= t:
            end = self.step_end
            self.mean_step_seconds = smoothed(self.mean_step_seconds, end - self.step_start)
            finished = self.batch.complete_step(end)
            for job in finished:  # its prompt's full blocks stay in this node's cache
                self.cache.touch(full_blocks(job))
            self.done += finished
            self._start_step(end)

    def hold(self, job: Job, pool: BlockPool | None, now: float) -> None:
        """The job's reservation here: the leading blocks this node's cache holds, short of
        the block of its last token, are `job.held_blocks`; the next ones the pool holds
        (if there is one), which this node gets itself from `now`, `job.pool_blocks`."""
        reusable = reusable_blocks(job.num_prompt_tokens, BLOCK_SIZE, offloaded=False)
        reusable = min(len(job.row.hash_ids), reusable)
        job.held_blocks = self.cache.leading(job.row.hash_ids, reusable)
        self.cache.touch(job.row.hash_ids[: job.held_blocks])
        if pool is not None:
            job.pool_blocks = pool.leading(job.row.hash_ids, job.held_blocks, reusable)
        job.reserved_at = now

    def arrive(self, job: Job, now: float) -> None:
        """The job's KV landed at `now` (the node was advanced to it)."""
        self.waiting.append(job)
        if self.step_end is None:
            self._start_step(now)

    def _start_step(self, now: float) -> None:
        batch = self.batch
        while self.waiting and batch.fits(self.waiting[0]):
            job = self.waiting.popleft()
            batch.reserve(job)
            batch.join(job)
        if not batch.size:
            self.step_end = None
            return
        self.step_start, self.step_end = now, now + batch.step_seconds()

    def heartbeat(self, now: float, interval: float, block_size: int) -> Heartbeat:
        """What a live decode worker reports (shared/worker/config.py: worker_heartbeat)."""
        waiting = len(self.waiting)
        load = self.batch.load(block_size, num_waiting=waiting, queued_tokens=waiting)
        return load_heartbeat("decode", self.worker_id, now, interval, block_size, load)
