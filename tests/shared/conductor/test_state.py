"""Cluster state from heartbeats, and work assigned since the last beat."""

from __future__ import annotations

import pytest

from shared.conductor.loads import Pending
from shared.conductor.state import ClusterState
from tests.shared.conductor.builders import beat, conductor, prefill_s, request


def test_a_worker_that_misses_three_beats_is_dead_and_forgotten() -> None:
    state = ClusterState()
    state.observe(beat("p0", "prefill", time=10.0))
    assert [hb.worker_id for hb in state.live("prefill", now=12.9)] == ["p0"]
    assert state.live("prefill", now=13.1) == []
    assert state.forget_dead(now=13.1) == ["p0"]
    assert state.snapshot(now=13.1).prefill == ()


def test_draining_workers_get_no_new_work() -> None:
    state = ClusterState()
    state.observe(beat("d0", "decode", time=0.0, draining=True))
    assert state.snapshot(now=0.5).decode == ()


def test_assigned_work_counts_until_the_next_heartbeat() -> None:
    state = ClusterState()
    state.observe(beat("p0", "prefill", time=0.0, queued=10))
    state.observe(beat("d0", "decode", time=0.0, free=100, total=100))
    state.assign("p0", 300)
    state.assign("d0", 33)  # three blocks of 16
    snap = state.snapshot(now=0.5)
    assert snap.prefill[0].queued_tokens == 310 and snap.prefill[0].num_waiting == 1
    assert snap.decode[0].free_blocks == 97
    state.observe(beat("p0", "prefill", time=1.0, queued=0))
    assert state.snapshot(now=1.1).prefill[0].queued_tokens == 0


def test_a_worker_past_its_last_beat_leaves_the_snapshot_before_it_is_forgotten() -> None:
    state = ClusterState()
    state.observe(beat("p0", "prefill", time=10.0))
    assert len(state.snapshot(now=12.0).prefill) == 1
    assert state.snapshot(now=13.1).prefill == ()


def test_a_worker_that_starts_draining_leaves_the_snapshot() -> None:
    state = ClusterState()
    state.observe(beat("d0", "decode", time=0.0))
    assert len(state.snapshot(now=0.1).decode) == 1
    state.observe(beat("d0", "decode", time=0.2, draining=True))
    assert state.snapshot(now=0.3).decode == ()


def test_work_assigned_after_a_snapshot_shows_in_the_next() -> None:
    state = ClusterState()
    state.observe(beat("p0", "prefill", time=0.0))
    state.snapshot(now=0.1)
    state.assign("p0", 300, 0.4)
    assert state.snapshot(now=0.2).prefill[0].pending == Pending(300, 1, 0.4)


def test_a_forgotten_worker_that_beats_again_is_back() -> None:
    state = ClusterState()
    state.observe(beat("p0", "prefill", time=0.0))
    state.forget_dead(now=5.0)
    state.observe(beat("p0", "prefill", time=6.0))
    assert [w.worker_id for w in state.snapshot(now=6.1).prefill] == ["p0"]


# the conductor's bookkeeping between beats


def test_a_burst_between_beats_spreads_over_workers() -> None:
    core = conductor(prefill=("p0", "p1"), decode=("d0", "d1"))
    picks = [core.place(request(1000, f"r{i}"), 0.1) for i in range(4)]
    assert [(p.prefill_id, p.decode_id) for p in picks] == [("p0", "d0"), ("p1", "d1")] * 2


def test_a_burst_books_predicted_seconds_and_tokens_as_pending() -> None:
    core = conductor(prefill=("p0", "p1"), decode=("d0", "d1"))
    for i in range(4):
        core.place(request(1000, f"r{i}"), 0.1)
    p0 = core.state.pending["p0"]
    assert (p0.tokens, p0.requests) == (2000, 2)
    assert p0.seconds == pytest.approx(2 * prefill_s(1000))
    assert core.state.pending["d1"] == Pending(2002, 2, 0.0)  # decode: until its beat


