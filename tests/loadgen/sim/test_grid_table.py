"""The sweep's tables and verdict, on made-up runs."""

from __future__ import annotations

from loadgen.sim.grid_table import (
    BY_KEY,
    Check,
    capacity_ratio,
    capacity_table,
    metric_table,
    shortfalls,
    trace_tables,
    ttft_gains,
    verdict,
    verdict_line,
)


def run(policy: str, load: float, mean: float, p90: float, met: float, **more) -> dict:
    return {
        "trace": "t.jsonl",
        "policy": policy,
        "load": load,
        "mean_ttft_s": mean,
        "p90_ttft_s": p90,
        "slo_attainment": met,
        "hit_ceiling": 0.6,
        **more,
    }


RUNS = [
    run("load-balance", 1, 2.0, 5.0, 0.99),
    run("cache-aware", 1, 1.8, 6.0, 0.99),
    run("kvcentric", 1, 1.5, 5.0, 0.995),
    run("load-balance", 2, 10.0, 30.0, 0.80),
    run("cache-aware", 2, 9.0, 25.0, 0.85),
    run("kvcentric", 2, 9.5, 24.0, 0.85),
]


def test_a_metric_table_has_a_row_per_load_and_bolds_the_best():
    table = metric_table(RUNS, BY_KEY["mean_ttft_s"], ["load-balance", "cache-aware", "kvcentric"])
    assert table.splitlines() == [
        "| mean TTFT (s) | load-balance | cache-aware | kvcentric |",
        "| --- | ---: | ---: | ---: |",
        "| 1x | 2.00 | 1.80 | **1.50** |",
        "| 2x | 10.00 | **9.00** | 9.50 |",
    ]
    attainment = metric_table(RUNS, BY_KEY["slo_attainment"], ["cache-aware", "kvcentric"])
    assert attainment.splitlines()[-1] == "| 2x | **85.0%** | **85.0%** |"  # ties both bolded
    near = [
        run("a", 1, 1.0, 1.0, 1.0, goodput_rps=3.891),
        run("b", 1, 1.0, 1.0, 1.0, goodput_rps=3.889),
    ]
    assert metric_table(near, BY_KEY["goodput_rps"], ["a", "b"]).endswith("| **3.89** | **3.89** |")


def test_a_metric_no_run_has_is_left_out_and_estimates_show_where_present():
    assert "TTFT est. err" not in trace_tables(RUNS, ["kvcentric"])
    with_estimate = [*RUNS[:2], {**RUNS[2], "estimates": {"ttft": {"median_abs_rel_error": 0.12}}}]
    table = trace_tables(with_estimate, ["load-balance", "kvcentric"])
    assert "| TTFT est. err (median |rel|) | load-balance | kvcentric |" in table
    assert "| 1x |  | 12.0% |" in table  # blank where a run has none


def test_shortfalls_name_each_metric_where_the_candidate_is_beaten():
    assert shortfalls(RUNS, "kvcentric", 0.0) == [
        "2x: mean TTFT (s) 9.50 vs 9.00 (cache-aware)",
    ]
    assert shortfalls(RUNS, "kvcentric", 0.06) == []  # within 6% of the best


def test_gains_over_the_baseline_and_the_capacity_ratio():
    gains = ttft_gains(RUNS, "kvcentric", "load-balance")
    assert gains == {1: 0.25, 2: 0.050000000000000044}
    capacities = [{"policy": "kvcentric", "speed": 1.8}, {"policy": "load-balance", "speed": 1.5}]
    assert capacity_ratio(capacities, "kvcentric", "load-balance") == 1.2
    assert capacity_ratio(capacities[:1], "kvcentric", "load-balance") is None


def test_the_verdict_checks_the_goal():
    capacities = [{"policy": "kvcentric", "speed": 2.0}, {"policy": "load-balance", "speed": 1.5}]
    checks = verdict(RUNS, capacities)
    assert [(c.goal, c.met) for c in checks] == [
        ("never worse than the best other policy", False),
        ("mean TTFT >= 15% below load-balance's", False),
        ("capacity >= 1.2x load-balance's", True),
    ]
    assert checks[1].detail == "5% to 25% lower; short at 2x: 5%"
    line = verdict_line("t", checks)
    assert line.startswith("verdict (t): NOT met. kvcentric never worse than the best other")


def test_the_gains_are_asked_only_where_reuse_is_high():
    low_reuse = [{**r, "hit_ceiling": 0.1} for r in RUNS]
    assert [c.goal for c in verdict(low_reuse, [])] == ["never worse than the best other policy"]
    assert verdict([r for r in RUNS if r["policy"] == "kvcentric"], []) == []
    assert verdict_line("t", []).startswith("verdict (t): none")
    assert verdict_line("t", [Check("g", True)]) == "verdict (t): met. kvcentric g: yes"


def test_the_capacity_table_shows_speed_rate_and_the_unbounded_ends():
    capacities = [
        {"trace": "a", "policy": "p", "speed": 2.0, "time_scale": 0.5, "failed_time_scale": 0.4},
        {"trace": "a", "policy": "q", "speed": None, "time_scale": None, "failed_time_scale": 4.0},
        {"trace": "b", "policy": "p", "speed": 64, "time_scale": 1 / 64, "failed_time_scale": None},
    ]
    table = capacity_table(capacities, {"a": 2.0, "b": 1.0}, {"a": "A", "b": "B"}, ["p", "q"])
    assert table.splitlines()[2:] == [
        "| A | **2x (4.00 req/s)** | < 0.25x |",
        "| B | **>= 64x (64.00 req/s)** |  |",
    ]
