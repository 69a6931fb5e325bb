"""Arrival schedules: vLLM's rescaling to N/rate and the gamma burstiness."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from loadgen.arrivals import arrival_times
from shared.errors import KvstackError


def test_infinite_rate_sends_everything_at_once() -> None:
    assert arrival_times(4, float("inf")) == [0.0] * 4


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_last_request_arrives_at_exactly_n_over_rate(burstiness, seed) -> None:
    times = arrival_times(50, request_rate=5.0, burstiness=burstiness, seed=seed)
    assert times[-1] == pytest.approx(10.0, rel=1e-12)
    assert times[0] > 0 and all(b >= a for a, b in itertools.pairwise(times))


def test_seed_decides_the_schedule() -> None:
    assert arrival_times(10, 2.0, seed=3) == arrival_times(10, 2.0, seed=3)
    assert arrival_times(10, 2.0, seed=3) != arrival_times(10, 2.0, seed=4)


def gap_cv(burstiness: float) -> float:
    gaps = np.diff([0.0, *arrival_times(20000, 10.0, burstiness, seed=0)])
    return float(gaps.std() / gaps.mean())


def test_burstiness_sets_the_spread_of_the_gaps() -> None:
    # Gamma with shape k has a coefficient of variation of 1/sqrt(k).
    assert gap_cv(1.0) == pytest.approx(1.0, abs=0.05)  # Poisson
    assert gap_cv(0.25) == pytest.approx(2.0, abs=0.15)  # burstier
    assert gap_cv(4.0) == pytest.approx(0.5, abs=0.05)  # more even


@pytest.mark.parametrize(
    "rate, burstiness", [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, float("inf"))]
)
def test_bad_rates_are_clear_errors(rate, burstiness) -> None:
    with pytest.raises(KvstackError):
        arrival_times(3, rate, burstiness)
