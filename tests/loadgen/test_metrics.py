"""vLLM's metric formulas against numbers worked out by hand."""

from __future__ import annotations

import pytest

from loadgen.metrics import parse_goodput, summarize
from loadgen.records import RequestRecord
from shared.errors import KvstackError

RECORDS = [
    # token events at 0.10, 0.12, 0.16
    RequestRecord(
        0,
        start_time=0.0,
        input_len=10,
        output_len=3,
        ttft=0.1,
        itl=(0.02, 0.04),
        latency=0.16,
        cached_tokens=4,
    ),
    # token events at 0.35, 0.45
    RequestRecord(
        1, start_time=0.05, input_len=20, output_len=2, ttft=0.3, itl=(0.1,), latency=0.4
    ),
    # one token at 1.2
    RequestRecord(2, start_time=1.0, input_len=5, output_len=1, ttft=0.2, latency=0.2),
    RequestRecord(3, start_time=1.5, input_len=7, status=503, error="HTTP 503: overloaded"),
]


def test_totals_and_throughputs() -> None:
    s = summarize(RECORDS, duration=2.0)
    assert (s["num_prompts"], s["completed"], s["failed"], s["rejected"]) == (4, 3, 1, 1)
    assert (s["total_input_tokens"], s["total_output_tokens"], s["cached_tokens"]) == (35, 6, 4)
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["output_throughput"] == pytest.approx(3.0)
    assert s["total_token_throughput"] == pytest.approx(20.5)
    assert s["errors_by_status"] == {"503": 1}
    assert s["request_goodput"] is None and s["slo_attainment"] is None


def test_latency_formulas() -> None:
    s = summarize(RECORDS, duration=2.0, percentiles=[50, 99])
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["p99_ttft_ms"] == pytest.approx(298.0)  # 200 + 0.98 * (300 - 200)
    # TPOT = (E2EL - TTFT) / (out - 1), only requests with out > 1: 30 ms and 100 ms
    assert s["mean_tpot_ms"] == pytest.approx(65.0)
    # ITL pools every gap of every request: 20, 40, 100 ms
    assert s["mean_itl_ms"] == pytest.approx(160.0 / 3)
    assert s["median_itl_ms"] == pytest.approx(40.0)
    assert s["mean_e2el_ms"] == pytest.approx(760.0 / 3)
    assert s["p50_e2el_ms"] == pytest.approx(200.0)


def test_peaks() -> None:
    s = summarize(RECORDS, duration=2.0)
    assert s["max_concurrent_requests"] == 2  # requests 0 and 1 overlap, 2 starts later
    assert s["max_output_tokens_per_s"] == 5  # five token events in [0 s, 1 s)


def test_goodput_and_slo_attainment() -> None:
    s = summarize(RECORDS, duration=2.0, slos=parse_goodput(["ttft:250", "tpot:50"]))
    # good: request 0 (TTFT 100, TPOT 30) and 2 (TTFT 200, TPOT 0 for one token);
    # request 1 misses both, request 3 failed
    assert s["request_goodput"] == pytest.approx(1.0)
    assert s["slo_attainment"] == pytest.approx(0.5)
    assert s["slo"] == {"ttft": 250.0, "tpot": 50.0}


@pytest.mark.parametrize("item", ["ttft", "ttft:", "ttft:-1", "itl:5", "e2el:abc", "tpot:inf"])
def test_bad_goodput_items(item) -> None:
    with pytest.raises(KvstackError, match="goodput"):
        parse_goodput([item])


def test_no_successful_request_gives_zeros_not_errors() -> None:
    s = summarize(RECORDS[3:], duration=1.0)
    assert s["completed"] == 0 and s["mean_ttft_ms"] == 0.0 and s["max_concurrent_requests"] == 0
