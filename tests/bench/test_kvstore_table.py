"""`bench kvstore`'s table: each TTFT block with where the hits' time went, and the
baselines' blocks (a decode worker keeping no prefix: taking the pool's, or sent it all)
after it when measured."""

from __future__ import annotations

from bench.kvstore import format_table


def ttft(held: int, mb: float) -> dict:
    part = {"gateway_ttft_ms": 1.0, "prefill_compute_ms": 2.0, "handoff_mb": mb,
            "held_by_decode": held}  # fmt: skip
    return {
        "cold": 100.0, "kvstore_hit": 20.0, "local_hit": 10.0, "speedup_kvstore": 5.0,
        "speedup_local": 10.0, "parts": {"cold": part, "kvstore_hit": part, "local_hit": part},
    }  # fmt: skip


def report(**ttfts) -> dict:
    refs = [{"blocks_per_call": 1, "socket_gb_s": 2.0, "memcpy_gb_s": 10.0}]
    rows = [{"pool": "kvstore dram", "blocks_per_call": 1, "put_gb_s": 0.5, "get_gb_s": 1.0}]
    return {"throughput": rows, "references": refs, **ttfts}


def test_the_baseline_blocks_follow_the_measured_one():
    text = format_table(
        report(ttft={**ttft(1984, 2.9), "engine_local_hit": 7.5},
               ttft_decode_from_pool=ttft(1968, 3.1), ttft_decode_sent_whole=ttft(0, 94.4))
    )  # fmt: skip
    first, from_pool, whole = text.split("TTFT of a 2,048-token prompt")[1:]
    assert "its floor): 7.5" in first and "floor" not in from_pool + whole
    assert "from the pool" in from_pool and "1968" in from_pool
    assert "sent whole" in whole and "94.4" in whole and "94.4" not in first + from_pool
    assert "0.50" in text  # the put's rate over the socket's


def test_without_ttft_only_the_throughput():
    assert "TTFT" not in format_table(report())
