"""The conductor without I/O: cluster state, prefix index, bookkeeping, policy and
admission. The service feeds it messages; the benchmark and the simulator call it directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.conductor import admission
from shared.conductor.accuracy import EstimateLog, done_pairs
from shared.conductor.config import SchedulingConfig
from shared.conductor.forecast import Booking, Ledger
from shared.conductor.index import PrefixIndex
from shared.conductor.inflight import InflightPrefixes
from shared.conductor.outputs import OutputLengths
from shared.conductor.overhead import PathOverhead
from shared.conductor.policies import POLICIES, Choice, Inputs, Rejection, request_seed
from shared.conductor.snapshot import PrefixMatch
from shared.conductor.state import ClusterState
from shared.costmodel import CostModel
from shared.messages import Heartbeat, KVEvent, Placement, PlacementRequest, RequestDone


@dataclass
class Counters:
    accepted: int = 0
    rejected: int = 0  # by admission (overload)
    unplaceable: int = 0  # no worker could take it
    replications: int = 0  # placements that pull a remote prefix into the worker
    replicated_blocks: int = 0
    impostor_beats: int = 0  # beats under a live worker's id from another process


HOLD_BEATS = 1.5  # a worker beating within this many intervals holds its id


def _beating(holder: Heartbeat, now: float) -> bool:
    """Whether the process that holds a worker id still beats (a restart after a crash
    comes later than this; a second process claiming a live id is refused)."""
    return not holder.stopped and now - holder.time < HOLD_BEATS * holder.interval


def _waits_for_own_cache(choice: Choice, prefix: PrefixMatch) -> bool:
    """Whether the choice counts on blocks still on their way into its worker's cache
    (inflight.py) and fetches nothing: the worker must not load a shorter prefix from
    elsewhere when the request arrives, since its own cache will hold the longer one when
    the request runs (it checks its cache then)."""
    worker_id = choice.prefill_id
    arriving = prefix.local(worker_id) > prefix.sender_blocks().get(worker_id, 0)
    return arriving and not choice.fetch_from


@dataclass
class WaitingEvents:
    """KV events of sources not registered yet, bounded: a snapshot replaces what waited
    before it; past the bounds the oldest go (the next resync repairs the index)."""

    max_sources: int = 64
    max_events: int = 64
    by_source: dict[str, list[KVEvent]] = field(default_factory=dict)

    def keep(self, event: KVEvent) -> None:
        earlier = self.by_source.pop(event.source, [])  # re-inserted last: the newest
        events = [event] if event.snapshot else [*earlier, event]
        self.by_source[event.source] = events[-self.max_events :]
        while len(self.by_source) > self.max_sources:
            del self.by_source[next(iter(self.by_source))]

    def take(self, source: str) -> list[KVEvent]:
        return self.by_source.pop(source, [])


@dataclass
class Conductor:
    config: SchedulingConfig
    cost: CostModel
    state: ClusterState = field(default_factory=ClusterState)
    index: PrefixIndex = field(default_factory=PrefixIndex)
    ledger: Ledger = field(default_factory=Ledger)
    inflight: InflightPrefixes = field(default_factory=InflightPrefixes)
    outputs: OutputLengths = field(init=False)
    counters: Counters = field(default_factory=Counters)
    unregistered: WaitingEvents = field(default_factory=lambda: WaitingEvents())
    # placements the policy made, admitted or not (round-robin's turn: Inputs.turn)
    turns: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.outputs = OutputLengths(self.config.decode_time)
        self.policy = POLICIES[self.config.policy]
        self.estimates = EstimateLog()
        self.overhead = PathOverhead()

    def observe(self, hb: Heartbeat) -> None:
        """`hb` as heard: its `time` is when it arrived (shared/runtime/heartbeats.py)."""
        if hb.service not in ("prefill", "decode", "kvstore"):
            return
        old = self.state.heartbeats.get(hb.worker_id)
        if old is not None and old.instance != hb.instance and _beating(old, hb.time):
            self.counters.impostor_beats += 1  # the id is taken by a process that lives
            return
        if hb.stopped or (old is not None and old.instance != hb.instance):
            self.forget(hb.worker_id)  # it left, or restarted with empty caches
        if not hb.stopped:
            self.state.observe(hb)
            self._apply_waiting(hb.worker_id)

    def apply(self, event: KVEvent) -> None:
        """KV events count only from registered workers (a beat came first); those that
        arrive just before their source's first beat wait for it."""
        if event.service not in ("prefill", "kvstore"):
            return
        if event.source not in self.state.heartbeats:
            self.unregistered.keep(event)
            return
        if event.snapshot:  # everything the source holds: what we knew of it is stale
            self.index.forget(event.source)
        self.index.apply(event)

    def _apply_waiting(self, worker_id: str) -> None:
        for event in self.unregistered.take(worker_id):
            self.apply(event)

    def finished(self, done: RequestDone) -> None:
        self.outputs.observe(done)
        self.overhead.observe(done)
        for name, predicted, actual in done_pairs(done):
            self.estimates.observe(name, predicted, actual)

    def forget_dead(self, now: float) -> list[str]:
        dead = self.state.forget_dead(now)
        for worker_id in dead:
            self.index.forget(worker_id)
            self.ledger.forget(worker_id)
            self.inflight.forget(worker_id)
        return dead

    def forget(self, worker_id: str) -> None:
        self.state.forget(worker_id)
        self.index.forget(worker_id)
        self.ledger.forget(worker_id)
        self.inflight.forget(worker_id)

    def place(self, request: PlacementRequest, now: float) -> Placement:
        self.forget_dead(now)
        self.ledger.prune(now)
        snapshot = self.state.snapshot(now)
        prefix = self.index.match(request.block_hashes, snapshot.prefill_view().ids)
        prefix = self.inflight.extend(prefix, request.block_hashes, now)
        inputs = Inputs(
            snapshot, request, prefix, self.config, self.cost, self.turns, request_seed(request)
        )
        choice = self.policy(inputs)
        if isinstance(choice, Rejection):
            self.counters.unplaceable += 1
            return Placement(
                request.request_id, False, reason=choice.reason, retry_after=choice.retry_after
            )
        self.turns += 1
        reason = admission.verdict(inputs, choice, self.ledger, self.outputs)
        if reason:
            self.counters.rejected += 1
            return Placement(
                request.request_id, False, reason=reason, retry_after=self.config.retry_after
            )
        self._book(inputs, choice)
        return self._placement(request, choice, inputs.prefix)

    def _book(self, inputs: Inputs, choice: Choice) -> None:
        """Count the request against its workers until their next heartbeats report it."""
        n, now = inputs.request.num_prompt_tokens, inputs.snapshot.time
        self.state.assign(
            choice.prefill_id,
            n - choice.prefix_tokens,
            choice.busy_seconds,
            until=now + choice.ttft,
        )
        # the decode worker reports the request once its KV lands (its first token)
        self.state.assign(choice.decode_id, n + 1, reported_from=now + choice.ttft)
        if admission.forecasts(self.config):
            duration = admission.decode_duration(inputs, choice, self.outputs)
            self.ledger.book(
                choice.decode_id, Booking(now + choice.ttft, now + choice.ttft + duration, n)
            )
        if self._caches_prefixes(choice.prefill_id):
            # a worker without a prefix cache will not hold the prompt after its prefill
            self.inflight.placed(choice.prefill_id, inputs.request.block_hashes, now + choice.ttft)
        self.counters.accepted += 1
        if choice.fetch_blocks:
            self.counters.replications += 1
            self.counters.replicated_blocks += choice.fetch_blocks

    def _caches_prefixes(self, worker_id: str) -> bool:
        beat = self.state.heartbeats.get(worker_id)
        return beat is None or beat.caches_prefixes

    def _placement(
        self, request: PlacementRequest, choice: Choice, prefix: PrefixMatch
    ) -> Placement:
        peer = choice.fetch_from if choice.fetch_from not in ("", "kvstore") else ""
        overhead = self.overhead.seconds
        load_prefix = choice.load_prefix and not _waits_for_own_cache(choice, prefix)
        stage_tbt = (
            admission.slo_of(request, self.config).tbt
            if self.config.admission == "baseline"
            else 0.0
        )
        return Placement(
            request.request_id,
            True,
            choice.prefill_id,
            choice.decode_id,
            prefix_peer=peer,
            prefix_peer_blocks=choice.source_blocks if peer else 0,
            load_prefix=load_prefix,
            stage_tbt_slo=stage_tbt,
            predicted_ttft=choice.ttft + overhead,
            predicted_tbt=choice.tbt,
            predicted_queue=choice.ttft - choice.busy_seconds + overhead,
            predicted_transfer=choice.transfer_seconds,
            predicted_prefill=choice.busy_seconds - choice.transfer_seconds,
            predicted_overhead=overhead,
        )
