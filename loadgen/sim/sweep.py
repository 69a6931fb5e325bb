"""`loadgen sim-sweep`: the fastest replay of a trace that a simulated cluster sustains
within its SLOs (Mooncake FAST §5.2's effective request capacity).

A cluster sustains a time scale when at least `--target` of the requests sent meet both
SLOs as the Mooncake papers count them (`loadgen.sim.report.mooncake_slo`: TTFT within its
SLO and TBT, the mean of a request's slowest 10% of gaps, within its SLO; a rejected
request meets neither). The search brackets the answer first, from `--time-scale`:
halving the time scale (replaying twice as fast) while the cluster sustains it, or
doubling it while it does not; then it bisects in log scale until the fastest sustained
and the slowest failed time scales are within `--tolerance` of each other. It takes
attainment to fall as the replay speeds up; every probe is in the output, to check that.

Each `--slo-tbt` gets its own search. Under admission `none` the TBT SLO changes only what
counts as met, not what the cluster does, so one simulation per time scale serves all of
them. `--grid` simulates more time scales (an attainment curve for the plot).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from loadgen.sim.args import (
    add_cluster_args,
    add_scheduling_args,
    add_trace_args,
    cluster_name,
    cost_model,
    sim_config,
)
from loadgen.trace import load_trace
from shared.errors import KvstackError

DEFAULT_TARGET = 0.9
DEFAULT_TOLERANCE = 0.02
DEFAULT_BOUNDS = (1 / 64, 64.0)  # time scales the search never goes beyond
SAMPLE_INTERVAL = 10.0  # the load series is not used: sample it seldom


@dataclass(frozen=True)
class Probe:
    """One simulation at one time scale, and what it attained under each TBT SLO."""

    time_scale: float
    attainment: dict[float, float]  # by TBT SLO (seconds)
    mean_ttft_s: float
    p90_ttft_s: float
    p90_tbt_ms: float  # Mooncake's TBT (slowest 10% of gaps), p90 over requests
    rejected: int
    wall_seconds: float


@dataclass(frozen=True)
class Capacity:
    slo_tbt: float
    sustained: float | None  # the fastest time scale sustained; None: none tried was
    failed: float | None  # the slowest time scale not sustained; None: none tried

    @property
    def speed(self) -> float | None:
        """Replay speed relative to the trace's own (2.0: twice as fast)."""
        return 1 / self.sustained if self.sustained else None


def bracket(
    sustains: Callable[[float], bool], start: float, fastest: float, slowest: float
) -> tuple[float | None, float | None]:
    """(a time scale sustained, a faster one not), half or double apart, searching from
    `start` within [fastest, slowest]; None where the bounds were reached first."""
    if sustains(start):
        ok = start
        while ok > fastest:
            scale = max(ok / 2, fastest)
            if not sustains(scale):
                return ok, scale
            ok = scale
        return ok, None
    failed = start
    while failed < slowest:
        scale = min(failed * 2, slowest)
        if sustains(scale):
            return scale, failed
        failed = scale
    return None, failed


def find_capacity(
    sustains: Callable[[float], bool],
    start: float = 1.0,
    tolerance: float = DEFAULT_TOLERANCE,
    bounds: tuple[float, float] = DEFAULT_BOUNDS,
) -> tuple[float | None, float | None]:
    """(the fastest time scale found sustained, the slowest found not), within
    `tolerance` (relative) of each other when both exist."""
    ok, failed = bracket(sustains, start, *bounds)
    if ok is None or failed is None:
        return ok, failed
    while ok / failed > 1 + tolerance:
        middle = math.sqrt(ok * failed)
        if sustains(middle):
            ok = middle
        else:
            failed = middle
    return ok, failed


