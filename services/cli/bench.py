"""`kvstack bench`: benchmarks that print numbers beside a baseline measured in the same run."""

from __future__ import annotations

import argparse

from services.cli import (
    bench_conductor,
    bench_engine,
    bench_fairness,
    bench_kvstore,
    bench_offload,
    bench_transfer,
)

BENCHMARKS = (
    bench_engine,
    bench_fairness,
    bench_transfer,
    bench_kvstore,
    bench_conductor,
    bench_offload,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark (see docs/benchmarks.md)")
    targets = p.add_subparsers(dest="target", required=True, metavar="TARGET")
    for bench in BENCHMARKS:
        bench.add_parser(targets)
