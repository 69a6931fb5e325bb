"""The fast paths of a decision decide exactly as plain references do, worker by worker:
the prefill choice of kvcentric and cache-aware (workers grouped by shape, a ranking of
queues kept between snapshots), the decode choice (one argmin over columns in id order),
and the prefix search (a shortcut for the common single known end)."""

from __future__ import annotations

import random

import numpy as np

from shared.conductor import estimate
from shared.conductor.index import _leading_run
from shared.conductor.loads import Pending, WorkerLoad
from shared.conductor.policies import Choice, Inputs, cache_aware, kvcentric
from shared.conductor.snapshot import ClusterSnapshot, PrefixMatch
from shared.conductor.state import ClusterState
from shared.conductor.views import LoadViews
from shared.costmodel import roofline
from tests.shared.conductor.builders import COST, beat, inputs, request

ROOFLINE = roofline("llama3-70b", "a800")


# references, as the policies were first written


def reference_choice(inp: Inputs, recompute_only: bool) -> Choice:
    """The least (TTFT, id) prefill worker, each on its own route: every one that holds some
    of the prompt, and of those that hold none the one with the shortest queue (they share
    a route); the least (TBT, id) decode worker with room for the prompt (any fitting one,
    if none has)."""
    request, prefix, cost = inp.request, inp.prefix, inp.cost
    n = request.num_prompt_tokens
    candidates = [w for w in inp.snapshot.prefill if w.worker_id not in request.exclude]
    warm = [w for w in candidates if prefix.by_worker.get(w.worker_id)]
    cold = [w for w in candidates if not prefix.by_worker.get(w.worker_id)]
    if cold:
        warm.append(min(cold, key=lambda w: (estimate.prefill_queue_time(w, cost), w.worker_id)))
    plans = [reference_plan(inp, w, recompute_only) for w in warm]
    best = min(plans, key=lambda c: (c.ttft, c.prefill_id))
    fitting = [
        w
        for w in inp.snapshot.decode
        if w.worker_id not in request.exclude and n + 1 <= w.total_blocks * w.block_size
    ]
    roomy = [w for w in fitting if n + 1 <= w.free_blocks * w.block_size] or fitting
    times = cost.decode_step_times(
        np.array([w.num_running + w.num_waiting + 1.0 for w in roomy]),
        np.array([w.context_tokens + n + 0.0 for w in roomy]),
    )
    chosen = min(zip(times.tolist(), (w.worker_id for w in roomy), roomy))[2]
    return best._replace(decode_id=chosen.worker_id, tbt=estimate.decode_tbt(chosen, n, cost))


def reference_plan(inp: Inputs, worker: WorkerLoad, recompute_only: bool) -> Choice:
    prefix, cost, n = inp.prefix, inp.cost, inp.request.num_prompt_tokens
    local = prefix.by_worker.get(worker.worker_id, 0)
    peers = sorted((-b, w) for w, b in prefix.by_worker.items() if b > 0 and w != worker.worker_id)
    source, best = (peers[0][1], -peers[0][0]) if peers else ("", 0)
    if best <= prefix.pool_blocks:
        source, best = "kvstore", prefix.pool_blocks
    fetch = best > local and (local == 0 or best / local > inp.config.balancing_threshold)
    if recompute_only or not fetch:
        source, source_blocks, load = "", 0, not recompute_only and best <= local
    else:
        source_blocks, load = best, True
    fetch_blocks = max(0, source_blocks - local)
    prefix_tokens = min(max(local, source_blocks) * worker.block_size, n - 1)
    own = estimate.transfer_time(cost, fetch_blocks, worker.block_size) + estimate.prefill_time(
        cost, n, prefix_tokens
    )
    wait = getattr(cost, "request_overhead", 0.0) + estimate.prefill_queue_time(worker, cost)
    return Choice(
        worker.worker_id,
        "",
        wait + own,
        0.0,
        prefix_tokens,
        source,
        fetch_blocks,
        source_blocks,
        load,
        own,
    )


def reference_run(hashes: list[int], held: set[int], ends: list[int]) -> int:
    """The prefix search probe by probe: the known ends first, then bisection."""
    lo, hi, i, j = 0, len(hashes), 0, len(ends)
    while i < j:
        k = (i + j) // 2
        if hashes[ends[k] - 1] in held:
            lo, i = ends[k], k + 1
        else:
            hi, j = ends[k] - 1, k
    if 0 < lo < hi:
        lo, hi = (lo + 1, hi) if hashes[lo] in held else (lo, lo)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if hashes[mid - 1] in held else (lo, mid - 1)
    if lo and lo not in ends:
        ends.append(lo)
        ends.sort()
    return lo


# random clusters and matches


