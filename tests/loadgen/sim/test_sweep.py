"""The capacity search: bracketing and bisection on known attainment curves, and the
command end to end on a small trace."""

from __future__ import annotations

import json

import pytest

from loadgen.cli import main
from loadgen.sim.sweep import bracket, find_capacity
from tests.loadgen.sim.builders import conversations, write_trace


def threshold_at(limit: float, calls: list[float]):
    """A cluster that sustains every time scale from `limit` up (slower replays)."""

    def sustains(scale: float) -> bool:
        calls.append(scale)
        return scale >= limit

    return sustains


@pytest.mark.parametrize("limit", [0.3, 0.8, 1.0, 3.7])
def test_the_search_ends_beside_the_limit_within_the_tolerance(limit):
    calls = []
    ok, failed = find_capacity(threshold_at(limit, calls), start=1.0, tolerance=0.01)
    assert failed < limit <= ok and ok / failed <= 1.01
    assert len(calls) == len(set(calls)) and len(calls) < 15


def test_bracketing_halves_while_sustained_and_doubles_while_not():
    calls = []
    assert bracket(threshold_at(0.3, calls), 1.0, 0.01, 100) == (0.5, 0.25)
    assert calls == [1.0, 0.5, 0.25]
    calls.clear()
    assert bracket(threshold_at(3.0, calls), 1.0, 0.01, 100) == (4.0, 2.0)
    assert calls == [1.0, 2.0, 4.0]


def test_the_bounds_end_the_search_with_one_side_unknown():
    assert find_capacity(lambda scale: True, 1.0, bounds=(0.25, 4.0)) == (0.25, None)
    assert find_capacity(lambda scale: False, 1.0, bounds=(0.25, 4.0)) == (None, 4.0)


@pytest.fixture
def trace(tmp_path):
    return write_trace(tmp_path / "trace.jsonl", conversations(40, rate=20.0))


def test_the_command_finds_a_capacity_whose_probes_bracket_the_target(trace, tmp_path):
    out, plot = tmp_path / "sweep.json", tmp_path / "sweep.png"
    code = main(
        [
            "sim-sweep",
            "--trace",
            str(trace),
            "--prefill",
            "1",
            "--decode",
            "1",
            "--slo-ttft",
            "1",
            "--slo-tbt",
            "0.1",
            "0.2",
            "--tolerance",
            "0.1",
            "--grid",
            "4",
            "--output-json",
            str(out),
            "--plot",
            str(plot),
            "--quiet",
        ]
    )
    assert code == 0 and plot.is_file()
    result = json.loads(out.read_text())
    by_scale = {p["time_scale"]: p for p in result["probes"]}
    assert 4.0 in by_scale
    for capacity in result["capacity"]:
        key = str(capacity["slo_tbt_s"])
        sustained, failed = capacity["time_scale"], capacity["failed_time_scale"]
        assert by_scale[sustained]["attainment"][key] >= 0.9
        assert by_scale[failed]["attainment"][key] < 0.9
        assert failed < sustained <= failed * 1.1
    # admission none: one simulation per time scale serves both TBT SLOs
    assert result["simulations"] == len(by_scale)
    assert all(set(p["attainment"]) == {"0.1", "0.2"} for p in result["probes"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "1.5"], "--target"),
        (["--time-scale", "0.001"], "outside"),
        (["--compare", "missing.json"], "no sweep result"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(trace, capsys, args, message):
    assert (
        main(
            [
                "sim-sweep",
                "--trace",
                str(trace),
                "--prefill",
                "1",
                "--decode",
                "1",
                "--quiet",
                *args,
            ]
        )
        == 2
    )
    assert message in capsys.readouterr().err
