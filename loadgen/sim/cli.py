"""`loadgen sim`: replay a Mooncake trace on a simulated cluster, in virtual time.

The parser imports little: the simulation (the conductor, and through its messages torch)
loads only when `sim` runs, so other loadgen commands start fast."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loadgen.output import save_result
from loadgen.sim.config import (
    COLOCATED_POLICIES,
    DEFAULT_CACHE_TOKENS,
    HEARTBEAT_INTERVAL,
    SimConfig,
    node_kv_tokens,
)
from loadgen.trace import load_trace
from shared import setting
from shared.conductor.config import SchedulingConfig
from shared.conductor.settings import SCHEDULING_SETTINGS
from shared.costmodel import ROOFLINE_PREFIX, CostModel, from_spec, roofline
from shared.errors import KvstackError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sim",
        help="replay a trace on a simulated cluster (virtual time)",
        description="Replay a Mooncake trace on a simulated cluster of "
        "prefill, decode and kvstore nodes (or colocated ones), "
        "in virtual time, through the conductor's own policy "
        "and admission code. See docs/simulator.md.",
    )
    add_trace_args(p.add_argument_group("trace"))
    add_cluster_args(p.add_argument_group("cluster"))
    add_scheduling_args(p.add_argument_group("scheduling (the conductor's)"))
    g = p.add_argument_group("output")
    g.add_argument("--output-json", metavar="PATH", help="write the result document here")
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


def add_trace_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--trace", required=True, metavar="FILE", help="Mooncake trace (JSONL)")
    g.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="multiply arrival times (0.5: twice as fast)",
    )
    g.add_argument("--max-requests", type=int, metavar="N", help="replay the first N")
    g.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="replay arrivals before S seconds (after scaling)",
    )
    g.add_argument("--seed", type=int, default=0, help="varies the random policy's choices")


def add_cluster_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--prefill", type=int, default=0, metavar="N", help="prefill nodes")
    g.add_argument("--decode", type=int, default=0, metavar="M", help="decode nodes")
    g.add_argument(
        "--colocated",
        type=int,
        default=0,
        metavar="K",
        help="colocated (vLLM-like) nodes instead of prefill and decode ones",
    )
    g.add_argument("--model", default="llama3-70b", help="roofline model shape")
    g.add_argument("--hardware", default="a800", help="roofline hardware: one node")
    g.add_argument(
        "--cost-model",
        metavar="SPEC",
        help="roofline:<model>:<hw> or a `kvstack profile` file (overrides --model/--hardware)",
    )
    g.add_argument(
        "--cache-tokens",
        type=int,
        default=DEFAULT_CACHE_TOKENS,
        metavar="T",
        help=f"each node's DRAM prefix cache (default {DEFAULT_CACHE_TOKENS:,})",
    )
    g.add_argument(
        "--no-pool",
        action="store_true",
        help="no global pool (kvstore): prefill nodes load only from peers the conductor names",
    )
    g.add_argument(
        "--local-prefix-only",
        action="store_true",
        help="prefill nodes reuse only their own cache, whatever the conductor "
        "names (no pool, no peer): local-cache-only baselines",
    )
    g.add_argument(
        "--kv-tokens",
        type=int,
        metavar="T",
        help="KV tokens a decode node's HBM holds (default: HBM minus weights)",
    )
    g.add_argument(
        "--heartbeat-interval",
        type=float,
        default=HEARTBEAT_INTERVAL,
        metavar="S",
        help=f"seconds between heartbeats (default {HEARTBEAT_INTERVAL})",
    )


def add_scheduling_args(g: argparse._ArgumentGroup) -> None:
    """The live conductor's settings; only --policy's default differs (it depends on the
    cluster: round-robin for colocated nodes)."""
    policy_help = (
        f"default {SchedulingConfig().policy}; colocated: round-robin "
        f"(one of {', '.join(COLOCATED_POLICIES)})"
    )
    changes = {"policy": {"default": None, "help": policy_help}}
    setting.add(g, SCHEDULING_SETTINGS, SCHEDULING_SETTINGS, changes)


def run(args: argparse.Namespace) -> int:
    from loadgen.sim.report import build_sim_result
    from loadgen.sim.runner import Simulation

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
    result = build_sim_result(
        outcome,
        rows,
        config,
        run_meta(args, config, spec),
        {"cost_model": spec, "trace": str(args.trace), "time_scale": args.time_scale},
    )
    print(format_sim(result))
    write_outputs(result, args)
    return 0


def cost_model(args: argparse.Namespace) -> tuple[CostModel, str]:
    if args.cost_model:
        return from_spec(args.cost_model), args.cost_model
    return roofline(args.model, args.hardware), f"{ROOFLINE_PREFIX}{args.model}:{args.hardware}"


def sim_config(args: argparse.Namespace, cost: CostModel, spec: str) -> SimConfig:
    policy = args.policy or ("round-robin" if args.colocated else SchedulingConfig.policy)
    scheduling = SchedulingConfig(
        policy,
        args.admission,
        args.slo_ttft,
        args.slo_tbt,
        args.balancing_threshold,
        args.decode_time,
    )
    return SimConfig(
        kv_tokens(args, spec),
        args.prefill,
        args.decode,
        args.colocated,
        scheduling,
        args.cache_tokens,
        not (args.no_pool or args.local_prefix_only),
        args.heartbeat_interval,
        sample_interval=args.sample_interval,
        seed=args.seed,
        remote_prefix=not args.local_prefix_only,
    )


def kv_tokens(args: argparse.Namespace, spec: str) -> int:
    if args.kv_tokens is not None:
        return args.kv_tokens
    if not spec.startswith(ROOFLINE_PREFIX):
        raise KvstackError(
            "a profiled cost model does not say how much KV a node holds: give --kv-tokens"
        )
    _, model, hardware = spec.split(":")
    return node_kv_tokens(model, hardware)


def cluster_name(config: SimConfig) -> str:
    if config.colocated:
        return f"{config.num_colocated} colocated nodes"
    return f"{config.num_prefill}P+{config.num_decode}D"


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


def write_outputs(result: dict, args: argparse.Namespace) -> None:
    if args.output_json:
        print(f"result: {save_result(result, args.output_json)}", file=sys.stderr)
    if args.plot_dir:
        for path in plot(result, Path(args.plot_dir)):
            print(f"plot: {path}", file=sys.stderr)


def plot(result: dict, out_dir: Path) -> list[Path]:
    from loadgen.plots import plot_run  # matplotlib loads only when plotting
    from loadgen.sim.plots import plot_load

    prefix = f"{result['label']}-"
    return plot_run(result, out_dir, prefix) + plot_load(result, out_dir, prefix)
