"""Small traces and a cost model with round coefficients for the simulator's tests, so
that expected times can be computed from the cost model by hand.

    prefill(n new, c cached) = 0.01 + 0.001 n + 0.0001 c          seconds
    decode step(b, ctx)      = 0.01 + 0.001 b + 0.000001 ctx      seconds
    transfer(bytes)          = 0.001 + bytes / 1e9                seconds (100 kB a token)
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import orjson

from loadgen.sim.config import SimConfig
from loadgen.sim.runner import SimRun, Simulation
from loadgen.trace import TRACE_BLOCK_SIZE, TraceRow
from shared.conductor.config import SchedulingConfig
from shared.costmodel import FittedCostModel

COST = FittedCostModel(
    model="toy",
    prefill_coef=(0.01, 0.001, 0.0, 0.0, 0.0001),
    decode_coef=(0.01, 0.001, 0.000001),
    link_bw=1e9,
    link_latency=0.001,
    kv_bytes_per_token=100_000,
)
KV_TOKENS = 1_000_000


def row(
    time: float, num_tokens: int, output: int, first_hash: int = 0, prefix: tuple[int, ...] = ()
) -> TraceRow:
    """A request of `num_tokens` tokens: its blocks are `prefix`, then new ids counting up
    from `first_hash` (one id per 512-token block, the last one partial, as in traces)."""
    count = math.ceil(num_tokens / TRACE_BLOCK_SIZE)
    own = tuple(range(first_hash, first_hash + count - len(prefix)))
    return TraceRow(time, num_tokens, output, prefix + own)


def conversations(count: int = 60, rate: float = 2.0, seed: int = 0) -> list[TraceRow]:
    """Requests on a few shared documents (hot prefixes) and of their own, arriving
    `rate` a second."""
    rng = random.Random(seed)
    documents = [tuple(range(1000 * d, 1000 * d + rng.randint(2, 8))) for d in range(1, 5)]
    rows = []
    for i in range(count):
        prefix = rng.choice(documents) if rng.random() < 0.7 else ()
        tokens = (len(prefix) + rng.randint(1, 4)) * TRACE_BLOCK_SIZE - rng.randrange(100)
        rows.append(row(i / rate, tokens, rng.randint(2, 40), 100_000 + 100 * i, prefix))
    return rows


def config(
    prefill: int = 0,
    decode: int = 0,
    colocated: int = 0,
    policy: str = "kvcentric",
    admission: str = "none",
    slo_ttft: float = 30.0,
    slo_tbt: float = 1.0,
    **kw,
) -> SimConfig:
    scheduling = SchedulingConfig(policy, admission, slo_ttft, slo_tbt)
    return SimConfig(kw.pop("kv_tokens", KV_TOKENS), prefill, decode, colocated, scheduling, **kw)


def simulate(rows: list[TraceRow], sim_config: SimConfig, cost=COST) -> SimRun:
    return Simulation(rows, sim_config, cost).run()


def write_trace(path: Path, rows: list[TraceRow]) -> Path:
    """`rows` as a Mooncake trace file (timestamps back in milliseconds)."""
    path.write_bytes(
        b"".join(
            orjson.dumps(
                {
                    "timestamp": r.timestamp * 1000,
                    "input_length": r.input_length,
                    "output_length": r.output_length,
                    "hash_ids": list(r.hash_ids),
                }
            )
            + b"\n"
            for r in rows
        )
    )
    return path
