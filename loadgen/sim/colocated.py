"""Colocated nodes: prefill and decode on one engine with a local prefix cache only (no
pool, no transfers), scheduled as vLLM v0 does without chunked prefill: before each step,
the oldest waiting prompt is prefilled if its KV fits, and the running batch waits for it;
otherwise the batch decodes a step. Each prefill therefore stalls every running request:
its gap between two tokens includes the whole prefill.
"""

from __future__ import annotations

from loadgen.sim.cache import BlockCache
from loadgen.sim.decode import Batch
from loadgen.sim.job import Job
from loadgen.sim.prefill import (
    BLOCK_SIZE,
    PromptQueue,
    expected_prefill,
    full_blocks,
    local_plan,
    prefill_heartbeat,
    prefill_seconds,
)
from shared.costmodel import CostModel
from shared.engine.step_time import smoothed
from shared.messages import Heartbeat
from shared.prefill.outcome import finish_at_first_token
from shared.worker.core import load_heartbeat


class ColocatedNode:
    waiting = ()  # no request waits with its KV computed: prompts wait in `queue`

    def __init__(
        self, worker_id: str, cost: CostModel, capacity_tokens: int, cache: BlockCache
    ) -> None:
        self.worker_id = worker_id
        self.cost = cost
        self.cache = cache
        self.batch = Batch(cost, capacity_tokens)
        self.queue = PromptQueue()
        self.prefilling: Job | None = None
        self.step_start = 0.0  # of the step that ends at step_end
        self.step_end: float | None = None  # None: idle
        self.last_decode_end: float | None = None
        self.mean_gap_seconds = 0.0  # between a running request's tokens
        self.done: list[Job] = []

    @property
    def tbt(self) -> float:
        return self.mean_gap_seconds if self.batch.size else 0.0

    def arrive(self, job: Job, now: float) -> None:
        """`job` is placed here at `now` (the node was advanced to it)."""
        self.queue.push(job, *expected_prefill(self.cost, job, local_plan(job, self.cache)))
        if self.step_end is None:
            self._start_step(now)

    def advance(self, t: float) -> None:
        while self.step_end is not None and self.step_end <= t:
            end = self.step_end
            if self.prefilling is not None:
                self._prefilled(end)
            else:
                self._decoded(end)
            self._start_step(end)

    def _start_step(self, now: float) -> None:
        self.step_start = now
        if self.queue and self.batch.fits(self.queue[0]):
            job = self.queue.pop()
            self.batch.reserve(job)
            job.plan, job.prefill_start = local_plan(job, self.cache), now
            job.fetch_seconds, job.compute_seconds = prefill_seconds(self.cost, job, job.plan)
            self.prefilling, self.step_end = job, now + job.compute_seconds
        elif self.batch.size:
            self.step_end = now + self.batch.step_seconds()
        else:
            self.step_end = None

    def _prefilled(self, end: float) -> None:
        job, self.prefilling = self.prefilling, None
        assert job is not None, "a prefill step with no prefill"
        job.first_token = end
        self.cache.touch(full_blocks(job))
        if finish_at_first_token(False, job.num_output_tokens) is None:  # no stop tokens here
            self.batch.join(job)
            if self.last_decode_end is None:  # the batch starts: its first gap
                self.last_decode_end = end  # counts from this first token
        else:
            self.batch.reserved -= job.final_tokens
            self.done.append(job)

    def _decoded(self, end: float) -> None:
        last = self.last_decode_end
        assert last is not None, "a decode step before any request joined"
        gap = end - last
        self.mean_gap_seconds = smoothed(self.mean_gap_seconds, gap)
        self.done += self.batch.complete_step(end)
        self.last_decode_end = end if self.batch.size else None

    def queue_seconds(self, now: float) -> float:
        """Seconds of prefill queued here: the current one's rest and the waiting ones'."""
        return self.queue.seconds_from(now, self.step_end if self.prefilling else None)

    def heartbeats(self, now: float, interval: float) -> tuple[Heartbeat, Heartbeat]:
        """The node as the conductor's prefill worker and decode worker."""
        prefill = prefill_heartbeat(
            self.worker_id, now, interval, self.prefilling, self.queue, self.cache
        )
        load = self.batch.load(BLOCK_SIZE)
        decode = load_heartbeat(
            "decode", decode_id(self.worker_id), now, interval, BLOCK_SIZE, load
        )
        return prefill, decode


def decode_id(worker_id: str) -> str:
    """The id a colocated node's decode side goes by at the conductor."""
    return f"{worker_id}/decode"
