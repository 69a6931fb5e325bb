"""Placement policies: pure functions of a cluster snapshot, a request and a seed.

The live conductor and the simulator call the same functions, so what a simulation
shows is what the cluster does. Each returns a Choice (with the predicted TTFT and TBT
that admission compares with the SLOs) or a Rejection when no worker can take the request.

`kvcentric` and `cache-aware` are Mooncake's Algorithm 1, stated worker by worker in
kvcentric.py. Here they run fast (workers that would take the same route are weighed
together, in C), and tests/shared/conductor/test_kvcentric.py checks that they decide
exactly as the statement does.
"""

from __future__ import annotations

import functools
import operator
import random as _random
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from shared.conductor import estimate
from shared.conductor.config import SchedulingConfig
from shared.conductor.loads import WorkerLoad
from shared.conductor.snapshot import ClusterSnapshot, PrefixMatch, Remote
from shared.conductor.views import PrefillView
from shared.costmodel import CostModel
from shared.errors import no_worker
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
    transfer_seconds: float = 0.0  # of those, loading the prefix from its source


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str
    retry_after: float


@dataclass(frozen=True, slots=True)
class Inputs:
    """Everything a policy reads: the cluster, the request, how to predict times, and the
    two numbers that make a policy repeatable without state of its own."""

    snapshot: ClusterSnapshot
    request: PlacementRequest
    prefix: PrefixMatch
    config: SchedulingConfig
    cost: CostModel
    turn: int = 0  # placements the conductor's policy made before this one: round-robin's
    seed: int = 0  # random's randomness; the conductor passes request_seed(request)


def request_seed(request: PlacementRequest) -> int:
    """A decision's seed, from the request id: the same request is placed alike (a second
    simulation of a trace, a replay)."""
    return zlib.crc32(request.request_id.encode())


Policy = Callable[[Inputs], "Choice | Rejection"]


class Way(NamedTuple):
    """How a prefill worker gets the prompt's prefix: the blocks it holds, plus up to
    `source_blocks` loaded from `source` ("": nothing remote)."""

    local_blocks: int
    source: str
    source_blocks: int
    load_prefix: bool  # False: it recomputes what it does not hold


class Own(NamedTuple):
    """What a way costs the request itself on a worker, its queue aside."""

    fetch_blocks: int
    prefix_tokens: int
    seconds: float  # of fetch and prefill
    transfer: float  # of those, the fetch


class Best(NamedTuple):
    """The least (TTFT, id) so far, and how that worker gets the prompt's prefix."""

    ttft: float
    worker_id: str
    way: Way
    own: Own


Route = Callable[[Inputs, int, int, Remote], Way]  # (inputs, block size, local blocks, remote)


def random(inputs: Inputs) -> Choice | Rejection:
    """Any prefill and any fitting decode worker, drawn with the decision's seed."""
    rng = _random.Random(inputs.seed)
    return _place(
        inputs,
        lambda ws: _plan_default(inputs, rng.choice(ws)),
        lambda rows: rng.choice(_decode_loads(inputs, rows)),
    )


