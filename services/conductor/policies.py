"""Placement policies: pure functions of a cluster snapshot and a request.

The live conductor and the simulator call the same functions, so what a simulation
shows is what the cluster does. Each returns a Choice (with the predicted TTFT and TBT
that admission compares with the SLOs) or a Rejection when no worker can take the request.
"""
from __future__ import annotations

import itertools
import random as _random
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from services.conductor import estimate
from services.conductor.config import SchedulingConfig
from services.conductor.snapshot import ClusterSnapshot, PrefixMatch, WorkerLoad
from shared.costmodel import CostModel
from shared.messages import PlacementRequest

POOL = "kvstore"


@dataclass(frozen=True, slots=True)
class Choice:
    prefill_id: str
    decode_id: str
    ttft: float                   # predicted seconds to the first token
    tbt: float                    # predicted seconds per token on the decode worker
    prefix_tokens: int            # prompt tokens the prefill worker will not compute
    fetch_from: str = ""          # "kvstore" or a peer prefill worker; "": nothing remote
    fetch_blocks: int = 0         # blocks pulled from there (the worker keeps a replica)
    source_blocks: int = 0        # leading blocks of the prompt the source holds
    load_prefix: bool = True      # False: the worker recomputes what it does not hold
    busy_seconds: float = 0.0     # predicted seconds it keeps the prefill worker busy


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str
    retry_after: float


@dataclass(frozen=True, slots=True)
class Inputs:
    """Everything a policy reads: the cluster, the request and how to predict times."""
    snapshot: ClusterSnapshot
    request: PlacementRequest
    prefix: PrefixMatch
    config: SchedulingConfig
    cost: CostModel


Policy = Callable[[Inputs], "Choice | Rejection"]
Way = tuple[int, str, int, bool]    # local blocks, source, source blocks, load_prefix
Route = Callable[[Inputs, WorkerLoad], Way]


def random(inputs: Inputs) -> Choice | Rejection:
    """Any prefill and any fitting decode worker, seeded by the request id (repeatable)."""
    rng = _random.Random(zlib.crc32(inputs.request.request_id.encode()))
    return _place(inputs, lambda ws: _plan_default(inputs, rng.choice(ws)), rng.choice)


_turns = itertools.count()


def round_robin(inputs: Inputs) -> Choice | Rejection:
    """Prefill workers in turn (by id), whatever their load or cache."""
    return _place(inputs, lambda ws: _plan_default(
        inputs, sorted(ws, key=lambda w: w.worker_id)[next(_turns) % len(ws)]), _most_free)


def load_balance(inputs: Inputs) -> Choice | Rejection:
    """Least queued prefill work; the decode worker with the most free KV blocks."""
    return _place(inputs, lambda ws: _plan_default(inputs, min(
        ws, key=lambda w: (w.queued_tokens, w.num_waiting, w.worker_id))), _most_free)


def cache_aware(inputs: Inputs) -> Choice | Rejection:
    """Least predicted TTFT counting only each worker's own cached prefix (it recomputes
    the rest); the decode worker with the least predicted TBT."""
    return _place(inputs, lambda ws: _fastest(inputs, ws, _route_local),
                  lambda ws: _least_tbt(inputs, ws))


def kvcentric(inputs: Inputs) -> Choice | Rejection:
    """Mooncake's Algorithm 1: per prefill worker, TTFT = transfer of the best remote prefix
    when it is `balancing_threshold` times the local one (else the local prefix alone) +
    queue + prefill; the least wins. The decode worker with the least predicted TBT."""
    return _place(inputs, lambda ws: _fastest(inputs, ws, _route_kvcentric),
                  lambda ws: _least_tbt(inputs, ws))


POLICIES: dict[str, Policy] = {"random": random, "round-robin": round_robin,
                               "load-balance": load_balance, "cache-aware": cache_aware,
                               "kvcentric": kvcentric}


def _place(inputs: Inputs, choose_prefill: Callable[[list[WorkerLoad]], Choice],
           choose_decode: Callable[[list[WorkerLoad]], WorkerLoad]) -> Choice | Rejection:
    request = inputs.request
    prefill = _candidates(inputs.snapshot.prefill, request)
    need = request.num_prompt_tokens + 1    # the prompt's KV and its first token must fit
    # NOTE: need <= blocks * block_size is ceil(need / block_size) <= blocks, without a call
    decode = [w for w in _candidates(inputs.snapshot.decode, request)
              if need <= w.total_blocks * w.block_size]
    if not prefill or not decode:
        missing = "prefill" if not prefill else "decode"
        return Rejection(f"no {missing} worker available", inputs.config.retry_after)
    choice, chosen = choose_prefill(prefill), choose_decode(decode)
    tbt = estimate.decode_tbt(chosen, request.num_prompt_tokens, inputs.cost)
    c = choice    # NOTE: built directly; dataclasses.replace costs ~15 us of a ~250 us decision
    return Choice(c.prefill_id, chosen.worker_id, c.ttft, tbt, c.prefix_tokens, c.fetch_from,
                  c.fetch_blocks, c.source_blocks, c.load_prefix, c.busy_seconds)


