"""The flags `loadgen sim`, `loadgen sim sweep` and `loadgen sim-sweep` share (the trace's
replay, the cluster, the conductor's scheduling) and the simulation's config built from
them. Light to import: the simulation itself loads only when a command runs."""

from __future__ import annotations

import argparse

from loadgen.sim.config import (
    COLOCATED_POLICIES,
    DEFAULT_CACHE_TOKENS,
    HEARTBEAT_INTERVAL,
    SimConfig,
    node_kv_tokens,
)
from shared import setting
from shared.conductor.config import SchedulingConfig
from shared.conductor.settings import SCHEDULING_SETTINGS
from shared.costmodel import ROOFLINE_PREFIX, CostModel, from_spec, roofline
from shared.errors import KvstackError


def add_trace_args(g: argparse._ArgumentGroup, required: bool = True) -> None:
    """`required`: False where the parser also has sub-commands (`loadgen sim`), which
    argparse would otherwise refuse without the parent's --trace; the command checks."""
    g.add_argument("--trace", required=required, metavar="FILE", help="Mooncake trace (JSONL)")
    g.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="multiply arrival times (0.5: twice as fast)",
    )
    add_replay_args(g)


def add_replay_args(g: argparse._ArgumentGroup) -> None:
    """Which of a trace's requests to replay, and the seed."""
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


def add_scheduling_args(g: argparse._ArgumentGroup, with_policy: bool = True) -> None:
    """The live conductor's settings; only --policy's default differs (it depends on the
    cluster: round-robin for colocated nodes). `with_policy` False: a command that takes
    several policies in a flag of its own."""
    policy_help = (
        f"default {SchedulingConfig().policy}; colocated: round-robin "
        f"(one of {', '.join(COLOCATED_POLICIES)})"
    )
    changes = {"policy": {"default": None, "help": policy_help}}
    names = [name for name in SCHEDULING_SETTINGS if with_policy or name != "policy"]
    setting.add(g, SCHEDULING_SETTINGS, names, changes)


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
