"""Small builders for conductor tests: a cost model with round coefficients, so that every
predicted time can be computed by hand, and workers, requests and snapshots to feed it.

    prefill(n new, c cached) = 0.01 + 0.001 n + 0.0001 c          seconds
    decode step(b, ctx)      = 0.01 + 0.001 b + 0.000001 ctx      seconds
    transfer(k blocks)       = 0.001 + k * 16 * 100_000 / 1e9     seconds (1.6 ms a block)
    request overhead         = 0.005                              seconds
"""

from __future__ import annotations

from shared.conductor.config import SchedulingConfig
from shared.conductor.core import Conductor
from shared.conductor.loads import NO_PENDING, Pending, WorkerLoad
from shared.conductor.policies import Inputs, request_seed
from shared.conductor.snapshot import NO_MATCH, ClusterSnapshot, PrefixMatch
from shared.costmodel import FittedCostModel
from shared.messages import Heartbeat, PlacementRequest

BLOCK = 16
OVERHEAD = 0.005
COST = FittedCostModel(
    model="toy",
    prefill_coef=(0.01, 0.001, 0.0, 0.0, 0.0001),
    decode_coef=(0.01, 0.001, 0.000001),
    link_bw=1e9,
    link_latency=0.001,
    kv_bytes_per_token=100_000,
    request_overhead=OVERHEAD,
)


def prefill_s(new: int, cached: int = 0) -> float:
    return 0.01 + 0.001 * new + 0.0001 * cached


def step_s(batch: int, context: int) -> float:
    return 0.01 + 0.001 * batch + 0.000001 * context


def transfer_s(blocks: int) -> float:
    return 0.001 + blocks * BLOCK * 100_000 / 1e9


def prefill_worker(
    worker_id: str, waiting: int = 0, queued: int = 0, pending: Pending = NO_PENDING
) -> WorkerLoad:
    return WorkerLoad(
        worker_id,
        "prefill",
        0,
        waiting + pending.requests,
        queued + pending.tokens,
        1000,
        1000,
        BLOCK,
        pending=pending,
    )


def decode_worker(
    worker_id: str, running: int = 0, context: int = 0, free: int = 1000, total: int = 1000
) -> WorkerLoad:
    return WorkerLoad(worker_id, "decode", running, 0, 0, free, total, BLOCK, context)


def request(
    num_tokens: int = 1600,
    request_id: str = "r",
    hashes: tuple[int, ...] = (),
    exclude: tuple[str, ...] = (),
    max_tokens: int = 100,
    slo_ttft: float = 0.0,
    slo_tbt: float = 0.0,
) -> PlacementRequest:
    return PlacementRequest(
        request_id, num_tokens, max_tokens, 0.0, hashes, exclude, slo_ttft, slo_tbt
    )


def snapshot(prefill, decode, time: float = 0.0) -> ClusterSnapshot:
    return ClusterSnapshot(time, tuple(prefill), tuple(decode))


def inputs(
    prefill,
    decode,
    req: PlacementRequest | None = None,
    prefix: PrefixMatch = NO_MATCH,
    time: float = 0.0,
    turn: int = 0,
    **config,
) -> Inputs:
    """A policy's inputs, seeded by the request id as the conductor seeds them."""
    req = req or request()
    return Inputs(
        snapshot(prefill, decode, time),
        req,
        prefix,
        SchedulingConfig(**config),
        COST,
        turn,
        request_seed(req),
    )


def beat(
    worker_id: str,
    service: str,
    time: float = 0.0,
    interval: float = 1.0,
    running: int = 0,
    waiting: int = 0,
    queued: int = 0,
    context: int = 0,
    free: int = 1000,
    total: int = 1000,
    draining: bool = False,
) -> Heartbeat:
    return Heartbeat(
        service,
        worker_id,
        time,
        interval,
        block_size=BLOCK,
        num_running=running,
        num_waiting=waiting,
        queued_tokens=queued,
        context_tokens=context,
        free_blocks=free,
        total_blocks=total,
        draining=draining,
    )


def conductor(prefill=("p0",), decode=("d0",), time: float = 0.0, **config) -> Conductor:
    """A conductor that has heard one idle heartbeat from each worker."""
    core = Conductor(SchedulingConfig(**config), COST)
    for worker_id in prefill:
        core.observe(beat(worker_id, "prefill", time))
    for worker_id in decode:
        core.observe(beat(worker_id, "decode", time))
    return core
