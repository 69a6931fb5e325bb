"""`python -m bench compose-chaos`: start compose.yaml's stack on this Docker engine (images
from `make image`), put a steady load of streaming greedy requests on it, hit it with each
fault in turn (kills, a scale-down, partitions, a freeze, a slow and lossy link), print what
became of every request, and take the stack down. Needs root (iptables, tc, nsenter) and
the images. Exit code 1 when a request was lost or hung."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.chaos.cli import HEADER as CHAOS_HEADER
from bench.chaos.cli import TOPICS, markdown_table, reference_cases
from bench.compose.docker import image_exists, unavailable
from bench.compose.faults import Fault, LinkShape
from bench.compose.network import clear
from bench.compose.runner import ComposeChaosConfig, ComposeChaosReport, run_compose_chaos
from bench.compose.stack import ComposeStack
from shared.errors import KvstackError

FAULTS = (
    "kill:conductor",
    "kill:kvstore",
    "kill:prefill",
    "kill:decode",
    "docker-kill:decode",
    "kill:gateway",
    "kill:nats",
    "stop:decode",
    "partition:decode",
    "nats-cut:gateway",
    "pause:decode",
    "slow-link:prefill",
)
IMAGES = ("kvstack:latest", "kvstack-prometheus:latest")
# a ~1k-token prompt among the short ones: its prefill lasts long enough to be hit
TOPICS_AND_A_LONG_ONE = (*TOPICS, " ".join(["the history of bread"] * 150))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compose-chaos",
        help="the compose stack under load, each fault in turn (kill, stop, partition, "
        "pause, slow link); count completed, migrated, errored, lost and hung requests",
        description=__doc__,
    )
    p.add_argument("--faults", default=",".join(FAULTS), help="ACTION:SERVICE, in this order")
    p.add_argument("--prefill", type=int, default=2)
    p.add_argument("--decode", type=int, default=2)
    p.add_argument(
        "--profiles", default="", help="compose profiles to start too, e.g. offload,nats-cluster"
    )
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--phase-seconds", type=float, default=30.0)
    p.add_argument(
        "--settle-seconds", type=float, default=10.0, help="load alone before and after the faults"
    )
    p.add_argument("--hold-seconds", type=float, default=20.0, help="of a partition or pause")
    shape = LinkShape()
    p.add_argument(
        "--link-delay-ms", type=float, default=shape.delay_ms, help="slow link, each way"
    )
    p.add_argument("--link-loss", type=float, default=shape.loss, help="slow link, each way")
    p.add_argument("--link-rate", default=shape.rate, help="slow link (tc's notation)")
    p.add_argument("--workdir", default="", help="secrets and logs (default: a temporary one)")
    p.add_argument("--json", default="", help="also write the result to this file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    why = unavailable()
    if why:
        raise KvstackError(f"compose-chaos needs a Docker engine: {why}")
    missing = [image for image in IMAGES if not image_exists(image)]
    if missing:
        raise KvstackError(f"no image {', '.join(missing)}: build them with make image")
    link = LinkShape(args.link_delay_ms, args.link_loss, args.link_rate)
    faults = tuple(Fault.parse(f.strip(), args.hold_seconds, link) for f in args.faults.split(","))
    config = ComposeChaosConfig(
        faults,
        args.concurrency,
        args.max_tokens,
        settle_seconds=args.settle_seconds,
        phase_seconds=args.phase_seconds,
    )
    say("computing the reference answers in this process ...")
    cases = reference_cases(config.model, config.max_tokens, TOPICS_AND_A_LONG_ONE)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="kvstack-compose-"))
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    scale = {"prefill": args.prefill, "decode": args.decode}
    stack = ComposeStack.prepare(workdir, scale, profiles)
    try:
        say(f"starting compose project {stack.project} (secrets in {workdir}) ...")
        stack.up()
        report = run_compose_chaos(stack, cases, config, say)
    finally:
        say(f"each container's log in {stack.save_logs()}")
        clear(stack.project)  # a partition's rules, had the run stopped amid one
        say("taking the stack down ...")
        stack.down()
    print(format_report(report, config))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2))
    return 0 if report.ok else 1


# bench chaos's columns, with the requests in flight when the fault hit, and the phase's
# latency instead of its first answer
HEADER = (
    "fault", "in flight", *CHAOS_HEADER[1:-1],
    "TTFT p50 (s)", "TPOT p50 (ms)", "long prompt: TTFT, TPOT p50", "new long prompt: TTFT, KV",
)  # fmt: skip


def format_report(report: ComposeChaosReport, config: ComposeChaosConfig) -> str:
    rows = [
        (p.row.fault, p.in_flight, p.row.sent, p.row.completed, p.row.migrated, p.row.errored,
         p.row.lost, p.row.hung, _number(p.row.back_s, 1), _number(p.ttft_s, 2),
         _ms(p.tpot_s), f"{_number(p.long_ttft_s, 2)} s, {_ms(p.long_tpot_s)} ms",
         _probe(p.probe))
        for p in report.phases
    ]  # fmt: skip
    lines = markdown_table(HEADER, rows)
    total = sum(p.row.sent for p in report.phases)
    lines.append(
        f"\n{total} requests, {config.concurrency} clients, {config.max_tokens} tokens each"
    )
    lines += [f"error seen: {e}" for e in report.errors]
    lines.append("OK: nothing lost, nothing hung" if report.ok else "FAILED")
    return "\n".join(lines)


def _probe(measured: tuple[float, float] | None) -> str:
    return "-" if measured is None else f"{measured[0]:.2f} s, {measured[1]:.2f} s"


def _ms(seconds: float | None) -> str:
    return _number(None if seconds is None else seconds * 1000, 1)


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def say(message: str) -> None:
    print(f"bench compose-chaos: {message}", file=sys.stderr, flush=True)
