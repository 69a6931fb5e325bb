"""Load or recompute: a prefix loads unless computing it is known to be faster, and a
fetch is waited on no longer than the prompt's own prefill would take."""

from __future__ import annotations

import pytest

from shared.prefill.worth import (
    MIN_STALL_SECONDS,
    STALL_FACTOR,
    Rates,
    after_load,
    after_prefill,
    seconds,
    stall_bound,
    worth_loading,
)


def test_an_unknown_rate_loads_and_a_known_one_compares() -> None:
    assert worth_loading(None, 1.0) and worth_loading(1.0, None)
    assert worth_loading(0.5, 1.0) and worth_loading(1.0, 1.0)
    assert not worth_loading(1.5, 1.0)
    assert seconds(100, 0.0) is None and seconds(100, 50.0) == 2.0


def test_the_stall_bound_is_the_prompts_own_prefill_time_when_known() -> None:
    rates = Rates(load_bytes_per_s=1e9, prefill_tokens_per_s=1000.0)
    assert stall_bound(rates, 10**8, 2000, ceiling=10.0) == pytest.approx(2.0)
    assert stall_bound(rates, 10**8, 20, ceiling=10.0) == MIN_STALL_SECONDS  # floor
    assert stall_bound(rates, 10**8, 50_000, ceiling=10.0) == 10.0  # ceiling


def test_without_a_prefill_rate_a_few_times_the_predicted_fetch_else_the_ceiling() -> None:
    only_load = Rates(load_bytes_per_s=1e9)
    assert stall_bound(only_load, 10**9, 2000, ceiling=10.0) == pytest.approx(STALL_FACTOR)
    assert stall_bound(Rates(), 10**9, 2000, ceiling=10.0) == 10.0


def test_rates_start_at_the_first_measure_then_move_towards_new_ones() -> None:
    rates = after_load(Rates(), 2 * 10**9, 2.0)
    assert rates.load_bytes_per_s == pytest.approx(1e9)
    rates = after_load(rates, 4 * 10**9, 2.0)
    assert 1e9 < rates.load_bytes_per_s < 2e9
    rates = after_prefill(rates, 1000, 0.5)
    assert rates.prefill_tokens_per_s == pytest.approx(2000.0)
    assert after_prefill(rates, 0, 1.0) == rates and after_load(rates, 10, 0.0) == rates
