"""The runs of `loadgen sim sweep`: every (trace, policy, load) of a grid simulated once,
and on request each (trace, policy)'s capacity, found by `sweep.py`'s search. Runs go to
worker processes; each is deterministic, so the results do not depend on how many.

A load is a replay speed relative to the trace's own (2.0: arrivals twice as fast, the
`loadgen sim --time-scale 0.5` run). Each run is reduced to a few numbers (`run_summary`)
in the worker: the sweep never holds a run's records.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import partial
from typing import Any

from loadgen.sim.args import cost_model, sim_config
from loadgen.sim.sweep import DEFAULT_BOUNDS, DEFAULT_TOLERANCE, SAMPLE_INTERVAL, Probe, Sweep
from loadgen.trace import load_trace
from shared.errors import KvstackError


@dataclass(frozen=True)
class GridPoint:
    trace: str
    policy: str
    load: float  # replay speed, x the trace's own

    @property
    def time_scale(self) -> float:
        return 1 / self.load


def grid_points(
    traces: Sequence[str], policies: Sequence[str], loads: Sequence[float]
) -> list[GridPoint]:
    """Trace by trace, policy by policy, from the lightest load up."""
    return [GridPoint(t, p, load) for t in traces for p in policies for load in sorted(loads)]


def one_run_args(
    args: argparse.Namespace, trace: str, policy: str, **more: Any
) -> argparse.Namespace:
    """The sweep's flags as one `loadgen sim` run's (the load series sampled seldom: it is
    not kept, and one sample interval for grid and capacity runs makes them the same)."""
    return argparse.Namespace(
        **{
            **vars(args),
            "trace": trace,
            "policy": policy,
            "duration": None,
            "sample_interval": SAMPLE_INTERVAL,
            **more,
        }
    )


def run_point(args: argparse.Namespace, point: GridPoint) -> dict:
    """Simulate one point of the grid (in a worker process) and summarise it."""
    from loadgen.sim.report import build_sim_result  # the simulation loads torch
    from loadgen.sim.runner import Simulation

    started = time.perf_counter()
    one = one_run_args(args, point.trace, point.policy, time_scale=point.time_scale)
    cost, spec = cost_model(one)
    config = sim_config(one, cost, spec)
    rows = load_trace(point.trace, args.max_requests, None, point.time_scale)
    result = build_sim_result(Simulation(rows, config, cost).run(), rows, config, {}, {})
    return {
        "trace": point.trace,
        "policy": point.policy,
        "load": point.load,
        "time_scale": point.time_scale,
        **run_summary(result),
        "wall_seconds": time.perf_counter() - started,
    }


def run_summary(result: dict) -> dict:
    """A `loadgen sim` result's numbers that the sweep compares. SLO attainment and TBT
    are Mooncake's (`mooncake_slo`); goodput is the requests meeting both SLOs a second."""
    sim = result["sim"]
    slo, hits = sim["mooncake_slo"], sim["hit_ratio"]
    summary = {
        "mean_ttft_s": result["mean_ttft_ms"] / 1000,
        "p90_ttft_s": result["p90_ttft_ms"] / 1000,
        "mean_tbt_ms": slo["mean_tbt_ms"],
        "p90_tbt_ms": slo["p90_tbt_ms"],
        "slo_attainment": slo["slo_attainment"],
        "goodput_rps": slo["slo_attainment"] * result["num_prompts"] / result["duration"],
        "requests": result["num_prompts"],
        "completed": result["completed"],
        "rejected": sim["rejected"],
        "wasted_prefills": sim["wasted_prefill"]["requests"],
        "hit_local": hits["local"],
        "hit_global": hits["global"],
        "hit_ceiling": hits["ceiling"],
    }
    if "estimates" in sim:
        summary["estimates"] = sim["estimates"]
    return summary


def probe_of(run: dict, slo_tbt: float) -> Probe:
    """A grid run as the capacity search's probe of its time scale."""
    return Probe(
        run["time_scale"],
        {slo_tbt: run["slo_attainment"]},
        run["mean_ttft_s"],
        run["p90_ttft_s"],
        run["p90_tbt_ms"],
        run["rejected"],
        run["wall_seconds"],
    )


def search_start(runs: Sequence[dict], target: float) -> float:
    """The time scale of the fastest load that met the target, else of the slowest load:
    the capacity lies beside it, and its run is done already."""
    met = [run for run in runs if run["slo_attainment"] >= target]
    start = max(met, key=lambda r: r["load"]) if met else min(runs, key=lambda r: r["load"])
    return min(max(start["time_scale"], DEFAULT_BOUNDS[0]), DEFAULT_BOUNDS[1])


def run_capacity(args: argparse.Namespace, trace: str, policy: str, runs: list[dict]) -> dict:
    """The fastest replay of `trace` under `policy` with attainment >= args.target, by
    `sweep.py`'s search started beside it, the grid's runs given (in a worker process)."""
    started = time.perf_counter()
    one = one_run_args(
        args,
        trace,
        policy,
        slo_tbt=[args.slo_tbt],
        time_scale=search_start(runs, args.target),
        tolerance=DEFAULT_TOLERANCE,
        min_time_scale=DEFAULT_BOUNDS[0],
        max_time_scale=DEFAULT_BOUNDS[1],
    )
    sweep = Sweep(one)
    for run in runs:
        sweep.add_known(probe_of(run, args.slo_tbt))
    capacity = sweep.capacity(args.slo_tbt)
    return {
        "trace": trace,
        "policy": policy,
        "speed": capacity.speed,
        "time_scale": capacity.sustained,
        "failed_time_scale": capacity.failed,
        "simulations": len(sweep.probes) - len(runs),
        "wall_seconds": time.perf_counter() - started,
    }


def run_all(
    calls: Sequence[Callable[[], dict]], jobs: int, finished: Callable[[dict], None]
) -> list[dict]:
    """Each call's result in the calls' order, whatever order they finish in; `finished`
    hears of each as it finishes. `jobs` processes (1: in this one)."""
    if jobs <= 1 or len(calls) <= 1:
        return [_tell(call(), finished) for call in calls]
    results: list[dict | None] = [None] * len(calls)
    with ProcessPoolExecutor(max_workers=min(jobs, len(calls))) as pool:
        futures = {pool.submit(call): i for i, call in enumerate(calls)}
        for future in as_completed(futures):
            results[futures[future]] = _tell(future.result(), finished)
    return [r for r in results if r is not None]


def _tell(result: dict, finished: Callable[[dict], None]) -> dict:
    finished(result)
    return result


def grid_calls(args: argparse.Namespace, points: Sequence[GridPoint]) -> list[partial]:
    return [partial(run_point, args, point) for point in points]


def capacity_calls(args: argparse.Namespace, runs: Sequence[dict]) -> list[partial]:
    """One search per (trace, policy), each given that pair's grid runs."""
    pairs = list(dict.fromkeys((run["trace"], run["policy"]) for run in runs))
    if not pairs:
        raise KvstackError("no grid runs to start the capacity searches from")
    return [
        partial(
            run_capacity,
            args,
            trace,
            policy,
            [r for r in runs if (r["trace"], r["policy"]) == (trace, policy)],
        )
        for trace, policy in pairs
    ]
