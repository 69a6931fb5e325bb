"""Placement policies: pure functions of a cluster snapshot and a request.

The live conductor and the simulator call the same functions, so what a simulation
shows is what the cluster does. Each returns a Choice (with the predicted TTFT and TBT
that admission compares with the SLOs) or a Rejection when no worker can take the request.
"""

from __future__ import annotations

import functools
import itertools
import operator
import random as _random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from shared.conductor import estimate
from shared.conductor.config import SchedulingConfig
from shared.conductor.loads import WorkerLoad
from shared.conductor.snapshot import ClusterSnapshot, PrefixMatch
from shared.conductor.views import PrefillView
from shared.costmodel import CostModel
from shared.messages import PlacementRequest


class Choice(NamedTuple):  # NOTE: built twice a decision: see loads.py's NOTE
    prefill_id: str
    decode_id: str
    ttft: float  # predicted seconds to the first token
    tbt: float  # predicted seconds per token on the decode worker
    prefix_tokens: int  # prompt tokens the prefill worker will not compute
    fetch_from: str = ""  # "kvstore" or a peer prefill worker; "": nothing remote
    fetch_blocks: int = 0  # blocks pulled from there (the worker keeps a replica)
    source_blocks: int = 0  # leading blocks of the prompt the source holds
    load_prefix: bool = True  # False: the worker recomputes what it does not hold
    busy_seconds: float = 0.0  # predicted seconds it keeps the prefill worker busy


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
Way = tuple[int, str, int, bool]  # local blocks, source, source blocks, load_prefix
Remote = tuple[str, int]  # where a prefix could be loaded from, and its blocks
Route = Callable[[Inputs, int, Remote], Way]
Own = tuple[int, int, float]  # blocks fetched, prefix tokens, seconds (see _own)


def random(inputs: Inputs) -> Choice | Rejection:
    """Any prefill and any fitting decode worker, seeded by the request id (repeatable)."""
    rng = _random.Random(zlib.crc32(inputs.request.request_id.encode()))
    return _place(
        inputs,
        lambda ws: _plan_default(inputs, rng.choice(ws)),
        lambda rows: rng.choice(_decode_loads(inputs, rows)),
    )


_turns = itertools.count()


def round_robin(inputs: Inputs) -> Choice | Rejection:
    """Prefill workers in turn (by id), whatever their load or cache."""
    return _place(
        inputs,
        lambda ws: _plan_default(
            inputs, sorted(ws, key=lambda w: w.worker_id)[next(_turns) % len(ws)]
        ),
        lambda rows: _most_free(_decode_loads(inputs, rows)),
    )


def load_balance(inputs: Inputs) -> Choice | Rejection:
    """Least queued prefill work; the decode worker with the most free KV blocks."""
    return _place(
        inputs,
        lambda ws: _plan_default(
            inputs, min(ws, key=lambda w: (w.queued_tokens, w.num_waiting, w.worker_id))
        ),
        lambda rows: _most_free(_decode_loads(inputs, rows)),
    )


def cache_aware(inputs: Inputs) -> Choice | Rejection:
    """Least predicted TTFT counting only each worker's own cached prefix (it recomputes
    the rest); the decode worker with the least predicted TBT."""
    return _place(
        inputs, lambda _: _fastest(inputs, _route_local), lambda rows: _least_tbt(inputs, rows)
    )


def kvcentric(inputs: Inputs) -> Choice | Rejection:
    """Mooncake's Algorithm 1: per prefill worker, TTFT = transfer of the best remote prefix
    when it is `balancing_threshold` times the local one (else the local prefix alone) +
    queue + prefill; the least wins. The decode worker with the least predicted TBT."""
    return _place(
        inputs, lambda _: _fastest(inputs, _route_kvcentric), lambda rows: _least_tbt(inputs, rows)
    )


POLICIES: dict[str, Policy] = {
    "random": random,
    "round-robin": round_robin,
    "load-balance": load_balance,
    "cache-aware": cache_aware,
    "kvcentric": kvcentric,
}


