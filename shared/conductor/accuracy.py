"""How far the conductor's estimates fall from what happened: each placement's predicted
queue, transfer, prefill, TTFT and TBT beside the measured ones. The simulator summarises
a whole run with `summarize`; the live conductor keeps the latest requests in an
EstimateLog (the gateway reports TTFT, TBT and the measured parts of the TTFT with each
finished request). Plain data, no I/O."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import numpy as np

from shared.messages import EstimateError, RequestDone

ESTIMATES = ("queue", "transfer", "prefill", "ttft", "tbt")
# Below this many seconds a time counts as this long for the relative error: a queue of
# 0.1 ms predicted as 0.2 ms is not 100% wrong in any way that matters.
FLOOR_SECONDS = 0.01
WINDOW = 4096  # requests the live log keeps per estimate


def done_pairs(done: RequestDone) -> list[tuple[str, float, float]]:
    """(estimate, predicted, actual) a finished request tells: its TTFT, the parts of it that
    were measured, and its TBT when it had two tokens or more. A request placed more than
    once carries no prediction."""
    found = []
    if done.predicted_ttft > 0:
        found.append(("ttft", done.predicted_ttft, done.ttft))
        if done.queue >= 0:
            found.append(("queue", done.predicted_queue, done.queue))
        if done.prefill >= 0:
            found.append(("prefill", done.predicted_prefill, done.prefill))
    if done.predicted_tbt > 0 and done.num_output_tokens > 1:
        found.append(("tbt", done.predicted_tbt, done.tbt))
    return found


def relative_error(predicted: float, actual: float) -> float:
    return (predicted - actual) / max(actual, FLOOR_SECONDS)


def summarize(estimate: str, pairs: Iterable[tuple[float, float]]) -> EstimateError | None:
    """The error distribution of (predicted, actual) pairs; None when there are none."""
    both = np.asarray(list(pairs), dtype=float).reshape(-1, 2)
    if not len(both):
        return None
    predicted, actual = both[:, 0], both[:, 1]
    rel = (predicted - actual) / np.maximum(actual, FLOOR_SECONDS)
    return EstimateError(
        estimate,
        len(both),
        float(np.median(np.abs(rel))),
        float(np.percentile(np.abs(rel), 90)),
        float(rel.mean()),
        float(np.median(np.abs(predicted - actual))),
    )


class EstimateLog:
    """The latest (predicted, actual) pairs of each estimate."""

    def __init__(self, window: int = WINDOW) -> None:
        self.pairs: dict[str, deque[tuple[float, float]]] = {
            name: deque(maxlen=window) for name in ESTIMATES
        }

    def observe(self, name: str, predicted: float, actual: float) -> None:
        self.pairs[name].append((predicted, actual))

    def summary(self) -> tuple[EstimateError, ...]:
        found = (summarize(name, pairs) for name, pairs in self.pairs.items())
        return tuple(s for s in found if s is not None)
