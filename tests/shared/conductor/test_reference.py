"""The fast paths of a decision answer exactly as plain references do: views kept between
snapshots (a ranking of queues, decode columns) and the prefix search (a shortcut for
the common single known end). The policies' reference is Algorithm 1 itself
(shared/conductor/kvcentric.py; test_kvcentric.py)."""

from __future__ import annotations

import random

from shared.conductor.index import _leading_run
from shared.conductor.snapshot import ClusterSnapshot
from shared.conductor.state import ClusterState
from shared.conductor.views import LoadViews
from tests.shared.conductor.builders import COST, beat

# a reference, as the search was first written


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