class Sweep:
    """Simulates the trace at time scales on demand, each (time scale, TBT SLO) once."""

    def __init__(
        self, args: argparse.Namespace, progress: Callable[[str], None] | None = None
    ) -> None:
        self.args = args
        self.cost, self.spec = cost_model(args)
        self.slo_tbts: list[float] = list(args.slo_tbt)
        # Only admission reads the TBT SLO: without it, one run serves every threshold.
        self.shared = args.admission == "none"
        self.progress = progress
        self.probes: dict[tuple[float, float | None], Probe] = {}

    def attainment(self, time_scale: float, slo_tbt: float) -> float:
        return self.probe(time_scale, slo_tbt).attainment[slo_tbt]

    def probe(self, time_scale: float, slo_tbt: float) -> Probe:
        key = (time_scale, None if self.shared else slo_tbt)
        if key not in self.probes:
            self.probes[key] = self._simulate(time_scale, slo_tbt)
            self._report(self.probes[key])
        return self.probes[key]

    def add_known(self, probe: Probe) -> None:
        """A probe simulated elsewhere with the same flags (`loadgen sim sweep`'s grid),
        so that the search does not simulate its time scale again."""
        for slo_tbt in probe.attainment:
            self.probes[(probe.time_scale, None if self.shared else slo_tbt)] = probe

    def capacity(self, slo_tbt: float) -> Capacity:
        a = self.args
        sustained, failed = find_capacity(
            lambda scale: self.attainment(scale, slo_tbt) >= a.target,
            a.time_scale,
            a.tolerance,
            (a.min_time_scale, a.max_time_scale),
        )
        return Capacity(slo_tbt, sustained, failed)

    def _simulate(self, time_scale: float, slo_tbt: float) -> Probe:
        from loadgen.sim.report import mooncake_slo, record_of  # the simulation loads torch
        from loadgen.sim.runner import Simulation

        a = self.args
        one = argparse.Namespace(**{**vars(a), "time_scale": time_scale, "slo_tbt": slo_tbt})
        config = sim_config(one, self.cost, self.spec)
        rows = load_trace(a.trace, a.max_requests, a.duration, time_scale)
        if not rows:
            raise KvstackError("no requests to replay (is --duration or --max-requests too small?)")
        run = Simulation(rows, config, self.cost).run()
        records = [record_of(job) for job in run.jobs]
        thresholds = self.slo_tbts if self.shared else [slo_tbt]
        slos = {tbt: mooncake_slo(records, a.slo_ttft, tbt) for tbt in thresholds}
        ttfts = np.asarray([r.ttft for r in records if r.success] or [math.nan])
        return Probe(
            time_scale,
            {tbt: s["slo_attainment"] for tbt, s in slos.items()},
            float(ttfts.mean()),
            float(np.percentile(ttfts, 90)),
            slos[slo_tbt]["p90_tbt_ms"],
            sum(r.status == 503 for r in records),
            run.wall_seconds,
        )

    def _report(self, probe: Probe) -> None:
        if self.progress is None:
            return
        met = ", ".join(
            f"{value:.1%} (TBT {tbt * 1000:g} ms)" for tbt, value in probe.attainment.items()
        )
        self.progress(
            f"time scale {probe.time_scale:.4g} ({1 / probe.time_scale:.3g}x): "
            f"{met}; TTFT mean {probe.mean_ttft_s:.2f} s "
            f"[{probe.wall_seconds:.1f} s]"
        )