def _place(
    inputs: Inputs,
    choose_prefill: Callable[[Sequence[WorkerLoad]], Choice],
    choose_decode: Callable[[np.ndarray], WorkerLoad],
) -> Choice | Rejection:
    """`choose_decode` gets the decode candidates as rows of the snapshot's DecodeView."""
    request = inputs.request
    prefill = _candidates(inputs.snapshot.prefill, request)
    decode = _fitting_decode(inputs)
    if not prefill or not len(decode):
        missing = "prefill" if not prefill else "decode"
        return Rejection(f"no {missing} worker available", inputs.config.retry_after)
    choice, chosen = choose_prefill(prefill), choose_decode(decode)
    tbt = estimate.decode_tbt(chosen, request.num_prompt_tokens, inputs.cost)
    c = choice  # NOTE: built directly; _replace costs more
    return Choice(
        c.prefill_id,
        chosen.worker_id,
        c.ttft,
        tbt,
        c.prefix_tokens,
        c.fetch_from,
        c.fetch_blocks,
        c.source_blocks,
        c.load_prefix,
        c.busy_seconds,
    )


def _fastest(inputs: Inputs, route: Route) -> Choice:
    """The plan with the least (TTFT, id), each worker on its route. A route depends on a
    worker only through its local match and its best remote source, the same for every
    worker but the leader (the longest match): workers of one shape (_shapes) share a
    route, whose own time (fetch and prefill) is predicted once. All workers that hold
    nothing share one, so among them only the shortest queue can win."""
    view = inputs.snapshot.prefill_view()
    queue = view.queue_seconds(inputs.cost)
    leader, leader_remote, remote = inputs.prefix.best_remotes()
    best_key, best, prefills = None, None, {}
    for (block_size, local_blocks, leads), workers in _shapes(inputs, view, leader).items():
        way = route(inputs, local_blocks, leader_remote if leads else remote)
        own = _own(inputs, block_size, local_blocks, way[2], prefills)
        key = _least_ttft(workers, queue, own[2])
        if best is None or key < best_key:
            best_key, best = key, (way, own)
    worker_id = best_key[1]
    return _plan(inputs, view.by_id[worker_id], queue[worker_id], *best)


def _least_ttft(
    workers: list[str], queue: dict[str, float], own_seconds: float
) -> tuple[float, str]:
    """The least (queue seconds + own_seconds, id) among `workers`, in C (map, zip, min):
    up to all prefill workers share a shape. (own + queue is queue + own: IEEE addition
    commutes.)"""
    ttfts = map(functools.partial(operator.add, own_seconds), map(queue.__getitem__, workers))
    return min(zip(ttfts, workers))


def _shapes(
    inputs: Inputs, view: PrefillView, leader: str
) -> dict[tuple[int, int, bool], list[str]]:
    """The candidates that hold some of the prompt, and the one with the least (queue
    seconds, id) of those that hold none, by (block size, local blocks, leads)."""
    exclude, shapes = inputs.request.exclude, {}
    for local_blocks, workers in inputs.prefix.holders().items():
        if exclude or not all(map(view.by_id.__contains__, workers)):
            workers = [w for w in workers if w in view.by_id and w not in exclude]
        if leader in workers:
            workers = workers.copy()
            workers.remove(leader)
            shapes[(view.by_id[leader].block_size, local_blocks, True)] = [leader]
        for block_size, alike in _by_block_size(workers, view):
            shapes[(block_size, local_blocks, False)] = alike
    local = inputs.prefix.by_worker
    coldest = next(
        (w for _, w in view.ranking(inputs.cost) if not local.get(w) and w not in exclude), None
    )
    if coldest is not None:
        shapes[(view.by_id[coldest].block_size, 0, False)] = [coldest]
    return shapes


def _by_block_size(workers: list[str], view: PrefillView) -> list[tuple[int, list[str]]]:
    if not workers:
        return []
    if view.block_size is not None:
        return [(view.block_size, workers)]
    groups: dict[int, list[str]] = {}
    for worker_id in workers:
        groups.setdefault(view.by_id[worker_id].block_size, []).append(worker_id)
    return list(groups.items())


def _plan_default(inputs: Inputs, worker: WorkerLoad) -> Choice:
    prefix, worker_id = inputs.prefix, worker.worker_id
    way = _route_default(inputs, prefix.local(worker_id), prefix.best_remote(worker_id))
    return _plan(inputs, worker, estimate.prefill_queue_time(worker, inputs.cost), way)


def _route_default(inputs: Inputs, local: int, remote: Remote) -> Way:
    """What the worker does by itself: load whatever remote prefix is longer than its own."""
    source, best = remote
    return (local, source, best, True) if best > local else (local, "", 0, True)


def _route_local(inputs: Inputs, local: int, remote: Remote) -> Way:
    return local, "", 0, False


