"""The roofline cost model behaves as the physics says: prefill is compute bound, decode
memory bound, and faster hardware is faster."""

from __future__ import annotations

import pytest

from shared.costmodel import roofline


@pytest.fixture
def a800():
    return roofline("llama3-70b", "a800")


def test_long_prefills_are_compute_bound_and_grow_a_little_faster_than_linearly(a800) -> None:
    ratio = a800.prefill_time(8000) / a800.prefill_time(4000)
    assert 2.0 < ratio < 2.3  # linear in the weights, quadratic in attention
    hw = a800.hardware
    weights_only = a800.shape.weight_bytes / (hw.mem_bw * hw.bw_efficiency)
    assert a800.prefill_time(4000) > 10 * weights_only


def test_a_cached_prefix_costs_attention_but_far_less_than_computing_it(a800) -> None:
    with_prefix, alone = a800.prefill_time(1000, 8000), a800.prefill_time(1000)
    assert alone < with_prefix < 0.3 * a800.prefill_time(9000)


def test_small_decode_batches_are_memory_bound(a800) -> None:
    one, two = a800.decode_step_time(1, 1000), a800.decode_step_time(2, 2000)
    assert two / one < 1.01  # the weights are read once either way
    assert a800.decode_step_time(256, 256_000) > 2 * one  # until compute catches up


def test_decode_steps_grow_with_the_kv_they_read(a800) -> None:
    assert a800.decode_step_time(32, 32 * 4000) > 1.15 * a800.decode_step_time(32, 32 * 1000)


def test_h100_is_faster_than_a800_for_the_same_model(a800) -> None:
    h100 = roofline("llama3-70b", "h100")
    assert h100.prefill_time(4000) < a800.prefill_time(4000) / 2
    assert h100.decode_step_time(16, 16_000) < a800.decode_step_time(16, 16_000)
    assert h100.transfer_time(1e9) < a800.transfer_time(1e9)


def test_kv_bytes_and_transfer_time_of_llama3_70b(a800) -> None:
    assert a800.kv_bytes_per_token == 80 * 2 * 8 * 128 * 2 == 327_680
    # 800 Gbps is 100 GB/s, plus the per-transfer latency
    assert a800.transfer_time(1e9) == pytest.approx(0.01 + 20e-6)


def test_every_step_pays_the_fixed_overhead(a800) -> None:
    assert a800.prefill_time(1) > a800.hardware.step_overhead
    assert a800.decode_step_time(1, 1) > a800.hardware.step_overhead