# -- the command -----------------------------------------------------------------------


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sim-sweep",
        conflict_handler="resolve",
        help="the fastest trace replay a simulated cluster sustains (SLOs)",
        description="Find the fastest replay (smallest --time-scale) of a "
        "trace at which a simulated cluster meets both SLOs for "
        "at least --target of the requests, by bracketing and "
        "bisection. Takes `loadgen sim`'s cluster and scheduling "
        "flags. See docs/experiments.md.",
    )
    add_trace_args(p.add_argument_group("trace"))
    add_cluster_args(p.add_argument_group("cluster"))
    add_scheduling_args(p.add_argument_group("scheduling (the conductor's)"))
    g = p.add_argument_group("search")
    g.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="where the search starts (default 1: the trace's own speed)",
    )
    g.add_argument(
        "--slo-tbt",
        type=float,
        nargs="+",
        default=[0.1],
        metavar="S",
        help="TBT SLOs in seconds, one search each (default 0.1)",
    )
    g.add_argument(
        "--target",
        type=float,
        default=DEFAULT_TARGET,
        help=f"share of requests that must meet both SLOs (default {DEFAULT_TARGET})",
    )
    g.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help=f"relative width the bisection stops at (default {DEFAULT_TOLERANCE})",
    )
    g.add_argument(
        "--min-time-scale",
        type=float,
        default=DEFAULT_BOUNDS[0],
        metavar="X",
        help="the fastest replay tried (default 1/64)",
    )
    g.add_argument(
        "--max-time-scale",
        type=float,
        default=DEFAULT_BOUNDS[1],
        metavar="X",
        help="the slowest replay tried (default 64)",
    )
    g.add_argument(
        "--grid",
        type=float,
        nargs="+",
        default=[],
        metavar="X",
        help="time scales to simulate as well (an attainment curve)",
    )
    g = p.add_argument_group("output")
    g.add_argument("--output-json", metavar="PATH", help="write the probes and capacities here")
    g.add_argument("--plot", metavar="PATH", help="attainment over replay speed (PNG)")
    g.add_argument(
        "--compare",
        nargs="+",
        default=[],
        metavar="JSON",
        help="earlier --output-json files to draw in the same plot",
    )
    g.add_argument("--label", help="names the sweep (default: policy and cluster)")
    g.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(run=run, sample_interval=SAMPLE_INTERVAL)


def check_args(args: argparse.Namespace) -> None:
    if not 0 < args.target <= 1:
        raise KvstackError(f"--target is a share of requests in (0, 1], got {args.target}")
    if args.tolerance <= 0:
        raise KvstackError(f"--tolerance must be positive, got {args.tolerance}")
    scales = [args.time_scale, args.min_time_scale, args.max_time_scale, *args.grid]
    if min(scales) <= 0 or min(args.slo_tbt) <= 0:
        raise KvstackError("time scales and TBT SLOs must be positive")
    if not args.min_time_scale <= args.time_scale <= args.max_time_scale:
        raise KvstackError(
            f"--time-scale {args.time_scale} is outside [--min-time-scale "
            f"{args.min_time_scale}, --max-time-scale {args.max_time_scale}]"
        )
    for path in args.compare:
        if not Path(path).is_file():
            raise KvstackError(f"--compare: no sweep result at {path}")


def run(args: argparse.Namespace) -> int:
    check_args(args)
    started = time.perf_counter()
    progress = (
        None if args.quiet else (lambda m: print(f"[sweep] {m}", file=sys.stderr, flush=True))
    )
    sweep = Sweep(args, progress)
    label = args.label or sweep_label(args, sweep)
    if progress:
        progress(
            f"{label}: attainment >= {args.target:.0%} (TTFT <= {args.slo_ttft:g} s), {sweep.spec}"
        )
    for scale in args.grid:
        for slo_tbt in sweep.slo_tbts:
            sweep.probe(scale, slo_tbt)
    capacities = [sweep.capacity(slo_tbt) for slo_tbt in sweep.slo_tbts]
    result = sweep_result(sweep, capacities, label, time.perf_counter() - started)
    print(format_capacities(result))
    write_outputs(result, args)
    return 0


def sweep_label(args: argparse.Namespace, sweep: Sweep) -> str:
    config = sim_config(
        argparse.Namespace(**{**vars(args), "slo_tbt": sweep.slo_tbts[0]}), sweep.cost, sweep.spec
    )
    return f"{config.scheduling.policy}-{cluster_name(config).replace(' ', '-')}"


