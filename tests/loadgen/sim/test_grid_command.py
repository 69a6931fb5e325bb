"""`loadgen sim sweep` end to end on small traces: the grid's runs, their summary, the
capacities, and that the number of processes changes nothing."""

from __future__ import annotations

import json

import pytest

from loadgen.cli import main
from loadgen.sim.grid import search_start
from tests.loadgen.sim.builders import conversations, write_trace


@pytest.fixture
def traces(tmp_path):
    return [
        write_trace(tmp_path / "a.jsonl", conversations(40, rate=4.0)),
        write_trace(tmp_path / "b.jsonl", conversations(30, rate=4.0, seed=1)),
    ]


def sweep(traces, out, *more: str) -> int:
    args = ["sim", "sweep", "--prefill", "1", "--decode", "1", "--slo-ttft", "2"]
    args += ["--policies", "load-balance,kvcentric", "--loads", "0.5,2", "--quiet"]
    for trace in traces:
        args += ["--trace", str(trace)]
    return main([*args, "--output-dir", str(out), *more])


def without_wall_times(summary: dict) -> dict:
    return {
        **{k: v for k, v in summary.items() if k != "wall_seconds"},
        "runs": [{k: v for k, v in r.items() if k != "wall_seconds"} for r in summary["runs"]],
        "capacities": [
            {k: v for k, v in c.items() if k != "wall_seconds"} for c in summary["capacities"]
        ],
    }


def test_the_sweep_runs_the_grid_and_does_not_depend_on_jobs(traces, tmp_path, capsys):
    assert sweep(traces, tmp_path / "one", "--jobs", "1", "--capacity", "--plot") == 0
    printed = capsys.readouterr().out
    assert sweep(traces, tmp_path / "two", "--jobs", "2", "--capacity") == 0
    one = json.loads((tmp_path / "one" / "sweep.json").read_text())
    two = json.loads((tmp_path / "two" / "sweep.json").read_text())
    assert without_wall_times(one) == without_wall_times(two)
    runs = one["runs"]
    assert [(r["policy"], r["load"]) for r in runs[:4]] == [
        ("load-balance", 0.5),
        ("load-balance", 2.0),
        ("kvcentric", 0.5),
        ("kvcentric", 2.0),
    ]
    assert len(runs) == 8 and {r["requests"] for r in runs} == {40, 30}
    assert all(0 <= r["slo_attainment"] <= 1 and r["hit_global"] <= r["hit_ceiling"] for r in runs)
    assert {(c["trace"], c["policy"]) for c in one["capacities"]} == {
        (str(t), p) for t in traces for p in ("load-balance", "kvcentric")
    }
    assert [t["name"] for t in one["traces"]] == ["a", "b"] and one["traces"][0]["verdict"]
    assert (tmp_path / "one" / "a-sweep.png").is_file()
    assert (
        "## a: 40 requests" in printed and "| mean TTFT (s) | load-balance | kvcentric |" in printed
    )
    assert "verdict (a):" in printed and "| capacity | load-balance | kvcentric |" in printed


def test_the_capacity_search_starts_beside_the_fastest_load_that_met_the_target():
    runs = [
        {"load": 1.0, "time_scale": 1.0, "slo_attainment": 0.99},
        {"load": 2.0, "time_scale": 0.5, "slo_attainment": 0.95},
        {"load": 4.0, "time_scale": 0.25, "slo_attainment": 0.5},
    ]
    assert search_start(runs, 0.9) == 0.5
    assert search_start(runs, 0.999) == 1.0  # none met: the slowest load's


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policies", "kvcentric,fastest"], "--policies"),
        (["--loads", "0,1"], "--loads"),
        (["--plot"], "--output-dir"),
        (["--max-requests", "0"], "no requests"),
        (["--trace", "missing.jsonl"], "trace file not found"),
        (["--colocated", "2", "--prefill", "0", "--decode", "0"], "no KV pool"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(traces, capsys, args, message):
    argv = ["sim", "sweep", "--trace", str(traces[0]), "--prefill", "1", "--decode", "1"]
    assert main([*argv, "--quiet", *args]) == 2
    assert message in capsys.readouterr().err


def test_the_help_of_sim_names_the_sweep_and_the_sweep_has_its_own(capsys):
    for argv in (["sim", "-h"], ["sim", "sweep", "-h"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0
    helps = capsys.readouterr().out
    assert "loadgen sim sweep --trace FILE" in helps and "usage: loadgen sim sweep [-h]" in helps
    assert "--loads X,Y,..." in helps and "--time-scale X" in helps
