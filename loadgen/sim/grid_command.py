"""`loadgen sim sweep`: replay traces under several policies at several loads (replay
speeds), in parallel processes; print a table per metric and trace, each policy's
capacity under the SLOs (`--capacity`), and a verdict on kvcentric (`grid_table.py`);
write one small summary JSON and a plot per trace. See docs/simulator.md."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from loadgen.sim.args import add_cluster_args, add_scheduling_args, cost_model, sim_config
from loadgen.sim.grid import capacity_calls, grid_calls, grid_points, run_all
from loadgen.sim.grid_table import Check, capacity_table, trace_tables, verdict, verdict_line
from loadgen.sim.sweep import DEFAULT_TARGET
from loadgen.trace import load_trace
from shared.conductor.config import POLICY_NAMES
from shared.errors import KvstackError

DEFAULT_POLICIES = ("random", "load-balance", "cache-aware", "kvcentric")
DEFAULT_LOADS = (0.5, 1.0, 1.5, 2.0, 3.0)
SUMMARY_FILE = "sweep.json"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="policies x loads x traces: tables, capacities, plots",
        description="Replay each --trace under each of --policies at each of --loads "
        "(replay speeds), one `loadgen sim` run per point, in --jobs processes; print a "
        "table per metric (a row per load, a column per policy, the best bolded), with "
        "--capacity each policy's fastest replay meeting the SLOs, and a verdict on "
        "kvcentric. Takes `loadgen sim`'s cluster and scheduling flags.",
    )
    g = p.add_argument_group("grid")
    g.add_argument(
        "--trace",
        action="append",
        required=True,
        metavar="FILE",
        help="a Mooncake trace (JSONL); repeat for several",
    )
    g.add_argument(
        "--policies",
        type=comma_list,
        default=DEFAULT_POLICIES,
        metavar="A,B,...",
        help=f"placement policies (default {','.join(DEFAULT_POLICIES)})",
    )
    g.add_argument(
        "--loads",
        type=comma_floats,
        default=DEFAULT_LOADS,
        metavar="X,Y,...",
        help="replay speeds, x the trace's own (2: arrivals twice as fast, `loadgen sim "
        f"--time-scale 0.5`; default {','.join(f'{x:g}' for x in DEFAULT_LOADS)})",
    )
    g.add_argument(
        "--max-requests",
        type=int,
        metavar="N",
        help="replay each trace's first N requests (the same ones at every load)",
    )
    g.add_argument("--seed", type=int, default=0, help="varies the random policy's choices")
    add_cluster_args(p.add_argument_group("cluster"))
    add_scheduling_args(p.add_argument_group("scheduling (the conductor's)"), with_policy=False)
    add_capacity_args(p.add_argument_group("capacity"))
    add_output_args(p.add_argument_group("output"))
    p.set_defaults(run=run)


def add_capacity_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--capacity",
        action="store_true",
        help="also find each policy's capacity on each trace: the fastest replay with "
        "SLO attainment >= --target (bisection, `loadgen sim-sweep`'s search)",
    )
    g.add_argument(
        "--target",
        type=float,
        default=DEFAULT_TARGET,
        help=f"share of requests sent that must meet both SLOs (default {DEFAULT_TARGET})",
    )


def add_output_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="simulations at once, each a process (default: the CPUs, here "
        f"{os.cpu_count()}); the results do not depend on it",
    )
    g.add_argument("--output-dir", metavar="DIR", help=f"write {SUMMARY_FILE} (and the plots) here")
    g.add_argument("--plot", action="store_true", help="a PNG per trace in --output-dir")
    g.add_argument(
        "--verdict-tolerance",
        type=float,
        default=0.0,
        metavar="R",
        help="the verdict lets kvcentric be this much worse (relative) than the best "
        "other policy (default 0)",
    )
    g.add_argument("--quiet", action="store_true", help="no progress on stderr")


def comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def comma_floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(item) for item in comma_list(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas: {text}") from None


def check_args(args: argparse.Namespace) -> None:
    unknown = [p for p in args.policies if p not in POLICY_NAMES]
    if unknown or not args.policies:
        raise KvstackError(f"--policies: choose from {', '.join(POLICY_NAMES)} (got {unknown})")
    if not args.loads or min(args.loads) <= 0:
        raise KvstackError("--loads: give positive replay speeds")
    if not 0 < args.target <= 1:
        raise KvstackError(f"--target is a share of requests in (0, 1], got {args.target}")
    if args.plot and not args.output_dir:
        raise KvstackError("--plot writes into --output-dir: give it")
    if args.jobs < 1:
        raise KvstackError(f"--jobs must be at least 1, got {args.jobs}")
    cost, spec = cost_model(args)
    for policy in args.policies:  # a bad cluster or policy fails here, not in a worker
        sim_config(argparse.Namespace(**{**vars(args), "policy": policy}), cost, spec)


def trace_names(paths: list[str]) -> dict[str, str]:
    """Each trace's file stem, numbered where stems repeat."""
    stems = [Path(p).stem for p in paths]
    counts = Counter(stems)
    return {p: f"{s}-{i + 1}" if counts[s] > 1 else s for i, (p, s) in enumerate(zip(paths, stems))}


def trace_facts(path: str, max_requests: int | None) -> dict:
    """Requests replayed and their rate at 1x (which also checks the trace, before any run)."""
    rows = load_trace(path, max_requests)
    if not rows:
        raise KvstackError(f"{path}: no requests to replay (is --max-requests 0?)")
    span = rows[-1].timestamp
    return {"requests": len(rows), "rate_rps": len(rows) / span if span > 0 else 0.0}


