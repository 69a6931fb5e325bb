"""`loadgen sim`: replay a Mooncake trace on a simulated cluster, in virtual time;
`loadgen sim sweep` (`grid_command.py`): many such replays, policies x loads x traces.

The parser imports little: the simulation (the conductor, and through its messages torch)
loads only when `sim` runs, so other loadgen commands start fast."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from loadgen.output import save_result
from loadgen.records import RequestRecord
from loadgen.sim import grid_command
from loadgen.sim.args import (
    add_cluster_args,
    add_scheduling_args,
    add_trace_args,
    cluster_name,
    cost_model,
    sim_config,
)
from loadgen.sim.config import SimConfig
from loadgen.trace import load_trace
from shared.errors import KvstackError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sim",
        help="replay a trace on a simulated cluster (virtual time); `sim sweep`: a grid",
        usage="%(prog)s --trace FILE [options]\n       %(prog)s sweep --trace FILE ... [options]",
        description="Replay a Mooncake trace on a simulated cluster of "
        "prefill, decode and kvstore nodes (or colocated ones), "
        "in virtual time, through the conductor's own policy "
        "and admission code. `loadgen sim sweep` replays traces under "
        "several policies and loads (see `loadgen sim sweep -h`). "
        "See docs/simulator.md.",
    )
    add_trace_args(p.add_argument_group("trace"), required=False)
    add_cluster_args(p.add_argument_group("cluster"))
    add_scheduling_args(p.add_argument_group("scheduling (the conductor's)"))
    g = p.add_argument_group("output")
    g.add_argument("--output-json", metavar="PATH", help="write the result document here")
    g.add_argument(
        "--records",
        metavar="PATH",
        help="write every request's record here, as columns (.npz; the JSON has none)",
    )
    g.add_argument(
        "--records-itl",
        action="store_true",
        help="put every gap between tokens in the --records file too (large)",
    )
    g.add_argument("--plot-dir", metavar="DIR", help="write PNG plots here")
    g.add_argument("--label", help="names the run (default: policy/admission/cluster)")
    g.add_argument(
        "--sample-interval",
        type=float,
        default=1.0,
        metavar="S",
        help="virtual seconds between load samples (default 1)",
    )
    g.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(run=run)
    commands = p.add_subparsers(
        title="commands", metavar="COMMAND", dest="sim_command", prog="loadgen sim"
    )
    grid_command.add_parser(commands)


def run(args: argparse.Namespace) -> int:
    from loadgen.sim.report import record_of, sim_result
    from loadgen.sim.runner import Simulation

    check_args(args)
    cost, spec = cost_model(args)
    config = sim_config(args, cost, spec)
    rows = load_trace(args.trace, args.max_requests, args.duration, args.time_scale)
    if not rows:
        raise KvstackError("no requests to replay (is --duration or --max-requests too small?)")
    progress = None if args.quiet else (lambda m: print(f"[sim] {m}", file=sys.stderr, flush=True))
    if progress:
        progress(
            f"{len(rows)} requests on {cluster_name(config)}, "
            f"{config.scheduling.policy}/{config.scheduling.admission}, {spec}"
        )
    outcome = Simulation(rows, config, cost, progress).run()
    records = [record_of(job) for job in outcome.jobs]
    result = sim_result(
        outcome,
        rows,
        records,
        config,
        run_meta(args, config, spec),
        {"cost_model": spec, "trace": str(args.trace), "time_scale": args.time_scale},
    )
    print(format_sim(result))
    write_outputs(result, records, args)
    return 0


def check_args(args: argparse.Namespace) -> None:
    if not args.trace:
        raise KvstackError("give --trace FILE (or run `loadgen sim sweep`)")
    if args.records_itl and not args.records:
        raise KvstackError("--records-itl adds to the --records file: give --records PATH")


def run_meta(args: argparse.Namespace, config: SimConfig, spec: str) -> dict:
    """The keys `loadgen run` writes, for a simulated backend."""
    label = (
        args.label
        or f"sim-{config.scheduling.policy}-{config.scheduling.admission}-"
        f"{cluster_name(config).replace(' ', '-')}"
    )
    return {
        "backend": "kvstack-sim",
        "endpoint_type": "sim",
        "label": label,
        "model_id": spec,
        "tokenizer_id": None,
        "dataset": {
            "name": "mooncake-trace",
            "dataset_path": str(args.trace),
            "max_requests": args.max_requests,
            "duration": args.duration,
            "time_scale": args.time_scale,
        },
        "request_rate": "trace",
        "burstiness": None,
        "max_concurrency": None,
        "seed": args.seed,
    }


def format_sim(result: dict) -> str:
    sim = result["sim"]
    hits, wasted, slo = sim["hit_ratio"], sim["wasted_prefill"], sim["mooncake_slo"]
    lines = [
        (
            f"{result['label']}: {result['completed']} of {result['num_prompts']} done in "
            f"{sim['virtual_seconds']:,.0f} virtual s ({sim['wall_seconds']:.1f} s wall)"
        ),
        (
            f"  TTFT mean {result['mean_ttft_ms'] / 1000:.2f} s, p90 "
            f"{result['p90_ttft_ms'] / 1000:.2f} s; TBT (slowest 10%) mean "
            f"{slo['mean_tbt_ms']:.0f} ms, p90 {slo['p90_tbt_ms']:.0f} ms"
        ),
        (
            f"  SLO attainment {slo['slo_attainment']:.1%} (TTFT <= {sim['slo_ttft_s']:g} s, "
            f"TBT <= {sim['slo_tbt_s'] * 1000:g} ms)"
        ),
        (
            f"  cache hits: local {hits['local']:.3f}, global {hits['global']:.3f}, "
            f"ceiling {hits['ceiling']:.3f}"
        ),
        (
            f"  rejected {sim['rejected']}, wasted prefills {wasted['requests']} "
            f"({wasted['seconds']:.1f} s)"
        ),
    ]
    return "\n".join(lines)


def write_outputs(result: dict, records: Sequence[RequestRecord], args: argparse.Namespace) -> None:
    if args.records:
        from loadgen.sim.records_file import save_records

        path = save_records(args.records, records, args.records_itl)
        result["sim"]["records_file"] = str(path)
        print(f"records: {path}", file=sys.stderr)
    if args.output_json:
        print(f"result: {save_result(result, args.output_json)}", file=sys.stderr)
    if args.plot_dir:
        for path in plot(result, records, Path(args.plot_dir)):
            print(f"plot: {path}", file=sys.stderr)


def plot(result: dict, records: Sequence[RequestRecord], out_dir: Path) -> list[Path]:
    from loadgen.plots import plot_run  # matplotlib loads only when plotting
    from loadgen.sim.plots import plot_load

    prefix = f"{result['label']}-"
    with_records = {**result, "records": [r.to_json() for r in records]}
    return plot_run(with_records, out_dir, prefix) + plot_load(result, out_dir, prefix)
