"""The parts of a TTFT the gateway reports to the conductor beside its estimates."""

from __future__ import annotations

import pytest

from services.gateway.timing import measured_parts, ttft_breakdown
from shared.messages import PrefillTiming


def test_the_queue_is_everything_before_the_prefill_step_and_the_step_is_the_prefill() -> None:
    timing = PrefillTiming(reserve=0.01, prefix=0.02, queue=0.3, compute=0.4, transfer=0.05)
    queue, prefill = measured_parts(1.0, timing)
    assert queue == pytest.approx(0.55)  # hops before the prefill step included
    assert prefill == 0.4


def test_a_prefill_that_loaded_a_prefix_has_no_measured_compute() -> None:
    for loaded in (PrefillTiming(compute=0.4, cached_kvstore=16), PrefillTiming(cached_peer=16)):
        assert measured_parts(1.0, loaded)[1] == -1.0
    assert measured_parts(1.0, PrefillTiming(compute=0.4, cached_local=16))[1] == 0.4


def test_without_the_prefill_worker_s_account_nothing_is_measured() -> None:
    assert measured_parts(1.0, None) == (-1.0, -1.0)


def test_usage_timing_names_the_prefix_fetch_s_bytes_seconds_and_rate() -> None:
    loaded = PrefillTiming(cached_kvstore=1984, prefix_bytes=91_422_720, prefix_load=0.045)
    timing = ttft_breakdown(0.3, 0.001, loaded, 0.01)
    assert timing["prefix_load"] == {"bytes": 91_422_720, "seconds": 0.045, "gb_s": 2.032}
    assert ttft_breakdown(0.3, 0.001, None, 0.01)["prefix_load"]["gb_s"] == 0.0
