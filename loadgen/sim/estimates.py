"""The conductor's estimates beside what the simulated cluster did, per request: the wait
before its prefill started, the prefix transfer, the prefill compute, the TTFT and the TBT
(mean gap between its tokens). Summarised with the live conductor's own measure
(shared/conductor/accuracy.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

from loadgen.sim.job import Job
from shared.conductor.accuracy import ESTIMATES, summarize
from shared.messages import EstimateError


def pairs(job: Job) -> dict[str, tuple[float, float]]:
    """(predicted, actual) of each estimate for a request that got its first token."""
    placement, first_token = job.placement, job.first_token
    if placement is None or first_token is None:
        return {}
    found = {
        "queue": (placement.predicted_queue, job.prefill_start - job.arrival),
        "transfer": (placement.predicted_transfer, job.fetch_seconds),
        "prefill": (placement.predicted_prefill, job.compute_seconds),
        "ttft": (placement.predicted_ttft, first_token - job.arrival),
    }
    if job.num_output_tokens > 1:
        found["tbt"] = (placement.predicted_tbt, job.mean_gap)
    return found


def estimate_errors(jobs: Sequence[Job]) -> dict:
    """Each estimate's error distribution over the requests (EstimateError's fields)."""
    by_name: dict[str, list[tuple[float, float]]] = {name: [] for name in ESTIMATES}
    for job in jobs:
        for name, pair in pairs(job).items():
            by_name[name].append(pair)
    found = (summarize(name, found) for name, found in by_name.items())
    return {s.estimate: _fields(s) for s in found if s is not None}


def _fields(error: EstimateError) -> dict:
    fields = asdict(error)
    del fields["estimate"]  # the key
    return fields
