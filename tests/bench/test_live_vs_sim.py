"""`python -m bench live-vs-sim`'s two command lines and its table, without a stack: the
live side is `kvstack up`'s own flags, the sim side runs on the bundled slice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.live_vs_sim import cli, live, sim
from bench.live_vs_sim.live import LiveRun
from bench.live_vs_sim.replay import Replay, Summary
from loadgen.trace import load_trace
from services.cli import up
from services.cli.main import build_parser


def test_the_bundled_slice_holds_the_default_replay() -> None:
    assert len(load_trace(Replay().trace)) >= Replay().max_requests


def test_the_live_stack_is_kvstack_up_with_the_replays_shape(tmp_path: Path) -> None:
    argv = live.up_argv(Replay(), "cache-aware", 8123, tmp_path)
    config = up.stack_config(build_parser().parse_args(argv))
    assert (config.num_prefill, config.num_decode, config.num_kvstore) == (4, 4, 1)
    assert config.mock is not None and config.mock.cost_spec == "roofline:llama3-70b:a800"
    assert "cache-aware" in config.conductor_args and config.insecure


def test_the_sim_replays_the_same_slice_with_the_live_pool_sizes(tmp_path: Path) -> None:
    replay = Replay(max_requests=10)
    out = tmp_path / "sim.json"
    argv = sim.sim_argv(replay, "kvcentric", out)
    done = subprocess.run(
        [sys.executable, "-c", "from loadgen.cli import main; main()", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["completed"] == 10
    assert result["sim"]["kv_tokens_per_node"] == sim.worker_kv_tokens(replay) == 1_333_600
    assert result["sim"]["cache_tokens_per_node"] == 1_333_600


def test_the_table_says_where_live_and_sim_agree() -> None:
    def summary(mean_ttft: float) -> Summary:
        return Summary(10, 0, mean_ttft, mean_ttft, mean_ttft, 0.013, 0)

    idle = dict.fromkeys(live.PROBE_TOKENS, 0.1)
    rows = {
        "kvcentric": (LiveRun(summary(1.1), idle), summary(1.0)),
        "random": (LiveRun(summary(1.3), idle), summary(1.0)),
    }
    table = cli.format_table(rows, 0.15).splitlines()
    assert "| 1.10 | yes |" in table[2] and "| 1.30 | no |" in table[3]


def test_the_estimates_table_puts_each_estimate_live_beside_sim() -> None:
    error = lambda median, mean: {"median_abs_rel_error": median, "mean_rel_error": mean}
    live_side = Summary(10, 0, 1.0, 1.0, 1.0, 0.013, 0, {"queue": error(0.2, -0.1)})
    sim_side = Summary(10, 0, 1.0, 1.0, 1.0, 0.013, 0, {"queue": error(0.0, 0.0)})
    rows = {"kvcentric": (LiveRun(live_side, dict.fromkeys(live.PROBE_TOKENS, 0.1)), sim_side)}
    header, _, row = cli.format_estimates(rows).splitlines()
    assert header.startswith("| policy | queue live | queue sim | transfer live |")
    assert row.startswith("| kvcentric | 20% (-10%) | 0% (+0%) | - | - |")