def _route_kvcentric(inputs: Inputs, local: int, remote: Remote) -> Way:
    source, best = remote
    if best > local and (local == 0 or best / local > inputs.config.balancing_threshold):
        return local, source, best, True
    # Recompute what a known remote prefix would add; with none known, the worker may still
    # find blocks the index has not heard of yet (events lag writes by a fraction of a second).
    return local, "", 0, best <= local


def _plan(
    inputs: Inputs, worker: WorkerLoad, queue_seconds: float, way: Way, own: Own | None = None
) -> Choice:
    """The TTFT of running on `worker` (whose queue takes `queue_seconds`) its way: with
    its local prefix, plus the prefix from a source (up to its source blocks) when the way
    names one. `own`: _own of the way, when known."""
    local_blocks, source, source_blocks, load_prefix = way
    fetch_blocks, prefix_tokens, seconds = own or _own(
        inputs, worker.block_size, local_blocks, source_blocks
    )
    wait = getattr(inputs.cost, "request_overhead", 0.0) + queue_seconds
    return Choice(
        worker.worker_id,
        "",
        wait + seconds,
        0.0,
        prefix_tokens,
        source,
        fetch_blocks,
        source_blocks,
        load_prefix,
        seconds,
    )


def _own(
    inputs: Inputs,
    block_size: int,
    local_blocks: int,
    source_blocks: int,
    prefills: dict[int, float] | None = None,
) -> Own:
    """(blocks fetched, prefix tokens, seconds of fetch and prefill) of the request on a
    worker holding `local_blocks`, loading up to `source_blocks` from elsewhere.
    `prefills`: the request's prefill seconds by prefix tokens, kept from call to call (the
    routes of one request mostly end with the same prefix, from wherever it comes)."""
    cost, n = inputs.cost, inputs.request.num_prompt_tokens
    fetch_blocks = max(0, source_blocks - local_blocks)
    prefix_tokens = min(max(local_blocks, source_blocks) * block_size, n - 1)
    prefills = {} if prefills is None else prefills
    if prefix_tokens not in prefills:
        prefills[prefix_tokens] = estimate.prefill_time(cost, n, prefix_tokens)
    return (
        fetch_blocks,
        prefix_tokens,
        (estimate.transfer_time(cost, fetch_blocks, block_size) + prefills[prefix_tokens]),
    )


def _most_free(workers: Sequence[WorkerLoad]) -> WorkerLoad:
    return max(workers, key=lambda w: (w.free_blocks, -w.num_running, w.worker_id))


def _least_tbt(inputs: Inputs, rows: np.ndarray) -> WorkerLoad:
    """Least (predicted TBT, id) among the workers at `rows` with room for the prompt now;
    among all of them, if none has. (Rows go by id: the first least is the lowest id's.)"""
    n, view = inputs.request.num_prompt_tokens, inputs.snapshot.decode_view()
    if n + 1 > view.least_free_tokens():  # some have no room now
        roomy = rows[view.free_tokens[rows] >= n + 1]
        rows = roomy if len(roomy) else rows
    times = view.tbts(rows, n, inputs.cost)
    return view.by_row[rows[times.argmin()]]


def _fitting_decode(inputs: Inputs) -> np.ndarray:
    """Rows (of the snapshot's DecodeView) of the decode candidates whose KV pool can hold
    the prompt and its first token."""
    request, view = inputs.request, inputs.snapshot.decode_view()
    need = request.num_prompt_tokens + 1
    # NOTE: need <= blocks * block_size is ceil(need / block_size) <= blocks, without a call
    if not request.exclude and need <= view.least_total_tokens():
        return view.rows
    fits = view.total_tokens >= need
    for worker_id in request.exclude:
        if worker_id in view.row:
            fits[view.row[worker_id]] = False
    return np.flatnonzero(fits)


def _decode_loads(inputs: Inputs, rows: np.ndarray) -> Sequence[WorkerLoad]:
    """The workers at `rows`, in snapshot order."""
    view = inputs.snapshot.decode_view()
    if rows is view.rows:
        return inputs.snapshot.decode
    chosen = {view.by_row[i].worker_id for i in rows.tolist()}
    return [w for w in inputs.snapshot.decode if w.worker_id in chosen]


def _candidates(workers: tuple[WorkerLoad, ...], request: PlacementRequest) -> Sequence[WorkerLoad]:
    if not request.exclude:
        return workers
    return [w for w in workers if w.worker_id not in request.exclude]
