"""The simulation end to end on small traces: times from the cost model, cache reuse,
admission under overload, and the conductor's own decisions."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import ClassVar

import pytest

from loadgen.sim import runner
from loadgen.sim.report import record_of
from services.conductor import service as conductor_service
from shared import codec
from shared.conductor.core import Conductor
from tests.loadgen.sim.builders import COST, config, conversations, row, simulate

BLOCK = 512


def test_a_lone_request_takes_the_cost_models_prefill_then_decode_steps():
    n, out = 2000, 5
    (job,) = simulate([row(0.0, n, out, 1)], config(1, 1)).jobs
    record = record_of(job)
    stream = COST.transfer_time(n * COST.kv_bytes_per_token)  # overlaps the compute
    assert record.ttft == pytest.approx(max(COST.prefill_time(n, 0), stream))
    steps = [COST.decode_step_time(1, n + k) for k in range(1, out)]
    assert record.itl == pytest.approx(steps)
    assert record.latency == pytest.approx(record.ttft + sum(steps))
    assert record.status == 200 and record.output_len == out


def test_a_prefix_in_the_pool_is_fetched_and_only_the_rest_computed():
    """B shares A's five full blocks; C keeps A's node busy, so B runs on the other node
    and loads the prefix from the pool (load-balance loads any longer remote prefix)."""
    a = row(0.0, 3000, 2, 1)
    c = row(50.0, 5000, 2, 100)
    b = row(50.001, 3000, 2, 200, prefix=a.hash_ids[:5])
    run = simulate([a, c, b], config(2, 1, policy="load-balance"))
    job = run.jobs[2]
    assert (job.prefill_id, run.jobs[1].prefill_id) == ("prefill-01", "prefill-00")
    assert (job.plan.local_blocks, job.plan.fetched_blocks, job.plan.source) == (0, 5, "kvstore")
    cached = 5 * BLOCK
    fetch = COST.transfer_time(cached * COST.kv_bytes_per_token)
    assert record_of(job).ttft == pytest.approx(fetch + COST.prefill_time(3000 - cached, cached))


def test_without_a_pool_the_prefix_comes_from_the_peer_the_conductor_names():
    a = row(0.0, 3000, 2, 1)
    c = row(50.0, 5000, 2, 100)
    b = row(50.001, 3000, 2, 200, prefix=a.hash_ids[:5])
    run = simulate([a, c, b], config(2, 1, policy="load-balance", pool=False))
    job = run.jobs[2]
    assert job.placement.prefix_peer == "prefill-00" and job.prefill_id == "prefill-01"
    assert (job.plan.fetched_blocks, job.plan.source) == (5, "prefill-00")


def test_local_prefix_only_computes_what_the_node_lacks_whatever_the_placement_names():
    """As above, but the node may reuse only its own cache: the conductor still names the
    peer (it does not know), and the node computes the whole prompt."""
    a = row(0.0, 3000, 2, 1)
    c = row(50.0, 5000, 2, 100)
    b = row(50.001, 3000, 2, 200, prefix=a.hash_ids[:5])
    run = simulate([a, c, b], config(2, 1, policy="load-balance", pool=False, remote_prefix=False))
    job = run.jobs[2]
    assert job.placement.prefix_peer == "prefill-00" and job.prefill_id == "prefill-01"
    assert (job.plan.local_blocks, job.plan.fetched_blocks) == (0, 0)
    assert record_of(job).ttft == pytest.approx(COST.prefill_time(3000, 0))


def test_a_second_request_on_a_shared_prefix_hits_the_local_cache():
    a = row(0.0, 3000, 2, 1)
    b = row(50.0, 3000, 2, 200, prefix=a.hash_ids[:5])
    run = simulate([a, b], config(1, 1))
    first, second = (record_of(job) for job in run.jobs)
    assert run.jobs[1].plan.local_blocks == 5 and second.cached_tokens == 5 * BLOCK
    assert first.cached_tokens == 0
    assert run.jobs[1].compute_seconds == pytest.approx(COST.prefill_time(3000 - 2560, 2560))
    assert second.ttft < first.ttft


def test_a_follow_up_decoded_where_its_prefix_was_streams_only_the_rest():
    """B shares A's five full blocks and decodes on the node that decoded A: the node
    reserves them from its cache, as a live decode worker does, and only the rest of B's
    KV streams there (a slow link: the stream, not the compute, sets the TTFT)."""
    slow = dataclasses.replace(COST, link_bw=5e7)
    a = row(0.0, 3000, 2, 1)
    b = row(50.0, 3000, 2, 200, prefix=a.hash_ids[:5])
    first, second = simulate([a, b], config(1, 1), cost=slow).jobs
    assert (first.held_blocks, second.held_blocks) == (0, 5)
    whole = slow.transfer_time(3000 * slow.kv_bytes_per_token)
    rest = slow.transfer_time((3000 - 5 * BLOCK) * slow.kv_bytes_per_token)
    assert record_of(first).ttft == pytest.approx(max(first.compute_seconds, whole))
    assert record_of(second).ttft == pytest.approx(max(second.compute_seconds, rest))
    assert rest > second.compute_seconds  # so the held blocks made the difference


def test_a_decode_node_gets_the_prefix_the_pool_holds_and_only_the_rest_streams():
    """B shares A's five full blocks while A still decodes (its node's cache holds them
    only once A ends): B's decode node gets them from the pool itself, from its
    reservation on, as a live decode worker does; only the rest of B's KV streams."""
    slow = dataclasses.replace(COST, link_bw=5e7)
    a = row(0.0, 3000, 400, 1)
    b = row(5.0, 3000, 2, 200, prefix=a.hash_ids[:5])
    first, second = simulate([a, b], config(1, 1), cost=slow).jobs
    assert first.pool_blocks == 0 and (second.held_blocks, second.pool_blocks) == (0, 5)
    rest = slow.transfer_time((3000 - 5 * BLOCK) * slow.kv_bytes_per_token)
    got = slow.transfer_time(5 * BLOCK * slow.kv_bytes_per_token)  # from the reservation on
    assert record_of(second).ttft == pytest.approx(max(second.compute_seconds, rest, got))
    without = simulate([a, b], config(1, 1, pool=False), cost=slow).jobs[1]
    assert without.pool_blocks == 0 and record_of(without).ttft > record_of(second).ttft