def round_robin(inputs: Inputs) -> Choice | Rejection:
    """Prefill workers in turn (by id), whatever their load or cache."""
    return _place(
        inputs,
        lambda ws: _plan_default(
            inputs, sorted(ws, key=lambda w: w.worker_id)[inputs.turn % len(ws)]
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
    """kvcentric.cache_aware, fast: least predicted TTFT counting only each worker's own
    cached prefix (it recomputes the rest); the decode worker with the least TBT."""
    return _place(
        inputs, lambda _: _fastest(inputs, _route_local), lambda rows: _least_tbt(inputs, rows)
    )


def kvcentric(inputs: Inputs) -> Choice | Rejection:
    """kvcentric.kvcentric (Mooncake's Algorithm 1), fast: per prefill worker, TTFT =
    transfer of the best remote prefix when it is `balancing_threshold` times the local
    one (else the local prefix alone) + queue + prefill; the least wins. The decode worker
    with the least predicted TBT."""
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
        return Rejection(no_worker(missing), inputs.config.retry_after)
    choice, chosen = choose_prefill(prefill), choose_decode(decode)
    tbt = estimate.decode_tbt(chosen, request.num_prompt_tokens, inputs.cost)
    return Choice(  # NOTE: built directly; _replace costs more
        choice.prefill_id,
        chosen.worker_id,
        choice.ttft,
        tbt,
        choice.prefix_tokens,
        choice.fetch_from,
        choice.fetch_blocks,
        choice.source_blocks,
        choice.load_prefix,
        choice.busy_seconds,
        choice.transfer_seconds,
    )


def _fastest(inputs: Inputs, route: Route) -> Choice:
    """The plan with the least (TTFT, id), each worker on its route: Algorithm 1's loop
    (kvcentric.py), fast. A route depends on a worker only through its block size and
    local match, so the own time (fetch and prefill) of each pair is predicted once and the
    TTFTs of its workers are compared in C. The workers that hold nothing share a route
    per block size: the shortest queue of those wins (_coldest).

    Every worker's best remote source is taken to be the longest match anywhere. For the
    worker that holds it, Algorithm 1 looks at the others' instead, but those are no
    longer than its own, so it fetches nothing either way (as it would from itself)."""
    view = inputs.snapshot.prefill_view()
    queue = view.queue_seconds(inputs.cost)
    overhead = getattr(inputs.cost, "request_overhead", 0.0)
    remote = inputs.prefix.best_remote("")
    prefills: dict[int, float] = {}  # the request's prefill seconds by prefix tokens
    best: Best | None = None
    for (block_size, local_blocks), workers in _holders(inputs, view).items():
        way = route(inputs, block_size, local_blocks, remote)
        own = _own(inputs, block_size, local_blocks, way.source_blocks, prefills)
        ttft, worker_id = _least_ttft(workers, queue, overhead, own.seconds)
        if best is None or (ttft, worker_id) < (best.ttft, best.worker_id):
            best = Best(ttft, worker_id, way, own)
    for block_size in view.block_sizes():
        cold = _cold(inputs, view, block_size)
        first = next(cold, None)
        if first is None:
            continue
        way = route(inputs, block_size, 0, remote)
        own = _own(inputs, block_size, 0, way.source_blocks, prefills)
        ttft, worker_id = _coldest(first, cold, queue, overhead, own.seconds)
        if best is None or (ttft, worker_id) < (best.ttft, best.worker_id):
            best = Best(ttft, worker_id, way, own)
    assert best is not None, "_place calls with a prefill candidate"
    worker = view.by_id[best.worker_id]
    return _plan(inputs, worker, queue[best.worker_id], best.way, best.own)


def _least_ttft(
    workers: list[str], queue: dict[str, float], overhead: float, own_seconds: float
) -> tuple[float, str]:
    """The least (TTFT, id) among `workers` of one route, the TTFT summed as _plan sums
    it ((overhead + queue seconds) + own seconds), in C (map, zip, min): up to all
    prefill workers share a route."""
    waits = map(functools.partial(operator.add, overhead), map(queue.__getitem__, workers))
    ttfts = map(functools.partial(operator.add, own_seconds), waits)
    return min(zip(ttfts, workers))


def _coldest(
    first: str, ranked: Iterator[str], queue: dict[str, float], overhead: float, own_seconds: float
) -> tuple[float, str]:
    """_least_ttft of `first` and `ranked`, workers of one route in order of (queue seconds,
    id): the TTFT never decreases along them, so the first's is the least, and a later
    worker ties only while its TTFT rounds to the same (then the lowest id wins)."""
    ttft, least = (overhead + queue[first]) + own_seconds, first
    for worker_id in ranked:
        if (overhead + queue[worker_id]) + own_seconds != ttft:
            break
        least = min(least, worker_id)
    return ttft, least


def _holders(inputs: Inputs, view: PrefillView) -> dict[tuple[int, int], list[str]]:
    """The candidates that hold some of the prompt, by (block size, local blocks)."""
    exclude, routes = inputs.request.exclude, {}
    for local_blocks, workers in inputs.prefix.holders().items():
        if exclude or not all(map(view.by_id.__contains__, workers)):
            workers = [w for w in workers if w in view.by_id and w not in exclude]
        for block_size, alike in _by_block_size(workers, view):
            routes[(block_size, local_blocks)] = alike
    return routes


def _cold(inputs: Inputs, view: PrefillView, block_size: int) -> Iterator[str]:
    """The candidates of `block_size` that hold none of the prompt, in order of (queue
    seconds, id), lazily (mostly one or two are looked at)."""
    local, exclude = inputs.prefix.by_worker, inputs.request.exclude
    same_size = view.block_size is not None
    return (
        w
        for _, w in view.ranking(inputs.cost)
        if not local.get(w)
        and w not in exclude
        and (same_size or view.by_id[w].block_size == block_size)
    )


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
    if remote.blocks > local:
        return Way(local, remote.source, remote.blocks, True)
    return Way(local, "", 0, True)


def _route_local(inputs: Inputs, block_size: int, local: int, remote: Remote) -> Way:
    return Way(local, "", 0, False)


def _route_kvcentric(inputs: Inputs, block_size: int, local: int, remote: Remote) -> Way:
    best = remote.blocks
    if best <= local:
        # nothing longer known; the worker may still find blocks the index has not heard
        # of yet (events lag writes by a fraction of a second)
        return Way(local, "", 0, True)
    fetch = Way(local, remote.source, best, True)
    if local == 0 or best / local > inputs.config.balancing_threshold:
        return fetch
    # Algorithm 1 recomputes below the threshold; loading is kept where it is faster (it
    # also spares the worker's compute for the requests behind this one)
    if _own(inputs, block_size, local, best).seconds < _own(inputs, block_size, local, 0).seconds:
        return fetch
    return Way(local, "", 0, False)


def _plan(
    inputs: Inputs, worker: WorkerLoad, queue_seconds: float, way: Way, own: Own | None = None
) -> Choice:
    """The TTFT of running on `worker` (whose queue takes `queue_seconds`) its way: with
    its local prefix, plus the prefix from a source (up to its source blocks) when the way
    names one. `own`: _own of the way, when known."""
    if own is None:
        own = _own(inputs, worker.block_size, way.local_blocks, way.source_blocks)
    wait = getattr(inputs.cost, "request_overhead", 0.0) + queue_seconds
    return Choice(
        worker.worker_id,
        "",
        wait + own.seconds,
        0.0,
        own.prefix_tokens,
        way.source,
        own.fetch_blocks,
        way.source_blocks,
        way.load_prefix,
        own.seconds,
        own.transfer,
    )


def _own(
    inputs: Inputs,
    block_size: int,
    local_blocks: int,
    source_blocks: int,
    prefills: dict[int, float] | None = None,
) -> Own:
    """The request's own time on a worker holding `local_blocks`, loading up to
    `source_blocks` from elsewhere. `prefills`: the request's prefill seconds by prefix
    tokens, kept from call to call (the routes of one request mostly end with the same
    prefix, from wherever it comes)."""
    cost, n = inputs.cost, inputs.request.num_prompt_tokens
    fetch_blocks = max(0, source_blocks - local_blocks)
    prefix_tokens = min(max(local_blocks, source_blocks) * block_size, n - 1)
    prefills = {} if prefills is None else prefills
    if prefix_tokens not in prefills:
        prefills[prefix_tokens] = estimate.prefill_time(cost, n, prefix_tokens)
    transfer = estimate.transfer_time(cost, fetch_blocks, block_size)
    return Own(fetch_blocks, prefix_tokens, transfer + prefills[prefix_tokens], transfer)


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
