"""What the conductor remembers between decisions (loads in the cluster state, the ranking
of prefix matches, queue times in the views) answers exactly as computing it afresh does;
test_reference.py checks the views and the decisions built on them."""

from __future__ import annotations

import random

from shared.conductor.loads import NO_PENDING, WorkerLoad
from shared.conductor.snapshot import ClusterSnapshot, PrefixMatch
from shared.conductor.state import ClusterState
from shared.costmodel import roofline
from tests.shared.conductor.builders import COST, beat, prefill_worker

WORKERS = (
    [("prefill", f"p{i}") for i in range(5)]
    + [("decode", f"d{i}") for i in range(4)]
    + [("kvstore", "s0")]
)


def afresh(state: ClusterState, now: float) -> ClusterSnapshot:
    """The snapshot as computed without caches: every live worker's beat plus pending."""
    return ClusterSnapshot(
        now,
        *(
            tuple(
                WorkerLoad.from_heartbeat(hb, state.pending.get(hb.worker_id, NO_PENDING))
                for hb in state.live(s, now)
            )
            for s in ("prefill", "decode")
        ),
    )


def test_snapshots_equal_fresh_ones_through_beats_assignments_drains_and_deaths() -> None:
    rng, state, now = random.Random(11), ClusterState(), 0.0
    for _ in range(3000):
        now += rng.choice((0.0, 0.01, 0.3, 1.0, 2.9, 3.5))
        op = rng.random()
        service, worker_id = rng.choice(WORKERS)
        if op < 0.4:
            state.observe(
                beat(
                    worker_id,
                    service,
                    now,
                    interval=rng.choice((0.5, 1.0)),
                    waiting=rng.randint(0, 3),
                    queued=rng.randint(0, 5000),
                    running=rng.randint(0, 8),
                    context=rng.randint(0, 9000),
                    free=rng.randint(0, 1000),
                    draining=rng.random() < 0.1,
                )
            )
        elif op < 0.7:
            state.assign(worker_id, rng.randint(1, 3000), rng.random())
        elif op < 0.8:
            dead = [w for w, hb in state.heartbeats.items() if not state._alive(hb, now)]
            assert state.forget_dead(now) == dead
        assert state.snapshot(now) == afresh(state, now)


def test_a_silent_worker_leaves_snapshots_before_it_is_forgotten_and_returns_on_a_beat() -> None:
    state = ClusterState()
    state.observe(beat("p0", "prefill", 0.0))
    state.observe(beat("p1", "prefill", 2.5))
    assert [w.worker_id for w in state.snapshot(2.9).prefill] == ["p0", "p1"]
    assert [w.worker_id for w in state.snapshot(3.1).prefill] == ["p1"]
    state.observe(beat("p0", "prefill", 3.2))
    assert [w.worker_id for w in state.snapshot(3.3).prefill] == ["p0", "p1"]


def test_best_peer_is_the_longest_other_match_lowest_id_on_ties() -> None:
    rng = random.Random(5)
    for _ in range(300):
        by_worker = {f"w{i}": rng.choice((0, 0, 1, 3, 3, 7)) for i in range(rng.randint(0, 6))}
        match = PrefixMatch(by_worker, rng.randint(0, 8))
        for exclude in [*by_worker, "nobody"]:
            peers = sorted((-n, w) for w, n in by_worker.items() if w != exclude and n > 0)
            assert match.best_peer(exclude) == ((peers[0][1], -peers[0][0]) if peers else ("", 0))


def test_a_views_queue_times_belong_to_its_cost_model() -> None:
    loads = (prefill_worker("p0", waiting=2, queued=3000), prefill_worker("p1"))
    other = roofline("llama3-8b", "h100")
    view = ClusterSnapshot(0.0, loads, ()).prefill_view()
    for cost in (COST, other, COST):
        assert view.queue_seconds(cost) == {"p0": 2 * cost.prefill_time(1500, 0), "p1": 0.0}
        assert view.ranking(cost) == [(0.0, "p1"), (2 * cost.prefill_time(1500, 0), "p0")]
