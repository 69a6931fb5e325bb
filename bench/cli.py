"""`python -m bench`: benchmarks that print numbers beside a baseline measured in the same
run (docs/benchmarks.md), and the chaos run (docs/reliability.md).

They start stacks, engines and data planes of their own, so they live beside the runtime,
not in it: run them from a checkout; the kvstack wheel does not ship them. Each benchmark
is a module with `add_parser(sub)`, which adds its subparser and sets `run=<function>`.
"""

from __future__ import annotations

import argparse

from bench import (
    cli_doc,
    colocated,
    conductor,
    decode_attention,
    decode_profile,
    engine,
    engine_thread,
    failover,
    fairness,
    gemv,
    gpu_step,
    grammar,
    kvstore,
    offload,
    prefill_phases,
    quant,
    random_model,
    sampling,
    step_phases,
    transfer,
)
from bench.chaos import cli as chaos
from bench.compose import cli as compose_chaos
from bench.live_vs_sim import cli as live_vs_sim
from bench.peers import cli as peers
from shared import cli

BENCHMARKS = (
    engine,
    engine_thread,
    decode_profile,
    step_phases,
    prefill_phases,
    gpu_step,
    gemv,
    decode_attention,
    quant,
    sampling,
    grammar,
    fairness,
    transfer,
    kvstore,
    conductor,
    failover,
    offload,
    colocated,
    chaos,
    compose_chaos,
    live_vs_sim,
    peers,
    random_model,
    cli_doc,
)


def build_parser() -> argparse.ArgumentParser:
    return cli.build_parser("python -m bench", __doc__.split("\n\n")[0], BENCHMARKS)


def main(argv: list[str] | None = None) -> int:
    return cli.run(build_parser(), argv)