def overload(admission: str):
    """Prefill keeps up; one decode node cannot hold the TBT SLO for so many requests."""
    rows = [row(i * 0.1, 600, 300, 10 * i) for i in range(60)]
    return simulate(rows, config(4, 1, admission=admission, slo_ttft=1000.0, slo_tbt=0.02))


def test_early_rejection_rejects_before_any_prefill():
    run = overload("early")
    assert sum(job.status == 503 for job in run.jobs) > 0
    assert not any(job.wasted for job in run.jobs)
    assert all(job.first_token is None for job in run.jobs if job.status == 503)


def test_baseline_admission_wastes_prefills_the_decode_node_refuses():
    run = overload("baseline")
    wasted = [job for job in run.jobs if job.wasted]
    assert wasted and all(job.status == 503 and job.busy_seconds > 0 for job in wasted)
    assert all("prefill wasted" in job.error for job in wasted)


def test_same_inputs_same_result():
    rows = conversations()
    runs = [simulate(rows, config(3, 2, policy="random", admission="predictive")) for _ in range(2)]
    assert [record_of(j).to_json() for j in runs[0].jobs] == [
        record_of(j).to_json() for j in runs[1].jobs
    ]
    assert runs[0].series == runs[1].series


def test_the_seed_varies_the_random_policy():
    rows = conversations()
    one, other = (simulate(rows, config(4, 2, policy="random", seed=s)) for s in (0, 1))
    assert [j.prefill_id for j in one.jobs] != [j.prefill_id for j in other.jobs]


def test_policies_place_differently():
    rows = conversations()
    placements = {
        policy: [j.prefill_id for j in simulate(rows, config(4, 2, policy=policy)).jobs]
        for policy in ("random", "kvcentric")
    }
    assert placements["random"] != placements["kvcentric"]


class Recording(Conductor):
    """The conductor, logging every message it is fed and every placement it makes."""

    log: ClassVar[list] = []

    def observe(self, hb):
        self.log.append(("observe", hb))
        super().observe(hb)

    def apply(self, event):
        self.log.append(("apply", event))
        super().apply(event)

    def finished(self, done):
        self.log.append(("finished", done))
        super().finished(done)

    def place(self, request, now):
        placement = super().place(request, now)
        self.log.append(("place", (request, now), placement))
        return placement