class Progress:
    """One line per finished run on stderr, with an estimate of the time left."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.done, self.quiet = total, 0, quiet
        self.started = time.perf_counter()

    def say(self, message: str) -> None:
        if not self.quiet:
            print(f"[sweep] {message}", file=sys.stderr, flush=True)

    def run_done(self, run: dict) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.started
        eta = elapsed / self.done * (self.total - self.done)
        self.say(
            f"{self.done}/{self.total} {Path(run['trace']).stem} {run['policy']} "
            f"{run['load']:g}x: TTFT mean {run['mean_ttft_s']:.2f} s, p90 "
            f"{run['p90_ttft_s']:.2f} s, attainment {run['slo_attainment']:.1%} "
            f"[{run['wall_seconds']:.1f} s]; ETA {eta:.0f} s"
        )

    def capacity_done(self, capacity: dict) -> None:
        speed = capacity["speed"]
        self.say(
            f"capacity {Path(capacity['trace']).stem} {capacity['policy']}: "
            f"{'none found' if speed is None else f'{speed:.3g}x'} "
            f"({capacity['simulations']} more runs, {capacity['wall_seconds']:.0f} s)"
        )


def run(args: argparse.Namespace) -> int:
    check_args(args)
    started = time.perf_counter()
    facts = {path: trace_facts(path, args.max_requests) for path in args.trace}
    points = grid_points(args.trace, args.policies, args.loads)
    progress = Progress(len(points), args.quiet)
    traces = f"{len(args.trace)} trace{'s' if len(args.trace) > 1 else ''}"
    progress.say(f"{len(points)} runs ({traces}), {args.jobs} at once")
    runs = run_all(grid_calls(args, points), args.jobs, progress.run_done)
    capacities = []
    if args.capacity:
        progress.say(f"capacity searches: {len(args.trace) * len(args.policies)}")
        capacities = run_all(capacity_calls(args, runs), args.jobs, progress.capacity_done)
    summary = sweep_summary(args, facts, runs, capacities, time.perf_counter() - started)
    print(format_sweep(summary))
    write_outputs(summary, args)
    return 0


def sweep_summary(
    args: argparse.Namespace,
    facts: dict[str, dict],
    runs: list[dict],
    capacities: list[dict],
    wall_seconds: float,
) -> dict:
    names = trace_names(args.trace)
    traces = [{"path": path, "name": name, **facts[path]} for path, name in names.items()]
    for trace in traces:
        mine = [r for r in runs if r["trace"] == trace["path"]]
        trace["reuse_ceiling"] = max((r["hit_ceiling"] for r in mine), default=0.0)
        checks = verdict(
            mine, [c for c in capacities if c["trace"] == trace["path"]], args.verdict_tolerance
        )
        trace["verdict"] = [asdict(c) for c in checks]
    return {
        "kind": "sim-sweep-grid",
        "policies": list(args.policies),
        "loads": sorted(args.loads),
        "cluster": cluster_facts(args),
        "scheduling": {
            "admission": args.admission,
            "slo_ttft_s": args.slo_ttft,
            "slo_tbt_s": args.slo_tbt,
            "balancing_threshold": args.balancing_threshold,
            "decode_time": args.decode_time,
        },
        "target": args.target,
        "max_requests": args.max_requests,
        "seed": args.seed,
        "traces": traces,
        "runs": runs,
        "capacities": capacities,
        "wall_seconds": wall_seconds,
    }


def cluster_facts(args: argparse.Namespace) -> dict:
    _, spec = cost_model(args)
    keys = ("prefill", "decode", "colocated", "cache_tokens", "kv_tokens", "heartbeat_interval")
    return {
        **{key: getattr(args, key) for key in keys},
        "cost_model": spec,
        "pool": not (args.no_pool or args.local_prefix_only or args.colocated),
        "local_prefix_only": args.local_prefix_only,
    }


def format_sweep(summary: dict) -> str:
    policies, parts = summary["policies"], []
    for trace in summary["traces"]:
        runs = [r for r in summary["runs"] if r["trace"] == trace["path"]]
        parts.append(
            f"## {trace['name']}: {trace['requests']:,} requests, {trace['rate_rps']:.2f} "
            f"req/s at 1x, reuse ceiling {trace['reuse_ceiling']:.3f}\n\n"
            + trace_tables(runs, policies)
            + "\n\n"
            + verdict_line(trace["name"], [Check(**c) for c in trace["verdict"]])
        )
    if summary["capacities"]:
        names = {t["path"]: t["name"] for t in summary["traces"]}
        rates = {t["path"]: t["rate_rps"] for t in summary["traces"]}
        parts.append(
            f"## capacity: the fastest replay with SLO attainment >= {summary['target']:.0%}"
            "\n\n" + capacity_table(summary["capacities"], rates, names, policies)
        )
    return "\n\n".join(parts)


def write_outputs(summary: dict, args: argparse.Namespace) -> None:
    if not args.output_dir:
        return
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / SUMMARY_FILE
    path.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"result: {path}", file=sys.stderr)
    if args.plot:
        from loadgen.sim.grid_plot import plot_trace  # matplotlib loads only when plotting

        for trace in summary["traces"]:
            runs = [r for r in summary["runs"] if r["trace"] == trace["path"]]
            capacities = [c for c in summary["capacities"] if c["trace"] == trace["path"]]
            png = out / f"{trace['name']}-sweep.png"
            plot_trace(trace["name"], runs, capacities, summary["policies"], summary["target"], png)
            print(f"plot: {png}", file=sys.stderr)
