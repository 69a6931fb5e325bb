"""The console summary block."""

from __future__ import annotations

from loadgen.console import format_summary, percentile_labels
from loadgen.metrics import summarize
from loadgen.output import build_result
from loadgen.records import RequestRecord

RECORDS = [
    RequestRecord(0, 0.0, 10, 3, ttft=0.1, itl=(0.02, 0.04), latency=0.16),
    RequestRecord(1, 0.1, 10, status=503, error="HTTP 503: overloaded: queue full"),
    RequestRecord(2, 0.2, 10, status=0, error="ClientConnectorError: refused"),
]


def result(**meta) -> dict:
    summary = summarize(RECORDS, 1.0, percentiles=[99, 50, 99.9])
    return build_result(summary, RECORDS, {"request_rate": "inf", **meta})


def test_the_block_has_vllms_lines_and_the_formulas() -> None:
    text = format_summary(result())
    lines = text.splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============"
    assert "Successful requests:                     1" in text
    assert "Rejected requests (429/503):             1" in text
    assert "Mean TTFT (ms):                          100.00" in text
    assert "TPOT = (E2EL - TTFT) / (output tokens - 1)" in text
    assert "Mean TPOT (ms):                          30.00" in text
    assert "Request goodput" not in text  # no --goodput: no line
    p_lines = [line.split()[0] for line in lines if line.startswith("P") and "TTFT" in line]
    assert p_lines == ["P50", "P99", "P99.9"]


def test_errors_are_listed_once_each() -> None:
    text = format_summary(result())
    assert "Errors by HTTP status (0: no response): {'503': 1, '0': 1}" in text
    assert "  HTTP 503: overloaded: queue full" in text


def test_percentile_labels_sort_numerically() -> None:
    assert percentile_labels({"p99_ttft_ms": 1, "p9_ttft_ms": 1, "p50_itl_ms": 1}, "ttft") == [
        "9",
        "99",
    ]
