"""`python -m bench failover` runs end to end on a real nats-server (a few placements, one
takeover) and reports every number it promises."""

from __future__ import annotations

import orjson

from bench.cli import main


def test_the_failover_bench_reports_record_cost_and_takeover(capsys) -> None:
    args = ["failover", "--placements", "20", "--rounds", "1", "--lease-ttl", "0.5", "--json"]
    assert main(args) == 0
    result = orjson.loads(capsys.readouterr().out)
    for name in ("round_trip_ms", "record_ms", "takeover_s"):
        assert 0 < result[name]["p50"] <= result[name]["max"], result