def sweep_result(
    sweep: Sweep, capacities: Sequence[Capacity], label: str, wall_seconds: float
) -> dict:
    a = sweep.args
    probes = sorted(sweep.probes.values(), key=lambda p: p.time_scale)
    return {
        "kind": "sim-sweep",
        "label": label,
        "trace": str(a.trace),
        "cost_model": sweep.spec,
        "nodes": (
            {"colocated": a.colocated}
            if a.colocated
            else {"prefill": a.prefill, "decode": a.decode}
        ),
        "pool": not (a.no_pool or a.local_prefix_only or a.colocated),
        "local_prefix_only": a.local_prefix_only,
        "policy": a.policy or ("load-balance" if a.colocated else "kvcentric"),
        "admission": a.admission,
        "slo_ttft_s": a.slo_ttft,
        "target": a.target,
        "tolerance": a.tolerance,
        "max_requests": a.max_requests,
        "duration": a.duration,
        "capacity": [
            {
                "slo_tbt_s": c.slo_tbt,
                "time_scale": c.sustained,
                "speed": c.speed,
                "failed_time_scale": c.failed,
            }
            for c in capacities
        ],
        "probes": [
            {
                **asdict(p),
                "speed": 1 / p.time_scale,
                "attainment": {str(k): v for k, v in p.attainment.items()},
            }
            for p in probes
        ],
        "simulations": len(probes),
        "wall_seconds": wall_seconds,
    }


def format_capacities(result: dict) -> str:
    lines = [
        (
            f"{result['label']}: the fastest replay with >= {result['target']:.0%} of "
            f"requests within TTFT {result['slo_ttft_s']:g} s and the TBT SLO "
            f"({result['simulations']} simulations, {result['wall_seconds']:.0f} s)"
        )
    ]
    for c in result["capacity"]:
        tbt = f"TBT {c['slo_tbt_s'] * 1000:g} ms"
        if c["time_scale"] is None:
            lines.append(f"  {tbt}: not sustained even at time scale {c['failed_time_scale']:.4g}")
        elif c["failed_time_scale"] is None:
            lines.append(
                f"  {tbt}: sustained even at time scale {c['time_scale']:.4g} (the fastest tried)"
            )
        else:
            lines.append(
                f"  {tbt}: time scale {c['time_scale']:.4g} "
                f"({c['speed']:.3g}x the trace's speed); "
                f"{c['failed_time_scale']:.4g} fails"
            )
    return "\n".join(lines)


def write_outputs(result: dict, args: argparse.Namespace) -> None:
    if args.output_json:
        path = Path(args.output_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"result: {path}", file=sys.stderr)
    if args.plot:
        others = [json.loads(Path(p).read_text()) for p in args.compare]
        print(f"plot: {plot_sweeps([*others, result], Path(args.plot))}", file=sys.stderr)


def plot_sweeps(results: Sequence[dict], path: Path) -> Path:
    """Attainment over replay speed, a line per sweep and TBT SLO, the capacities marked."""
    from loadgen.plots import new_figure  # matplotlib loads only when plotting

    fig = new_figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.subplots()
    for result in results:
        _plot_sweep(ax, result)
    ax.axhline(results[-1]["target"], color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("replay speed (x the trace's; log scale)")
    ax.set_ylabel("requests meeting both SLOs")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return path


def _plot_sweep(ax, result: dict) -> None:
    """A line per TBT SLO; SLOs whose curves are the same (the TBT never bound) share one."""
    probes = sorted(result["probes"], key=lambda p: p["speed"])
    curves: dict[tuple, list[dict]] = {}
    for c in result["capacity"]:
        key = str(c["slo_tbt_s"])
        points = tuple((p["speed"], p["attainment"][key]) for p in probes if key in p["attainment"])
        curves.setdefault(points, []).append(c)
    for points, capacities in curves.items():
        tbts = "/".join(f"{c['slo_tbt_s'] * 1000:g}" for c in capacities)
        (line,) = ax.plot(*zip(*points), marker=".", label=f"{result['label']}, TBT {tbts} ms")
        for c in capacities:
            if c["speed"]:
                ax.axvline(c["speed"], color=line.get_color(), linestyle="--", linewidth=0.8)
