"""The stack's path time, learned from requests placed on idle workers and reported in
the predictions, never fed back into itself."""

from __future__ import annotations

import pytest

from shared.conductor.overhead import MIN_SAMPLES, PathOverhead
from shared.messages import RequestDone
from tests.shared.conductor.builders import beat, conductor, request


def done(queue: float, predicted_queue: float = 0.0, overhead: float = 0.0) -> RequestDone:
    return RequestDone(
        "r", 0, 100, 5, 1.0, 0.01, predicted_ttft=0.5, predicted_queue=predicted_queue,
        predicted_overhead=overhead, queue=queue,
    )  # fmt: skip


def test_it_is_the_median_residual_of_idle_placements_once_there_are_enough() -> None:
    learned = PathOverhead()
    for queue in [0.05] * (MIN_SAMPLES - 1):
        learned.observe(done(queue))
    assert learned.seconds == 0.0  # too few yet
    learned.observe(done(0.09))
    assert learned.seconds == pytest.approx(0.05)
    for _ in range(MIN_SAMPLES):
        learned.observe(done(5.0, predicted_queue=2.0))  # a queued worker: not the path
        learned.observe(done(-1.0))  # not measured
        learned.observe(RequestDone("r", 0, 100, 5, 1.0, 0.01, queue=0.5))  # placed twice
    assert learned.seconds == pytest.approx(0.05)


def test_learning_from_its_own_predictions_does_not_drift() -> None:
    """A placement's predicted queue includes the overhead; learning takes it out again."""
    learned = PathOverhead()
    for _ in range(MIN_SAMPLES):
        learned.observe(done(0.06))
    for _ in range(100):
        seconds = learned.seconds
        learned.observe(done(0.06, predicted_queue=seconds, overhead=seconds))
    assert learned.seconds == pytest.approx(0.06)


def test_placements_report_it_in_their_queue_and_ttft_but_decide_without_it() -> None:
    plain, learned = conductor(policy="kvcentric"), conductor(policy="kvcentric")
    for core in (plain, learned):
        core.observe(beat("p0", "prefill"))
        core.observe(beat("p1", "prefill", waiting=1, queued=400))
        core.observe(beat("d0", "decode"))
    for _ in range(MIN_SAMPLES):
        learned.finished(done(0.07))
    a, b = plain.place(request(1600), now=0.1), learned.place(request(1600), now=0.1)
    assert (a.prefill_id, a.decode_id) == (b.prefill_id, b.decode_id)
    assert b.predicted_overhead == pytest.approx(0.07)
    assert b.predicted_ttft == pytest.approx(a.predicted_ttft + 0.07)
    assert b.predicted_queue == pytest.approx(a.predicted_queue + 0.07)
    assert b.predicted_prefill == a.predicted_prefill
