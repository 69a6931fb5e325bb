"""The conductor's estimates beside what happened: the error measure, the live log, and
the prediction a placement carries."""

from __future__ import annotations

import pytest

from shared.conductor.accuracy import FLOOR_SECONDS, EstimateLog, done_pairs, summarize
from shared.messages import RequestDone
from tests.shared.conductor.builders import beat, conductor, request


def test_errors_are_relative_to_what_happened_with_a_floor_for_tiny_times() -> None:
    error = summarize("ttft", [(1.0, 2.0), (3.0, 2.0), (2.0, 2.0), (0.0, 0.0)])
    assert error is not None and error.count == 4
    assert error.median_abs_rel_error == pytest.approx(0.25)  # of 0, 0, 0.5, 0.5
    assert error.mean_rel_error == pytest.approx(0.0)  # one short, one long
    assert summarize("ttft", [(0.0, FLOOR_SECONDS / 2)]).median_abs_rel_error == 0.5
    assert summarize("ttft", []) is None


def test_the_live_log_keeps_the_latest_requests() -> None:
    log = EstimateLog(window=2)
    for predicted in (10.0, 1.0, 1.0):
        log.observe("ttft", predicted, 1.0)
    (ttft,) = log.summary()
    assert (ttft.estimate, ttft.count, ttft.p90_abs_rel_error) == ("ttft", 2, 0.0)


def test_a_request_placed_again_or_with_one_token_tells_no_tbt() -> None:
    done = RequestDone("r", 0, 100, 1, 0.5, 0.0, predicted_ttft=0.4, predicted_tbt=0.02)
    assert done_pairs(done) == [("ttft", 0.4, 0.5)]
    assert done_pairs(RequestDone("r", 0, 100, 5, 0.5, 0.03)) == []


def test_the_measured_parts_of_a_ttft_pair_with_their_predictions() -> None:
    done = RequestDone(
        "r", 0, 100, 1, 0.5, 0.0, 0.4, 0.02, predicted_queue=0.1, predicted_prefill=0.3,
        queue=0.2, prefill=0.25,
    )  # fmt: skip
    assert done_pairs(done) == [("ttft", 0.4, 0.5), ("queue", 0.1, 0.2), ("prefill", 0.3, 0.25)]
    unmeasured = RequestDone("r", 0, 100, 1, 0.5, 0.0, 0.4, queue=0.2)
    assert [name for name, _, _ in done_pairs(unmeasured)] == ["ttft", "queue"]
    placed_twice = RequestDone("r", 0, 100, 1, 0.5, 0.0, queue=0.2, prefill=0.25)
    assert done_pairs(placed_twice) == []


def test_a_placement_says_what_its_predicted_ttft_is_made_of() -> None:
    core = conductor(policy="kvcentric")
    core.observe(beat("p0", "prefill", waiting=1, queued=400))
    core.observe(beat("d0", "decode"))
    placement = core.place(request(1600), now=0.1)
    parts = placement.predicted_queue + placement.predicted_transfer + placement.predicted_prefill
    assert placement.predicted_queue > 0 and placement.predicted_prefill > 0
    assert parts == pytest.approx(placement.predicted_ttft)
    core.finished(
        RequestDone("r", 0, 1600, 10, 2 * placement.predicted_ttft, 0.01, placement.predicted_ttft)
    )
    (ttft,) = core.estimates.summary()
    assert ttft.median_abs_rel_error == pytest.approx(0.5)
