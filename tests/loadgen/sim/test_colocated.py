import pytest

from loadgen.sim.report import record_of
from tests.loadgen.sim.builders import COST, config, row, simulate


def test_a_prefill_stalls_the_running_batch():
    """B's prompt arrives while A prefills; it is prefilled before A's first decode step,
    so one of A's gaps takes at least B's whole prefill."""
    a, b = row(0.0, 1000, 200, 1), row(1.0, 4000, 2, 100)
    run = simulate([a, b], config(colocated=1, policy="load-balance"))
    first, second = (record_of(job) for job in run.jobs)
    stall = COST.prefill_time(4000, 0)
    assert max(first.itl) >= stall
    assert first.ttft == pytest.approx(COST.prefill_time(1000, 0))
    assert second.ttft == pytest.approx(COST.prefill_time(1000, 0) - 1.0 + stall)


def test_without_overlap_the_batch_decodes_at_step_speed():
    a, b = row(0.0, 1000, 20, 1), row(100.0, 4000, 2, 100)
    run = simulate([a, b], config(colocated=1, policy="load-balance"))
    assert max(record_of(run.jobs[0]).itl) < COST.prefill_time(4000, 0) / 10


def test_colocated_nodes_reuse_only_their_own_cache():
    a = row(0.0, 3000, 2, 1)
    b = row(50.0, 3000, 2, 200, prefix=a.hash_ids[:5])
    c = row(50.0, 100, 2, 900)
    run = simulate([a, c, b], config(colocated=2, policy="cache-aware"))
    job = run.jobs[2]
    assert job.prefill_id == run.jobs[0].prefill_id and job.plan.local_blocks == 5
    assert job.plan.fetched_blocks == 0
    assert all(r.extra["prefill"] == r.extra["decode"] for r in map(record_of, run.jobs))
