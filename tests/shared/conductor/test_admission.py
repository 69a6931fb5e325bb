"""Admission verdicts of every mode on constructed snapshots.

One idle prefill worker and a prompt of 1000 tokens: predicted TTFT = 0.005 + prefill(1000)
= 1.015 s. The TBT SLO is 50 ms; a decode batch of b requests of 1000 tokens each steps in
0.01 + 0.002 b seconds, so 20 fit and 21 do not.
"""

from __future__ import annotations

import pytest

from shared.conductor import admission
from shared.conductor.forecast import Booking, Ledger
from shared.conductor.outputs import OutputLengths
from shared.conductor.policies import Inputs, kvcentric
from shared.messages import RequestDone
from tests.shared.conductor.builders import (
    OVERHEAD,
    beat,
    conductor,
    decode_worker,
    inputs,
    prefill_s,
    prefill_worker,
    request,
)

TTFT = OVERHEAD + prefill_s(1000)
SLO_TBT = 0.05
CHECKING = ("baseline", "early", "predictive", "predictive-request")


def judge(mode: str, decode=None, req=None, ledger: Ledger | None = None, **config) -> str:
    inp = make(mode, decode, req, **config)
    return admission.verdict(
        inp, kvcentric(inp), ledger or Ledger(), OutputLengths(inp.config.decode_time)
    )


def make(mode: str, decode=None, req=None, **config) -> Inputs:
    config = {"slo_tbt": SLO_TBT, **config}
    return inputs(
        [prefill_worker("p0")],
        decode or [decode_worker("d0")],
        req or request(1000),
        admission=mode,
        **config,
    )


def booked(count: int, start: float, end: float, worker: str = "d0") -> Ledger:
    ledger = Ledger()
    for _ in range(count):
        ledger.book(worker, Booking(start, end, 1000))
    return ledger


FULL_NOW = decode_worker("d0", running=50, context=50_000)  # TBT now 0.112 s


# TTFT, every mode


def test_none_admits_whatever_the_prediction() -> None:
    assert judge("none", [FULL_NOW], slo_ttft=0.01) == ""


@pytest.mark.parametrize("mode", CHECKING)
def test_a_predicted_ttft_over_the_slo_is_rejected(mode: str) -> None:
    assert judge(mode, slo_ttft=TTFT - 0.001).startswith("overloaded: predicted TTFT")
    assert judge(mode, slo_ttft=TTFT + 0.001) == ""


# baseline and early


def test_baseline_ignores_decode_load() -> None:
    assert judge("baseline", [FULL_NOW]) == ""


def test_early_rejects_when_decode_tbt_now_exceeds_the_slo() -> None:
    assert "TBT 112ms" in judge("early", [FULL_NOW])


def test_early_admits_when_decode_tbt_now_is_within_the_slo() -> None:
    assert judge("early", [decode_worker("d0", running=18, context=18_000)]) == ""


def test_baseline_placements_ask_decode_to_recheck_tbt() -> None:
    placement = conductor(admission="baseline", slo_tbt=0.07).place(request(1000), 0.0)
    assert placement.accepted and placement.stage_tbt_slo == 0.07


@pytest.mark.parametrize("mode", ["none", "early", "predictive", "predictive-request"])
def test_other_modes_ask_decode_for_no_recheck(mode: str) -> None:
    assert conductor(admission=mode).place(request(1000), 0.0).stage_tbt_slo == 0.0


# predictive: the forecast at now + TTFT


@pytest.mark.parametrize("mode", ["predictive", "predictive-request"])
def test_predictive_admits_when_bookings_end_before_prefill_does(mode: str) -> None:
    ledger = booked(50, start=-5.0, end=TTFT - 0.5)
    assert judge(mode, [FULL_NOW], ledger=ledger) == ""
    assert judge("early", [FULL_NOW], ledger=ledger) != ""


@pytest.mark.parametrize("mode", ["predictive", "predictive-request"])
def test_predictive_rejects_when_bookings_still_run_when_prefill_ends(mode: str) -> None:
    assert "TBT 112ms" in judge(mode, [FULL_NOW], ledger=booked(50, start=-5.0, end=TTFT + 1))


