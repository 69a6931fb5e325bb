"""bench engine's share of the bandwidth limit: each decode row against the read bandwidth
measured beside it, not one read for the whole run."""

from __future__ import annotations

import time

import pytest

from bench.engine import ReadBandwidth, format_table, shares_of_limit


def test_each_row_is_its_own_reads_share() -> None:
    rows = [
        {"batch": 1, "kvstack_tok_s": 250.0, "read_gb_s": 50.0, "transformers": {}},
        {"batch": 8, "kvstack_tok_s": 600.0, "read_gb_s": 25.0, "transformers": {}},
    ]
    shares_of_limit(rows, weight_bytes=100_000_000, kv_token_bytes=50_000, mean_context=200)
    # batch 1: 50 GB/s over 100 MB + 10 MB of KV = 454.5 tok/s; batch 8: 8 x 25 GB/s over
    # 100 MB + 80 MB = 1,111.1 tok/s
    assert rows[0]["limit_tok_s"] == pytest.approx(454.5, abs=0.1)
    assert rows[0]["share_of_limit"] == pytest.approx(250 / 454.545, abs=1e-3)
    assert rows[1]["limit_tok_s"] == pytest.approx(1111.1, abs=0.1)
    assert rows[1]["share_of_limit"] == pytest.approx(0.54, abs=1e-3)


def test_the_table_prints_each_rows_read_and_their_range() -> None:
    rows = [
        {"batch": 1, "kvstack_tok_s": 250.0, "read_gb_s": 50.0, "transformers": {}},
        {"batch": 8, "kvstack_tok_s": 600.0, "read_gb_s": 25.0, "transformers": {}},
    ]
    shares_of_limit(rows, weight_bytes=100_000_000, kv_token_bytes=50_000, mean_context=200)
    report = {
        "model": "m", "device": "cpu", "threads": 2, "kernels": "avx2", "dtype": "float32",
        "weights": "auto", "prefill": [], "decode": rows, "weight_bytes": 100_000_000,
        "kv_bytes_per_context_token": 50_000, "mean_context": 200.0,
        "read_bandwidth_gb_s": [25.0, 50.0],
    }  # fmt: skip
    table = format_table(report)
    assert "55%" in table and "50.0" in table and "54%" in table and "25.0" in table
    assert "25.0-50.0 GB/s" in table


def test_a_read_goes_on_for_its_seconds_past_its_repeats() -> None:
    """Right after the process idles this VM read at half speed for a while: a read takes the
    fastest of `seconds` of them, not of its first few (16 MB: milliseconds a repeat)."""
    probe = ReadBandwidth(num_bytes=1 << 24)
    start = time.perf_counter()
    assert probe.measure(repeats=3, seconds=0.2) > 0
    assert time.perf_counter() - start >= 0.2
