"""The event loop: trace arrivals, the conductor's placements, prefills, KV landing on
decode nodes, heartbeats, KV events and load samples, in virtual time.

Every request goes through `Conductor.place` (shared/conductor/core.py), the same code
the live conductor runs, which hears of the cluster only through heartbeats (sampled every
heartbeat interval, phases spread over it as live workers' are, and from a prefill node
when a prefill ends, as a live one beats then), KV events (every cache's
changes, flushed every event interval) and RequestDone of finished requests; between
beats it books its own placements as it does live. Before each event, every decode (and
colocated) node is advanced to the event's time.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loadgen.sim.cluster import Cluster
from loadgen.sim.config import SimConfig
from loadgen.sim.job import Job
from loadgen.sim.prefill import (
    PrefillNode,
    full_blocks,
    job_prefix_plan,
    local_plan,
)
from loadgen.sim.series import Counts, LoadSeries
from loadgen.trace import TraceRow
from shared.conductor.core import Conductor, Counters
from shared.costmodel import CostModel
from shared.decode.commit import CommitVerdict, commit_verdict
from shared.messages import PlacementRequest, RequestDone
from shared.prefill.outcome import finish_at_first_token
from shared.prefill.prefix import PrefixPlan

# Order of events at the same virtual time: reports before decisions, decisions before
# the load sample.
HEARTBEAT, KV_EVENTS, PREFILLED, KV_LANDED, DISPATCH, ARRIVAL, SAMPLE = range(7)


@dataclass
class SimRun:
    jobs: list[Job]
    series: dict[str, list[float]]
    conductor: Counters
    end: float  # virtual seconds: the last request done
    wall_seconds: float


class Simulation:
    def __init__(
        self,
        rows: Sequence[TraceRow],
        config: SimConfig,
        cost: CostModel,
        progress: Callable[[str], None] | None = None,
        progress_every: float = 60.0,
    ) -> None:
        self.config, self.cost = config, cost
        self.cluster = Cluster(config, cost)
        self.conductor = Conductor(config.scheduling, cost)
        self.jobs = [
            Job(i, f"s{config.seed}-r{i}", row, row.timestamp) for i, row in enumerate(rows)
        ]
        self.series = LoadSeries(config.scheduling.slo_ttft, config.scheduling.slo_tbt)
        self.counts = Counts()
        self.open = 0  # placed and not yet done
        self.now = 0.0
        self.progress, self.progress_every = progress, progress_every
        self._next_progress = progress_every
        self._events: list[tuple[float, int, int, Callable[[Any], None], Any]] = []
        self._seq = itertools.count()

    def run(self) -> SimRun:
        started = time.perf_counter()
        self._schedule_start()
        while self._events:
            t, _, _, handler, arg = heapq.heappop(self._events)
            self.now = t
            self.cluster.advance(t)
            self._collect_done()
            handler(arg)
        self.cluster.advance(math.inf)
        self._collect_done()
        end = max((j.last_token or j.arrival for j in self.jobs), default=0.0)
        return SimRun(
            self.jobs,
            self.series.columns,
            self.conductor.counters,
            end,
            time.perf_counter() - started,
        )

    # -- scheduling ---------------------------------------------------------------------

    def _at(self, t: float, kind: int, handler: Callable[[Any], None], arg: Any = None) -> None:
        heapq.heappush(self._events, (t, kind, next(self._seq), handler, arg))

    def _schedule_start(self) -> None:
        """Every node beats at 0 (the conductor knows the cluster before the first
        request), then every interval at its own phase; arrivals at their trace times."""
        names, interval = self.cluster.names, self.config.heartbeat_interval
        for k, name in enumerate(names):
            self._beat(name)
            phase = interval * k / len(names)
            self._at(phase + interval, HEARTBEAT, self._heartbeat, name)
        for job in self.jobs:
            self._at(job.arrival, ARRIVAL, self._arrive, job)
        self._at(0.0, KV_EVENTS, self._flush_kv_events)
        self._at(0.0, SAMPLE, self._sample)

    @property
    def _finished(self) -> bool:
        return self.counts.arrived == len(self.jobs) and not self.open

    def _again(
        self, delay: float, kind: int, handler: Callable[[Any], None], arg: Any = None
    ) -> None:
        """Periodic events stop once every request is done."""
        if not self._finished:
            self._at(self.now + delay, kind, handler, arg)

    # -- reports to the conductor ----------------------------------------------------------

    def _heartbeat(self, name: str) -> None:
        self._beat(name)
        self._again(self.config.heartbeat_interval, HEARTBEAT, self._heartbeat, name)

    def _beat(self, name: str) -> None:
        for hb in self.cluster.heartbeats(name, self.now):
            self.conductor.observe(hb)

    def _flush_kv_events(self, _: None) -> None:
        for event in self.cluster.kv_events():
            self.conductor.apply(event)
        self._again(self.config.event_interval, KV_EVENTS, self._flush_kv_events)

    def _sample(self, _: None) -> None:
        self.series.sample(self.now, self.cluster, self.counts)
        self._report_progress()
        self._again(self.config.sample_interval, SAMPLE, self._sample)

    # -- a request's way ---------------------------------------------------------------------

    def _arrive(self, job: Job) -> None:
        self.counts.arrived += 1
        request = PlacementRequest(
            job.request_id, job.num_prompt_tokens, job.num_output_tokens, 0.0, full_blocks(job)
        )
        placement = job.placement = self.conductor.place(request, self.now)
        if not placement.accepted:
            job.status, job.error = 503, placement.reason
            self.counts.rejected += 1
            return
        self.open += 1
        job.prefill_id = placement.prefill_id
        # a colocated node decodes what it prefilled (the conductor's decode pick is unused)
        job.decode_id = placement.prefill_id if self.config.colocated else placement.decode_id
        overhead = getattr(self.cost, "request_overhead", 0.0)
        if overhead > 0:
            self._at(self.now + overhead, DISPATCH, self._dispatch, job)
        else:
            self._dispatch(job)

    def _dispatch(self, job: Job) -> None:
        """The job reaches its prefill (or colocated) node."""
        if self.config.colocated:
            self.cluster.colocated[job.prefill_id].arrive(job, self.now)
            return
        # the prefill worker reserves first
        self.cluster.decode[job.decode_id].hold(job, self.cluster.pool, self.now)
        node = self.cluster.prefill[job.prefill_id]
        node.enqueue(job, self._plan(node, job))  # what its load report expects
        if node.current is None:
            self._start_prefill(node)

    def _plan(self, node: PrefillNode, job: Job) -> PrefixPlan:
        """The job's prefix plan from what `node`'s cache, the pool and the peers hold now.
        Made on arrival for the load `node` reports, and again when the prefill starts,
        which is when a live worker binds it (it plans and starts the fetch when its
        engine can take the prompt): blocks that arrived while the job queued are used."""
        if not self.config.remote_prefix:
            return local_plan(job, node.cache)
        return job_prefix_plan(job, node.cache, self.cluster.pool, self.cluster.caches, node.cost)

    def _start_prefill(self, node: PrefillNode) -> None:
        node.start_next(self.now, self._plan(node, node.queue[0]))
        self._at(node.busy_until, PREFILLED, self._prefilled, node)

    def _prefilled(self, node: PrefillNode) -> None:
        job = node.finish()
        self._at(node.kv_landed(job), KV_LANDED, self._kv_landed, job)
        if node.queue:
            self._start_prefill(node)
        self._beat(node.worker_id)  # as a live worker does when a prefill ends

    def _kv_landed(self, job: Job) -> None:
        """The KV is on the decode node: it commits, and the first token goes out."""
        decode = self.cluster.decode[job.decode_id]
        # a trace names no stop tokens; a one-token answer ends at prefill, unchecked
        ends_here = finish_at_first_token(False, job.num_output_tokens)
        if ends_here is None:
            slo = job.placement.stage_tbt_slo if job.placement else 0.0
            verdict = commit_verdict("", decode.tbt, slo)  # the KV landed intact
            if not verdict.adopt:
                return self._rejected(job, verdict)
        job.first_token = self.now
        if ends_here is None:
            decode.arrive(job, self.now)
        else:
            self._done(job)

    def _rejected(self, job: Job, verdict: CommitVerdict) -> None:
        """The decode node refused the job after its prefill (the baseline's TBT check)."""
        ack = verdict.ack(job.request_id)
        job.status, job.error, job.wasted = ack.code, ack.error, verdict.wasted
        self.counts.wasted += 1
        self.open -= 1

    def _collect_done(self) -> None:
        for job in self.cluster.take_done():
            self._done(job)

    def _done(self, job: Job) -> None:
        """A request ended well: the gateway tells the conductor what it took."""
        self.open -= 1
        self.counts.finished += 1
        first_token = job.first_token
        assert first_token is not None, "done before its first token"
        first = job.row.hash_ids[0] if full_blocks(job) else 0
        placement = job.placement
        assert placement is not None, "done without a placement"
        self.conductor.finished(
            RequestDone(
                job.request_id,
                first,
                job.num_prompt_tokens,
                job.num_output_tokens,
                first_token - job.arrival,
                job.mean_gap,
                placement.predicted_ttft,
                placement.predicted_tbt,
                placement.predicted_queue,
                placement.predicted_prefill,
                placement.predicted_overhead,
                job.prefill_start - job.arrival,
                job.compute_seconds,
            )
        )

    def _report_progress(self) -> None:
        if self.progress is None or (self.now < self._next_progress and not self._finished):
            return
        self._next_progress = self.now + self.progress_every
        c = self.counts
        self.progress(
            f"t={self.now:,.0f}s: {c.arrived}/{len(self.jobs)} arrived, "
            f"{c.finished} done, {self.open} in flight, {c.rejected} rejected, "
            f"{c.wasted} wasted prefills"
        )