def test_pending_prefill_work_expires_when_it_is_predicted_done() -> None:
    core = conductor(prefill=("p0",), decode=("d0",))
    first = core.place(request(1000, "r0"), 0.1)
    done = 0.1 + first.predicted_ttft
    assert core.state.pending["p0"].until == pytest.approx(done)
    core.state.snapshot(done - 1e-3)
    assert "p0" in core.state.pending
    second = core.place(request(1000, "r1"), done + 1e-3)  # no beat came in between
    assert second.predicted_ttft == pytest.approx(first.predicted_ttft)
    assert "d0" in core.state.pending


def test_later_placements_in_a_burst_predict_the_queue_of_earlier_ones() -> None:
    core = conductor()
    first, second = (core.place(request(1000, f"r{i}"), 0.1) for i in range(2))
    assert second.predicted_ttft == pytest.approx(first.predicted_ttft + prefill_s(1000))


def test_load_balance_spreads_a_burst_by_pending_tokens() -> None:
    core = conductor(prefill=("p0", "p1", "p2"), policy="load-balance")
    picks = [core.place(request(1000, f"r{i}"), 0.1).prefill_id for i in range(3)]
    assert sorted(picks) == ["p0", "p1", "p2"]


def test_a_heartbeat_replaces_what_was_pending_on_that_worker() -> None:
    core = conductor(prefill=("p0", "p1"))
    core.place(request(1000, "r0"), 0.1)
    core.place(request(1000, "r1"), 0.1)
    core.observe(beat("p0", "prefill", 0.2))
    assert "p0" not in core.state.pending and core.state.pending["p1"].requests == 1
    assert core.place(request(1000, "r2"), 0.3).prefill_id == "p0"


def test_a_decode_booking_stays_pending_until_a_beat_can_report_it() -> None:
    """A decode worker reports a request once its KV has landed (its first token): beats
    before that cannot count it, so the conductor keeps counting it itself."""
    state = ClusterState()
    state.observe(beat("d0", "decode", time=0.0, free=100, total=100))
    state.assign("d0", 33, reported_from=2.5)  # KV predicted to land at 2.5 s
    state.assign("d0", 17)  # reported by the next beat
    state.observe(beat("d0", "decode", time=1.0, free=100, total=100))
    load = state.snapshot(now=1.1).decode[0]
    assert load.pending == Pending(33, 1) and load.free_blocks == 97
    state.observe(beat("d0", "decode", time=2.0, free=100, total=100))
    assert state.snapshot(now=2.1).decode[0].pending == Pending(33, 1)
    state.observe(beat("d0", "decode", time=3.0, free=97, total=100))  # it reports it now
    assert state.snapshot(now=3.1).decode[0].pending == Pending()
    assert state.arriving == {}


def test_a_prefill_in_progress_counts_in_the_queue_time() -> None:
    """A worker that reports one prefill under way and none waiting is busy."""
    core = conductor()
    core.observe(beat("p0", "prefill", time=0.0, running=1, queued=500))
    core.observe(beat("p1", "prefill", time=0.0))
    core.observe(beat("d0", "decode", time=0.0, free=100, total=100))
    assert core.place(request(100), now=0.1).prefill_id == "p1"


def test_a_prompt_placed_behind_its_previous_turn_counts_that_turns_blocks_as_local() -> None:
    """The next turn arrives while the previous one is still queued: the worker it was
    placed on will hold its blocks before anything placed now starts there, but it cannot
    send them to a peer yet."""
    core = conductor(prefill=("p0", "p1"), policy="kvcentric")
    first = core.place(request(1600, "t1", hashes=tuple(range(1, 101))), now=0.0)
    follow_up = request(3200, "t2", hashes=tuple(range(1, 201)))
    snapshot = core.state.snapshot(0.01)
    prefix = core.inflight.extend(
        core.index.match(follow_up.block_hashes, snapshot.prefill_view().ids),
        follow_up.block_hashes,
        0.01,
    )
    assert prefix.local(first.prefill_id) == 100
    assert prefix.best_remote("").blocks == 0  # nothing to send anyone yet
    other = "p1" if first.prefill_id == "p0" else "p0"
    core.observe(beat(other, "prefill", time=0.01, waiting=1, queued=1500))  # less busy
    placement = core.place(follow_up, now=0.02)
    assert placement.prefill_id == first.prefill_id
    assert not placement.load_prefix  # its own cache will hold them: load nothing shorter
    core.forget(first.prefill_id)
    assert core.inflight.by_first == {}
