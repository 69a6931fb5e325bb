"""`python -m bench failover`: what conductor failover costs per placement, and how soon
a standby takes over (docs/conductor.md, "Failover").

1. **Record.** With a lease, every accepted placement is written once under its request
   id (`kv.create` in JetStream, services/conductor/placements.py) before the conductor
   answers. Timed beside a baseline from the same run: one NATS request/reply round
   trip to a responder that answers at once, which is what a placement costs the gateway
   on the wire without the record.
2. **Takeover.** Two lease keepers (services/conductor/lease.py) on the same server. The
   active one stops at a random point in its renewal cycle, as a SIGKILLed conductor
   does. The time until the standby holds the lease is measured, `--rounds` times.

Both run against a local nats-server with JetStream (file storage, as `kvstack up` runs
it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import sys
import time

import nats
import orjson

from services.conductor.lease import LeaseKeeper
from services.conductor.placements import PlacementRecords
from shared import codec
from shared.conductor.lease import Lease, LeaseConfig
from shared.messages import Placement
from shared.runtime.nats_server import NatsServer


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("failover", help="conductor failover: record cost and takeover time")
    p.add_argument("--placements", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--lease-ttl", type=float, default=1.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    logging.getLogger("kvstack.conductor.lease").setLevel(logging.ERROR)  # each round's release
    server = NatsServer()
    try:
        result = asyncio.run(measure(server.url, args))
    finally:
        server.stop()
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        report(result)
    return 0


async def measure(url: str, args: argparse.Namespace) -> dict:
    nc = await nats.connect(url)
    try:
        baseline, record = await time_records(nc, args.placements)
        takeovers = [await time_takeover(url, args.lease_ttl) for _ in range(args.rounds)]
    finally:
        await nc.close()
    return {
        "placements": args.placements,
        "round_trip_ms": summary(baseline),
        "record_ms": summary(record),
        "lease_ttl_s": args.lease_ttl,
        "takeover_s": summary(takeovers, scale=1.0),
    }


async def time_records(nc, count: int) -> tuple[list[float], list[float]]:
    async def echo(msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe("bench.place", cb=echo)
    records = await PlacementRecords.open(nc.jetstream())
    baseline, record = [], []
    for i in range(count):
        placement = Placement(f"bench-{time.time_ns()}-{i}", True, "prefill-0", "decode-0")
        began = time.perf_counter()
        await nc.request("bench.place", codec.encode(placement), timeout=5)
        baseline.append(time.perf_counter() - began)
        began = time.perf_counter()
        await records.record(placement)
        record.append(time.perf_counter() - began)
    return baseline, record


async def time_takeover(url: str, ttl: float) -> float:
    """Seconds from the active keeper's stop to the standby's claim."""
    claimed = asyncio.Event()

    async def nothing(_: bool) -> None:
        pass

    async def standby_claimed(active: bool) -> None:
        claimed.set()

    conns = [await nats.connect(url) for _ in range(2)]
    active, standby = (
        LeaseKeeper(nc.jetstream(timeout=ttl / 2), name, Lease(LeaseConfig(ttl)), on_change)
        for nc, name, on_change in zip(conns, ("a", "b"), (nothing, standby_claimed))
    )
    await active.open()
    await standby.open()
    await active.step()  # a claims first
    tasks = [asyncio.create_task(keeper.run()) for keeper in (active, standby)]
    await asyncio.sleep(random.uniform(ttl, 2 * ttl))  # a point in a's renewal cycle
    tasks[0].cancel()
    stopped = time.monotonic()
    await asyncio.wait_for(claimed.wait(), 10 * ttl)
    took = time.monotonic() - stopped
    await standby.release()
    tasks[1].cancel()
    for nc in conns:
        await nc.close()
    return took


def summary(seconds: list[float], scale: float = 1e3) -> dict:
    ordered = sorted(seconds)
    return {
        "p50": round(statistics.median(ordered) * scale, 3),
        "p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * scale, 3),
        "max": round(ordered[-1] * scale, 3),
    }


def report(result: dict) -> None:
    out = sys.stdout
    out.write(f"{result['placements']} placements, one at a time (ms):\n")
    for name in ("round_trip_ms", "record_ms"):
        row = result[name]
        out.write(
            f"  {name:<14} p50 {row['p50']:7.3f}  p99 {row['p99']:7.3f}  max {row['max']:7.3f}\n"
        )
    row = result["takeover_s"]
    out.write(
        f"takeover with lease ttl {result['lease_ttl_s']} s (s): p50 {row['p50']:.3f}  "
        f"max {row['max']:.3f}\n"
    )