@pytest.mark.parametrize("mode", ["predictive", "predictive-request"])
def test_predictive_sees_requests_still_in_prefill_that_early_misses(mode: str) -> None:
    ledger = booked(50, start=TTFT - 0.5, end=30.0)  # admitted, not decoding yet
    assert "TBT 112ms" in judge(mode, ledger=ledger)
    assert judge("early", ledger=ledger) == ""


def test_predictive_counts_running_requests_it_never_booked_whatever_the_decode_time() -> None:
    assert judge("predictive", [FULL_NOW], decode_time=2 * TTFT - 0.01) != ""
    assert judge("predictive", [FULL_NOW], decode_time=2 * TTFT + 0.01) != ""


def test_predictive_judges_the_mean_over_decode_workers() -> None:
    # d0 will have 30 requests (TBT 0.072 s with this one), d1 none: the mean is 0.036 s
    decode, ledger = [decode_worker("d0"), decode_worker("d1")], booked(30, 0.5, 30.0)
    assert judge("predictive", decode, ledger=ledger) == ""
    assert "TBT 72ms" in judge("predictive-request", decode, ledger=ledger)


# predictive-request: each request's own decode time


def decode_booking(core, placement) -> float:
    [booking] = core.ledger.bookings[placement.decode_id]
    return booking.end - booking.start


def test_predictive_books_the_uniform_decode_time() -> None:
    core = conductor(admission="predictive", decode_time=7.0)
    assert decode_booking(core, core.place(request(1000, max_tokens=5), 0.0)) == pytest.approx(7.0)


def test_predictive_learns_the_uniform_decode_time_from_finished_requests() -> None:
    core = conductor(admission="predictive", decode_time=7.0)
    core.finished(RequestDone("old", 1, 1000, 40, 1.0, 0.05))
    assert decode_booking(core, core.place(request(1000), 0.0)) == pytest.approx(2.0)


def test_predictive_request_books_max_tokens_at_the_predicted_tbt() -> None:
    core = conductor(admission="predictive-request")
    placement = core.place(request(1000, max_tokens=5), 0.0)
    assert decode_booking(core, placement) == pytest.approx(5 * placement.predicted_tbt)


def test_predictive_request_learns_output_length_per_first_block() -> None:
    core = conductor(admission="predictive-request")
    core.finished(RequestDone("old", 11, 1000, 10, 1.0, 0.05))
    placement = core.place(request(1000, hashes=(11, 12), max_tokens=1000), 0.0)
    assert decode_booking(core, placement) == pytest.approx(10 * placement.predicted_tbt)


def test_short_outputs_leave_room_that_uniform_bookings_do_not() -> None:
    # a burst of 20 two-token requests of 100 tokens: each prefill ends 0.11 s after the
    # last, so its decode (2 x 11 ms) is over before the next one's begins; the idle decode
    # worker beats in between (the requests are all still in prefill)
    admitted = {}
    for mode in ("predictive", "predictive-request"):
        core, admitted[mode] = conductor(admission=mode, slo_tbt=0.02), 0
        for i in range(20):
            admitted[mode] += core.place(request(100, f"r{i}", max_tokens=2), 0.0).accepted
            core.observe(beat("d0", "decode", 0.0))
    # uniform 20 s bookings pile up: 0.01 + 0.0011 b <= 0.02 holds for 9 requests
    assert admitted == {"predictive": 9, "predictive-request": 20}


# the request's own SLOs


def test_a_request_ttft_slo_overrides_the_default() -> None:
    assert "TTFT" in judge("early", req=request(1000, slo_ttft=TTFT - 0.01), slo_ttft=30.0)


def test_a_request_tbt_slo_overrides_the_default() -> None:
    assert judge("early", [FULL_NOW], req=request(1000, slo_tbt=0.2)) == ""


def test_a_request_tbt_slo_is_what_baseline_asks_decode_to_check() -> None:
    placement = conductor(admission="baseline").place(request(1000, slo_tbt=0.3), 0.0)
    assert placement.stage_tbt_slo == 0.3


def test_slo_of_falls_back_to_the_config_per_field() -> None:
    slo = admission.slo_of(request(slo_tbt=0.3), make("early", slo_ttft=9.0).config)
    assert (slo.ttft, slo.tbt) == (9.0, 0.3)
