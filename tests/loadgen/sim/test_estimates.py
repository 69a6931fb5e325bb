"""The simulator reports the conductor's estimates beside what its cluster did."""

from __future__ import annotations

import pytest

from loadgen.sim.estimates import estimate_errors, pairs
from tests.loadgen.sim.builders import config, conversations, simulate


def test_every_estimate_is_compared_with_what_the_job_did() -> None:
    run = simulate(conversations(40, rate=2.0), config(2, 2))
    job = next(j for j in run.jobs if j.first_token is not None and j.num_output_tokens > 1)
    found = pairs(job)
    assert set(found) == {"queue", "transfer", "prefill", "ttft", "tbt"}
    assert found["ttft"][1] == pytest.approx(job.first_token - job.arrival)
    assert found["prefill"][1] == job.compute_seconds
    errors = estimate_errors(run.jobs)
    assert errors["ttft"]["count"] == sum(j.first_token is not None for j in run.jobs)
    # the simulator computes with the conductor's own cost model: what differs is waiting
    assert errors["prefill"]["median_abs_rel_error"] == pytest.approx(0.0, abs=1e-9)