def test_placements_are_the_conductors_for_what_it_was_told(monkeypatch):
    """Replaying the heartbeats, KV events and finished requests the simulation fed its
    conductor into a fresh Conductor gives the same placements, which the jobs follow."""
    Recording.log = []
    monkeypatch.setattr(runner, "Conductor", Recording)
    sim_config = config(4, 2, admission="predictive-request", slo_tbt=0.02)
    run = simulate(conversations(80, rate=4.0), sim_config)
    fresh = Conductor(sim_config.scheduling, COST)
    placements = []
    for kind, arg, *made in Recording.log:
        if kind == "place":
            assert fresh.place(*arg) == made[0]
            placements.append(made[0])
        else:
            getattr(fresh, kind)(arg)
    assert len(placements) == len(run.jobs)
    assert any(not p.accepted for p in placements) and any(p.accepted for p in placements)
    for job, placement in zip(run.jobs, placements):
        assert job.placement is placement
        assert (job.prefill_id, job.decode_id) == (
            (placement.prefill_id, placement.decode_id) if placement.accepted else ("", "")
        )


def test_the_live_conductor_service_places_as_the_simulation_did(monkeypatch):
    """The conductor service, fed the simulation's heartbeats, KV events and finished
    requests as they cross the wire (encoded and decoded) and asked at the same times,
    makes the simulation's placements: the simulator decides as the live stack does."""
    Recording.log = []
    monkeypatch.setattr(runner, "Conductor", Recording)
    sim_config = config(4, 2, policy="kvcentric", admission="predictive-request", slo_tbt=0.02)
    simulate(conversations(80, rate=4.0), sim_config)
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(conductor_service, "time", SimpleNamespace(time=lambda: clock.now))
    live = conductor_service.ConductorService(
        conductor_service.ConductorConfig(
            worker_id="conductor-0", scheduling=sim_config.scheduling
        ),
        COST,
    )
    handlers = {
        "observe": live._on_heartbeat,
        "apply": live._on_kv_event,
        "finished": live._on_done,
    }
    wire = lambda msg: codec.decode(codec.encode(msg))

    async def replay() -> int:
        placed = 0
        for kind, arg, *made in Recording.log:
            if kind != "place":
                await handlers[kind](wire(arg))
                continue
            request, clock.now = arg
            assert await live._place(wire(request)) == made[0]
            placed += 1
        return placed

    assert asyncio.run(replay()) == 80


def _behind_its_predecessor(policy: str):
    """X puts three blocks in the pool; C keeps prefill-00 busy; A (X's three blocks and
    five more) prefills on prefill-01, and B, A's eight blocks and more, arrives while A
    is still prefilling."""
    x = row(0.0, 2000, 2, 1)
    c = row(50.0, 5000, 2, 100)
    a = row(50.001, 4500, 2, 200, prefix=x.hash_ids[:3])
    b = row(50.002, 6000, 2, 300, prefix=a.hash_ids[:8])
    run = simulate([x, c, a, b], config(2, 1, policy=policy))
    assert (run.jobs[1].prefill_id, run.jobs[2].prefill_id) == ("prefill-00", "prefill-01")
    return run.jobs[3]


def test_a_prefix_is_bound_when_the_prefill_starts_as_a_live_worker_binds_it():
    """round-robin: X and A (X's three blocks and five more) on prefill-00, a long C and
    then B (A's eight blocks and more) on prefill-01. On arrival the pool holds X's three
    blocks only; by the time B starts, after C, A's eight are there, and B loads all
    eight: a live worker binds the prefix when its engine can take the prompt."""
    x = row(0.0, 2000, 2, 1)
    c = row(50.0, 20000, 2, 100)
    a = row(50.001, 4500, 2, 200, prefix=x.hash_ids[:3])
    b = row(50.002, 6000, 2, 300, prefix=a.hash_ids[:8])
    run = simulate([x, c, a, b], config(2, 1, policy="round-robin"))
    job_a, job_b = run.jobs[2], run.jobs[3]
    assert (job_a.prefill_id, job_b.prefill_id) == ("prefill-00", "prefill-01")
    assert job_a.first_token < job_b.prefill_start  # A's blocks were there when B started
    assert (job_b.plan.local_blocks, job_b.plan.fetched_blocks) == (0, 8)
    assert job_b.plan.source == "kvstore"


def test_a_prompt_counting_on_its_workers_cache_fetches_nothing_and_finds_it_there():
    """kvcentric counts A's blocks, on their way into prefill-01's cache, as that worker's
    own; the placement tells it not to load the pool's shorter prefix, so B finds all
    eight blocks in its own cache when it starts."""
    b = _behind_its_predecessor("kvcentric")
    assert b.prefill_id == "prefill-01" and not b.placement.load_prefix
    assert (b.plan.local_blocks, b.plan.fetched_blocks) == (8, 0)