def _fastest(inputs: Inputs, workers: list[WorkerLoad], route: Route) -> Choice:
    """The plan with the least (TTFT, id), each worker on its route. A route depends on a
    worker only through its local match and its best remote source, which is the same for
    all workers that hold nothing: they share one route, so among them the shortest queue
    wins. Each distinct route's own time (fetch and prefill) is predicted once."""
    own: dict[tuple[int, int, int], float] = {}
    cost, queue_time, local = inputs.cost, estimate.prefill_queue_time, inputs.prefix.by_worker
    warm = [w for w in workers if local.get(w.worker_id)]
    cold = [w for w in workers if not local.get(w.worker_id)]
    candidates = [(w, route(inputs, w)) for w in warm]
    if cold:
        fastest_cold = min(cold, key=lambda w: (queue_time(w, cost), w.worker_id))
        candidates.append((fastest_cold, route(inputs, fastest_cold)))
    best_key, best = None, None
    for worker, way in candidates:
        shape = (worker.block_size, way[0], way[2])     # local and source blocks
        if shape not in own:
            own[shape] = _own(inputs, *shape)[2]
        key = (queue_time(worker, cost) + own[shape], worker.worker_id)
        if best_key is None or key < best_key:
            best_key, best = key, (worker, way)
    return _plan(inputs, best[0], *best[1])


def _plan_default(inputs: Inputs, worker: WorkerLoad) -> Choice:
    return _plan(inputs, worker, *_route_default(inputs, worker))


def _route_default(inputs: Inputs, worker: WorkerLoad) -> Way:
    """What the worker does by itself: load whatever remote prefix is longer than its own."""
    local = inputs.prefix.local(worker.worker_id)
    source, best = inputs.prefix.best_remote(worker.worker_id)
    return (local, source, best, True) if best > local else (local, "", 0, True)


def _route_local(inputs: Inputs, worker: WorkerLoad) -> Way:
    return inputs.prefix.local(worker.worker_id), "", 0, False


def _route_kvcentric(inputs: Inputs, worker: WorkerLoad) -> Way:
    local = inputs.prefix.local(worker.worker_id)
    source, best = inputs.prefix.best_remote(worker.worker_id)
    if best > local and (local == 0 or best / local > inputs.config.balancing_threshold):
        return local, source, best, True
    # Recompute what a known remote prefix would add; with none known, the worker may still
    # find blocks the index has not heard of yet (events lag writes by a fraction of a second).
    return local, "", 0, best <= local


def _plan(inputs: Inputs, worker: WorkerLoad, local_blocks: int, source: str = "",
          source_blocks: int = 0, load_prefix: bool = True) -> Choice:
    """The TTFT of running on `worker` with its local prefix, plus the prefix from
    `source` (up to `source_blocks` leading blocks) when one is given."""
    fetch_blocks, prefix_tokens, own = _own(inputs, worker.block_size, local_blocks,
                                            source_blocks)
    return Choice(worker.worker_id, "", _wait(inputs, worker) + own, 0.0, prefix_tokens,
                  source, fetch_blocks, source_blocks, load_prefix, own)


def _own(inputs: Inputs, block_size: int, local_blocks: int, source_blocks: int
         ) -> tuple[int, int, float]:
    """(blocks fetched, prefix tokens, seconds of fetch and prefill) of the request on a
    worker holding `local_blocks`, loading up to `source_blocks` from elsewhere."""
    cost, n = inputs.cost, inputs.request.num_prompt_tokens
    fetch_blocks = max(0, source_blocks - local_blocks)
    prefix_tokens = min(max(local_blocks, source_blocks) * block_size, n - 1)
    return fetch_blocks, prefix_tokens, (estimate.transfer_time(cost, fetch_blocks, block_size)
                                         + estimate.prefill_time(cost, n, prefix_tokens))


def _wait(inputs: Inputs, worker: WorkerLoad) -> float:
    """Seconds before `worker` starts the request: fixed overhead and its queue."""
    cost = inputs.cost
    return getattr(cost, "request_overhead", 0.0) + estimate.prefill_queue_time(worker, cost)


def _most_free(workers: list[WorkerLoad]) -> WorkerLoad:
    return max(workers, key=lambda w: (w.free_blocks, -w.num_running, w.worker_id))


def _least_tbt(inputs: Inputs, workers: list[WorkerLoad]) -> WorkerLoad:
    """Least predicted TBT among workers with room for the prompt now; any, if none has."""
    n = inputs.request.num_prompt_tokens
    roomy = [w for w in workers if n + 1 <= w.free_blocks * w.block_size] or workers
    times = estimate.decode_tbts(roomy, n, inputs.cost)
    return min(zip(times, (w.worker_id for w in roomy), roomy))[2]


def _candidates(workers: tuple[WorkerLoad, ...], request: PlacementRequest) -> list[WorkerLoad]:
    return [w for w in workers if w.worker_id not in request.exclude]