def random_inputs(rng: random.Random) -> Inputs:
    sizes = (16,) if rng.random() < 0.7 else (16, 32)
    prefill = [
        prefill_worker(
            f"p{i}",
            waiting,
            waiting * rng.choice((0, 700, 1500)),
            Pending(*rng.choice(((0, 0), (300, 1))), rng.choice((0.0, 0.25))),
            rng.choice(sizes),
        )
        for i, waiting in enumerate(rng.choices((0, 0, 1, 2), k=rng.randint(1, 9)))
    ]
    decode = [
        WorkerLoad(
            f"d{i}",
            "decode",
            rng.randint(0, 9),
            rng.choice((0, 1)),
            0,
            rng.choice((3, 80, 1000)),
            rng.choice((80, 1000)),
            16,
            rng.choice((0, 2000, 9000)),
        )
        for i in rng.sample(range(12), rng.randint(1, 8))
    ]
    holders = [w.worker_id for w in prefill] + ["gone"]
    by_worker = {
        w: rng.choice((0, 3, 40, 40, 90)) for w in rng.sample(holders, rng.randint(0, len(holders)))
    }
    exclude = tuple(rng.sample([w.worker_id for w in prefill + decode], rng.choice((0, 0, 1))))
    req = request(rng.choice((200, 1600, 3000)), f"r{rng.random()}", exclude=exclude)
    return inputs(
        prefill,
        decode,
        req,
        PrefixMatch(by_worker, rng.choice((0, 3, 60, 200))),
        balancing_threshold=rng.choice((1.0, 1.5, 3.0)),
    )


def prefill_worker(
    worker_id: str, waiting: int, queued: int, pending: Pending, block_size: int
) -> WorkerLoad:
    return WorkerLoad(
        worker_id,
        "prefill",
        0,
        waiting + pending.requests,
        queued + pending.tokens,
        1000,
        1000,
        block_size,
        pending=pending,
    )


def test_kvcentric_and_cache_aware_choose_as_the_worker_by_worker_reference() -> None:
    rng = random.Random(13)
    for cost in (COST, ROOFLINE):
        for _ in range(1500):
            inp = random_inputs(rng)
            inp = Inputs(inp.snapshot, inp.request, inp.prefix, inp.config, cost)
            for policy, recompute_only in ((kvcentric, False), (cache_aware, True)):
                choice = policy(inp)
                if isinstance(choice, Choice):
                    assert choice == reference_choice(inp, recompute_only)


def test_views_kept_between_snapshots_equal_views_of_fresh_ones() -> None:
    rng, state, now = random.Random(17), ClusterState(), 0.0
    workers = [("prefill", f"p{i}") for i in range(5)] + [("decode", f"d{i}") for i in range(4)]
    for _ in range(2000):
        now += rng.choice((0.0, 0.01, 0.3, 1.2))
        service, worker_id = rng.choice(workers)
        if rng.random() < 0.4:
            state.observe(
                beat(
                    worker_id,
                    service,
                    now,
                    waiting=rng.randint(0, 3),
                    queued=rng.randint(0, 5000),
                    running=rng.randint(0, 8),
                    context=rng.randint(0, 9000),
                    free=rng.randint(0, 1000),
                    total=rng.choice((1000, 2000)),
                    draining=rng.random() < 0.05,
                )
            )
        else:
            state.assign(worker_id, rng.randint(1, 3000), rng.random(), now + rng.random())
        kept = state.snapshot(now)
        fresh = ClusterSnapshot(now, kept.prefill, kept.decode, LoadViews())
        assert derived(kept) == derived(fresh)


def derived(snapshot: ClusterSnapshot) -> tuple:
    prefill, decode = snapshot.prefill_view(), snapshot.decode_view()
    return (
        prefill.ids,
        prefill.by_id,
        prefill.block_size,
        prefill.queue_seconds(COST),
        prefill.ranking(COST),
        decode.by_row,
        decode.batch.tolist(),
        decode.context.tolist(),
        decode.free_tokens.tolist(),
        decode.total_tokens.tolist(),
        decode.least_free_tokens() if snapshot.decode else None,
        decode.least_total_tokens() if snapshot.decode else None,
    )


def test_the_search_probes_as_the_reference_with_holes_and_known_ends() -> None:
    rng = random.Random(19)
    for _ in range(20_000):
        hashes = list(range(rng.randint(1, 40)))
        held = {h for h in hashes if rng.random() < rng.choice((0.5, 0.9, 1.0))}
        ends = sorted({rng.randint(1, len(hashes)) for _ in range(rng.choice((0, 1, 1, 2, 3)))})
        mine, theirs = list(ends), list(ends)
        assert _leading_run(hashes, held, mine) == reference_run(hashes, held, theirs)
        assert mine == theirs
