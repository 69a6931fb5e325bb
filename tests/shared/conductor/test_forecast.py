"""The decode ledger: bookings, pruning and the forecast batch at a future time."""

from __future__ import annotations

import pytest

from shared.conductor.forecast import Booking, Ledger, tbt_at
from shared.conductor.state import ClusterState
from tests.shared.conductor.builders import COST, beat, decode_worker, step_s


def ledger_with(*bookings: Booking, worker: str = "d0") -> Ledger:
    ledger = Ledger()
    for booking in bookings:
        ledger.book(worker, booking)
    return ledger


def test_bookings_are_kept_sorted_by_end() -> None:
    ledger = ledger_with(Booking(0, 5, 1), Booking(0, 2, 1), Booking(0, 9, 1))
    assert [b.end for b in ledger.bookings["d0"]] == [2, 5, 9]


def test_prune_drops_bookings_that_ended_by_now() -> None:
    ledger = ledger_with(Booking(0, 2, 1), Booking(0, 5, 1), Booking(0, 9, 1))
    ledger.prune(now=5.0)
    assert [b.end for b in ledger.bookings["d0"]] == [9]


def test_a_worker_with_no_bookings_left_leaves_the_ledger() -> None:
    ledger = ledger_with(Booking(0, 2, 1))
    ledger.prune(now=3.0)
    assert "d0" not in ledger.bookings


def test_forget_drops_a_workers_bookings() -> None:
    ledger = ledger_with(Booking(0, 2, 1))
    ledger.forget("d0")
    assert not ledger.bookings


@pytest.mark.parametrize(
    "t, expected", [(0.5, (0, 0)), (2.5, (2, 300)), (3.0, (1, 200)), (6.0, (0, 0))]
)
def test_the_batch_at_t_counts_bookings_that_cover_t(t: float, expected) -> None:
    ledger = ledger_with(Booking(1, 3, 100), Booking(2, 6, 200))
    assert ledger.batch_at(decode_worker("d0"), 0.0, t) == expected


def test_unknown_running_requests_count_as_long_as_the_worker_reports_them() -> None:
    worker = decode_worker("d0", running=4, context=4000)
    assert Ledger().batch_at(worker, 0.0, 4.9) == (4, 4000)
    assert Ledger().batch_at(worker, 0.0, 500.0) == (4, 4000)


def test_running_requests_the_ledger_knows_are_not_counted_twice() -> None:
    ledger = ledger_with(Booking(-1, 10, 1000))
    worker = decode_worker("d0", running=3, context=3000)
    assert ledger.batch_at(worker, 0.0, 1.0) == (3, 3000)
    assert ledger.batch_at(worker, 0.0, 7.0) == (3, 3000)  # two still reported running
    assert ledger.batch_at(worker, 0.0, 12.0) == (2, 2000)  # the booked one has ended


def test_an_idle_forecast_has_no_tbt() -> None:
    assert tbt_at(Ledger(), decode_worker("d0"), 0.0, 1.0, COST) == 0.0


def test_tbt_at_adds_the_new_request_to_the_forecast_batch() -> None:
    ledger = ledger_with(Booking(1, 3, 100), Booking(2, 6, 200))
    tbt = tbt_at(ledger, decode_worker("d0"), 0.0, 2.5, COST, extra_tokens=500)
    assert tbt == pytest.approx(step_s(3, 800))


def test_requests_assigned_since_the_last_beat_are_not_counted_twice() -> None:
    # one request of 1000 tokens placed on an idle worker: booked in the ledger from 1 s
    # and counted as pending by the cluster state until the worker's next beat
    state = ClusterState()
    state.observe(beat("d0", "decode", 0.0))
    state.assign("d0", 1001)
    ledger = ledger_with(Booking(1.0, 10.0, 1000))
    worker = state.snapshot(0.0).decode[0]
    assert ledger.batch_at(worker, 0.0, 2.0) == (1, 1000)
