"""`python -m bench conductor`: placement decisions per second and decision latency.

One Conductor (shared/conductor/core.py, no I/O) with N prefill and N decode workers
that heartbeat once a simulated second (spread over it, as live workers are), and a prefix
index of M blocks fed by KV events: shared prefixes (system prompts, documents) cached on
several prefill workers and in the kvstore pool, plus distinct conversations, each on the
prefill worker that computed it and, half of the time, in the pool. Requests of 8k-128k
tokens continue a conversation, open one on a shared prefix, or share nothing.

Only `place()` is timed (time.perf_counter_ns, one call at a time); heartbeats and request
generation are not. The index does not grow during the run (placed requests publish no KV
events here). The baseline is the same run with the exact prefix match, block by block
(`PrefixIndex.walk`), in place of the binary search.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import xxhash

from shared.conductor.config import POLICY_NAMES, SchedulingConfig
from shared.conductor.core import Conductor
from shared.conductor.index import PrefixIndex
from shared.conductor.snapshot import PrefixMatch
from shared.costmodel import roofline
from shared.messages import Heartbeat, KVEvent, PlacementRequest

BLOCK_SIZE = 16
PROMPT_BLOCKS = (512, 8192)  # prompts of 8k-128k tokens
SHARED_BLOCKS = (128, 2048)  # a shared prefix: 2k-32k tokens
CONVERSATION_BLOCKS = (256, 4096)  # a conversation's own blocks after its shared prefix
NUM_SHARED = 32
NUM_POOL = 4  # kvstore instances
PREFILL_BLOCKS = DECODE_BLOCKS = 80_000  # 1.28M tokens: llama3-70b KV on 8 x 80 GB
ROWS = [(policy, "none", "binary search") for policy in POLICY_NAMES] + [
    ("kvcentric", "predictive-request", "binary search"),
    ("kvcentric", "none", "walk"),
]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("conductor", help="placement decisions/s and latency, large cluster")
    p.add_argument("--workers", type=int, default=64, help="prefill workers (and as many decode)")
    p.add_argument("--blocks", type=int, default=1_000_000, help="blocks in the prefix index")
    p.add_argument("--decisions", type=int, default=2000, help="timed placements per row")
    p.add_argument(
        "--rate",
        type=float,
        default=200.0,
        help="requests per simulated second (how much is assigned between beats)",
    )
    p.add_argument("--model", default="llama3-70b", help="roofline model shape")
    p.add_argument("--hardware", default="a800", help="roofline hardware profile")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    rng = random.Random(args.seed)
    cluster = Cluster(args.workers)
    index = PrefixIndex()
    conversations, shared = build_index(index, cluster, args.blocks, rng)
    progress(f"{len(index):,} blocks indexed; generating {args.decisions} requests")
    requests = [make_request(i, rng, conversations, shared) for i in range(args.decisions)]
    report = {
        "prefill_workers": args.workers,
        "decode_workers": args.workers,
        "kvstore_instances": NUM_POOL,
        "indexed_blocks": len(index),
        "prompt_tokens": [b * BLOCK_SIZE for b in PROMPT_BLOCKS],
        "mean_prompt_blocks": round(statistics.mean(len(r.block_hashes) for r in requests)),
        "cost_model": f"roofline:{args.model}:{args.hardware}",
        "setup_seconds": round(time.perf_counter() - started, 1),
        "results": [],
    }
    cost = roofline(args.model, args.hardware)
    for policy, admission, match in ROWS:
        progress(f"{policy} / admission {admission} / {match} match")
        conductor = Conductor(
            SchedulingConfig(policy=policy, admission=admission),
            cost,
            # NOTE: ExactIndex has the two methods the conductor calls (match, forget);
            # core.py types the field as the class, not as a protocol.
            index=index if match == "binary search" else ExactIndex(index),  # type: ignore[arg-type]
        )
        times, accepted = measure(conductor, cluster, requests, args.rate, args.seed)
        report["results"].append(summary(policy, admission, match, times, accepted))
    print(
        orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
        if args.json
        else format_table(report)
    )
    return 0


def progress(message: str) -> None:
    print(f"[bench conductor] {message}", file=sys.stderr, flush=True)


# -- the cluster: workers and their heartbeats ---------------------------------------------


@dataclass(frozen=True)
class Cluster:
    size: int

    @property
    def prefill(self) -> list[str]:
        return [f"prefill-{i:03}" for i in range(self.size)]

    @property
    def workers(self) -> list[tuple[str, str]]:
        return (
            [("prefill", w) for w in self.prefill]
            + [("kvstore", f"kvstore-{i}") for i in range(NUM_POOL)]
            + [("decode", f"decode-{i:03}") for i in range(self.size)]
        )


def heartbeat(service: str, worker_id: str, now: float, rng: random.Random) -> Heartbeat:
    """A busy worker's numbers: a short prefill queue; decode batches of long contexts."""
    if service == "decode":
        running = rng.randint(4, 32)
        context = min(running * rng.randint(4096, 32768), DECODE_BLOCKS * BLOCK_SIZE * 9 // 10)
        return Heartbeat(
            service,
            worker_id,
            now,
            1.0,
            block_size=BLOCK_SIZE,
            num_running=running,
            num_waiting=rng.choice((0, 0, 1)),
            context_tokens=context,
            total_blocks=DECODE_BLOCKS,
            free_blocks=DECODE_BLOCKS - -(-context // BLOCK_SIZE),
        )
    waiting = rng.choice((0, 0, 1, 2)) if service == "prefill" else 0
    return Heartbeat(
        service,
        worker_id,
        now,
        1.0,
        block_size=BLOCK_SIZE,
        num_running=min(waiting, 1),
        num_waiting=waiting,
        queued_tokens=sum(rng.randint(8192, 65536) for _ in range(waiting)),
        free_blocks=PREFILL_BLOCKS // 2,
        total_blocks=PREFILL_BLOCKS,
    )


def measure(
    conductor: Conductor, cluster: Cluster, requests: list[PlacementRequest], rate: float, seed: int
) -> tuple[list[int], int]:
    """Nanoseconds of each `place()`, and how many placements were accepted. Worker k of W
    beats at k/W into every simulated second; beats due by a request's time arrive first."""
    rng, workers, start = random.Random(seed), cluster.workers, 1000.0
    k, times, accepted = -len(workers), [], 0  # one full round before the first request
    for i, request in enumerate(requests):
        now = start + i / rate
        while (beat_time := start + k / len(workers)) <= now:
            service, worker_id = workers[k % len(workers)]
            conductor.observe(heartbeat(service, worker_id, beat_time, rng))
            k += 1
        t0 = time.perf_counter_ns()
        placement = conductor.place(request, now)
        times.append(time.perf_counter_ns() - t0)
        accepted += placement.accepted
    return times, accepted


class ExactIndex:
    """The baseline: the same index, matched block by block (`PrefixIndex.walk`)."""

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index

    def match(self, block_hashes: Sequence[int], workers: Sequence[str]) -> PrefixMatch:
        return self.index.walk(block_hashes, workers)

    def forget(self, worker_id: str) -> None:
        self.index.forget(worker_id)


# -- the prefix index and the requests ----------------------------------------------------


def chain(parent: int, count: int, rng: random.Random) -> list[int]:
    """`count` block hashes after `parent`, chained as shared/hashing.py chains them (each
    names its whole prefix); a block's content is 64 random bits, not tokens."""
    hashes = []
    for _ in range(count):
        parent = xxhash.xxh3_64_intdigest(
            parent.to_bytes(8, "little") + rng.getrandbits(64).to_bytes(8, "little")
        )
        hashes.append(parent)
    return hashes


def build_index(
    index: PrefixIndex, cluster: Cluster, num_blocks: int, rng: random.Random
) -> tuple[list[list[int]], list[list[int]]]:
    """Fill `index` with `num_blocks` distinct blocks; return the conversations' and the
    shared prefixes' hashes."""
    shared: list[list[int]] = []
    total = 0
    while len(shared) < NUM_SHARED and total < num_blocks // 10:  # at most a tenth shared
        shared.append(chain(0, min(rng.randint(*SHARED_BLOCKS), num_blocks // 10 - total), rng))
        holders = rng.sample(cluster.prefill, min(rng.randint(2, 8), cluster.size))
        publish(index, shared[-1], holders, pooled=True)
        total += len(shared[-1])
    conversations, weights = [], [1 / (i + 1) for i in range(len(shared))]  # a few hot ones
    while total < num_blocks:
        base = rng.choices(shared, weights)[0]
        own = chain(base[-1], min(rng.randint(*CONVERSATION_BLOCKS), num_blocks - total), rng)
        publish(index, base + own, [rng.choice(cluster.prefill)], pooled=rng.random() < 0.5)
        conversations.append(base + own)
        total += len(own)
        if len(conversations) % 100 == 0:
            progress(f"indexing: {total:,} of {num_blocks:,} blocks")
    return conversations, shared


def publish(index: PrefixIndex, hashes: list[int], holders: list[str], pooled: bool) -> None:
    """The KV events a prefix's holders send: each prefill worker all of it; the pool spreads
    it over its instances by block hash."""
    for worker_id in holders:
        index.apply(KVEvent(worker_id, "prefill", stored=tuple(hashes)))
    for i in range(NUM_POOL if pooled else 0):
        index.apply(
            KVEvent(f"kvstore-{i}", "kvstore", stored=tuple(h for h in hashes if h % NUM_POOL == i))
        )


def make_request(
    i: int, rng: random.Random, conversations: list[list[int]], shared: list[list[int]]
) -> PlacementRequest:
    """40% continue a conversation, 30% open one on a shared prefix, 30% share nothing. The
    length is log-uniform over PROMPT_BLOCKS, or the prefix and 16 new blocks if longer."""
    length = round(math.exp(rng.uniform(*map(math.log, PROMPT_BLOCKS))))
    kind = rng.random()
    prefix = (
        rng.choice(conversations) if kind < 0.4 else rng.choice(shared) if kind < 0.7 else []
    )[: PROMPT_BLOCKS[1] - 16]
    hashes = prefix + chain(prefix[-1] if prefix else 0, max(16, length - len(prefix)), rng)
    return PlacementRequest(
        f"r{i}",
        len(hashes) * BLOCK_SIZE + rng.randrange(BLOCK_SIZE),
        max_tokens=rng.choice((128, 512, 2048)),
        deadline=0.0,
        block_hashes=tuple(hashes),
    )


# -- the report ------------------------------------------------------------------------------


def summary(policy: str, admission: str, match: str, times: list[int], accepted: int) -> dict:
    ms = sorted(t / 1e6 for t in times)
    return {
        "policy": policy,
        "admission": admission,
        "match": match,
        "decisions": len(ms),
        "decisions_per_s": round(len(ms) / (sum(ms) / 1000)),
        "mean_ms": round(statistics.mean(ms), 3),
        "p50_ms": round(ms[len(ms) // 2], 3),
        "p99_ms": round(ms[min(len(ms) - 1, math.ceil(0.99 * len(ms)) - 1)], 3),
        "max_ms": round(ms[-1], 3),
        "accepted": accepted,
    }


def format_table(report: dict) -> str:
    title = (
        f"conductor placement: {report['prefill_workers']} prefill + "
        f"{report['decode_workers']} decode workers, {report['indexed_blocks']:,} indexed "
        f"blocks, prompts of {report['prompt_tokens'][0] // 1024}k-"
        f"{report['prompt_tokens'][1] // 1024}k tokens "
        f"(mean {report['mean_prompt_blocks']:,} blocks), {report['cost_model']}"
    )
    header = (
        f"{'policy':14}{'admission':20}{'match':15}{'decisions/s':>12}{'mean ms':>9}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'accepted':>10}"
    )
    lines = [title, header]
    for r in report["results"]:
        lines.append(
            f"{r['policy']:14}{r['admission']:20}{r['match']:15}"
            f"{r['decisions_per_s']:>12,}{r['mean_ms']:>9.3f}{r['p50_ms']:>9.3f}"
            f"{r['p99_ms']:>9.3f}{r['max_ms']:>9.3f}"
            f"{r['accepted']:>6}/{r['decisions']}"
        )
    return "\n".join(lines)
