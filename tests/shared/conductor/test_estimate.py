"""Predicted times: prefill queue, prefill, transfer and decode TBT, by hand."""

from __future__ import annotations

import pytest

from shared.conductor import estimate
from shared.conductor.loads import Pending
from tests.shared.conductor.builders import (
    COST,
    decode_worker,
    prefill_s,
    prefill_worker,
    step_s,
    transfer_s,
)


def test_an_empty_prefill_queue_takes_no_time() -> None:
    assert estimate.prefill_queue_time(prefill_worker("p0"), COST) == 0.0


def test_queued_requests_are_taken_as_equal_length() -> None:
    worker = prefill_worker("p0", waiting=3, queued=1500)
    assert estimate.prefill_queue_time(worker, COST) == pytest.approx(3 * prefill_s(500))


def test_pending_work_adds_its_predicted_seconds_not_its_tokens() -> None:
    worker = prefill_worker("p0", waiting=1, queued=500, pending=Pending(9999, 2, 0.7))
    assert estimate.prefill_queue_time(worker, COST) == pytest.approx(prefill_s(500) + 0.7)


def test_prefill_computes_only_what_is_not_cached() -> None:
    assert estimate.prefill_time(COST, 1000, 256) == pytest.approx(prefill_s(744, 256))


def test_a_fully_cached_prompt_still_computes_one_token() -> None:
    assert estimate.prefill_time(COST, 1000, 1000) == pytest.approx(prefill_s(1, 999))


def test_moving_no_blocks_costs_nothing_not_even_latency() -> None:
    assert estimate.transfer_time(COST, 0, 16) == 0.0


def test_transfer_is_latency_plus_bytes_over_bandwidth() -> None:
    assert estimate.transfer_time(COST, 10, 16) == pytest.approx(transfer_s(10))


def test_decode_tbt_counts_running_waiting_and_the_new_request() -> None:
    worker = decode_worker("d0", running=4, context=3000)._replace(num_waiting=2)
    assert estimate.decode_tbt(worker, 500, COST) == pytest.approx(step_s(7, 3500))
