"""`python -m bench` lists every benchmark; `kvstack bench` points there."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.cli import build_parser
from services.cli.main import main as kvstack

BENCHMARKS = (
    "engine",
    "engine-thread",
    "quant",
    "gemv",
    "decode-profile",
    "step-phases",
    "prefill-phases",
    "fairness",
    "transfer",
    "kvstore",
    "conductor",
    "failover",
    "offload",
    "colocated",
    "chaos",
    "live-vs-sim",
    "peers",
)


def test_every_benchmark_is_a_command() -> None:
    for name in BENCHMARKS:
        args = build_parser().parse_args([name])
        assert args.command == name and callable(args.run)


def test_python_m_bench_runs_from_the_checkout() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert all(name in result.stdout for name in BENCHMARKS)


def test_kvstack_bench_says_where_the_benchmarks_went(capsys: pytest.CaptureFixture) -> None:
    assert kvstack(["bench", "engine", "--json"]) == 2
    err = capsys.readouterr().err
    assert "run `python -m bench engine --json` from a checkout" in err
