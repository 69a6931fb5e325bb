"""When each request is sent, in seconds after the run's start (`vllm bench serve`'s rule).

Gaps between arrivals are gamma-distributed with shape `burstiness` and mean 1/rate:
burstiness 1 is a Poisson process, below 1 burstier, above 1 more even. The cumulative
times are then rescaled so the last request arrives at exactly N/rate, which keeps the
offered load the same whatever the seed (the raw sum misses it by a few percent).
"""

from __future__ import annotations

import math

import numpy as np

from shared.errors import KvstackError


def arrival_times(
    num_requests: int, request_rate: float, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """An infinite rate sends everything at t=0."""
    if not request_rate > 0:
        raise KvstackError(f"--request-rate must be positive (or inf), got {request_rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise KvstackError(f"--burstiness must be a positive number, got {burstiness}")
    if math.isinf(request_rate) or num_requests == 0:
        return [0.0] * num_requests
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_requests)
    times = np.cumsum(gaps)
    times *= (num_requests / request_rate) / times[-1]
    return times.tolist()
