"""The conductor end to end without I/O: placements, replication and counters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.messages import KVEvent
from tests.shared.conductor.builders import (
    OVERHEAD,
    beat,
    conductor,
    prefill_s,
    request,
    step_s,
    transfer_s,
)

PROMPT = tuple(range(1, 101))  # 100 blocks: 1600 tokens


def hot_cluster(**config):
    """p0 holds the whole prompt but has five prefills of 1000 tokens queued; p1 is idle."""
    core = conductor(prefill=("p0", "p1"), **config)
    core.apply(KVEvent("p0", "prefill", stored=PROMPT))
    core.observe(beat("p0", "prefill", 0.0, waiting=5, queued=5000))
    return core


def test_a_hot_holder_is_replicated_to_an_idle_worker() -> None:
    core = hot_cluster()
    placement = core.place(request(1600, hashes=PROMPT), 0.1)
    assert (placement.prefill_id, placement.prefix_peer, placement.prefix_peer_blocks) == (
        "p1",
        "p0",
        100,
    )
    assert placement.load_prefix
    assert (core.counters.replications, core.counters.replicated_blocks) == (1, 100)


def test_the_placement_carries_the_predicted_times() -> None:
    placement = hot_cluster().place(request(1600, hashes=PROMPT), 0.1)
    assert placement.predicted_ttft == pytest.approx(
        OVERHEAD + transfer_s(100) + prefill_s(1, 1599)
    )
    assert placement.predicted_tbt == pytest.approx(step_s(1, 1600))


def test_cache_aware_never_replicates() -> None:
    core = hot_cluster(policy="cache-aware")
    placement = core.place(request(1600, hashes=PROMPT), 0.1)
    assert (placement.prefill_id, placement.prefix_peer, placement.load_prefix) == ("p1", "", False)
    assert core.counters.replications == 0


def test_a_prefix_from_the_kvstore_names_no_peer_but_is_a_replication() -> None:
    core = conductor(prefill=("p0",))
    core.observe(beat("s0", "kvstore"))
    core.apply(KVEvent("s0", "kvstore", stored=PROMPT[:8]))
    placement = core.place(request(1600, hashes=PROMPT), 0.1)
    assert (placement.prefix_peer, placement.prefix_peer_blocks, placement.load_prefix) == (
        "",
        0,
        True,
    )
    assert (core.counters.replications, core.counters.replicated_blocks) == (1, 8)


@pytest.mark.parametrize("caches", [True, False])
def test_a_prompt_placed_again_at_once_loads_the_pool_unless_its_worker_will_hold_it(caches):
    """The first placement predicts the prompt's blocks in p0's cache once its prefill is
    done (inflight.py), so the second waits for that rather than loading the shorter pool
    prefix; a worker without a prefix cache (--no-prefix-cache) will not hold them, so the
    second loads from the pool."""
    core = conductor(prefill=())
    core.observe(replace(beat("p0", "prefill"), caches_prefixes=caches))
    core.observe(beat("s0", "kvstore"))
    core.apply(KVEvent("s0", "kvstore", stored=PROMPT[:60]))
    core.place(request(1600, "first", hashes=PROMPT), 0.1)
    again = core.place(request(1600, "again", hashes=PROMPT), 0.2)
    assert again.load_prefix is not caches


def test_counters_split_accepted_rejected_and_unplaceable() -> None:
    core = conductor(admission="early", slo_ttft=1.0)
    core.place(request(100, "fits"), 0.0)
    core.place(request(2000, "too-slow"), 0.0)  # TTFT 2.015 s
    core.place(request(100, "nowhere", exclude=("p0",)), 0.0)
    counters = core.counters
    assert (counters.accepted, counters.rejected, counters.unplaceable) == (1, 1, 1)


def test_a_rejection_tells_the_client_when_to_retry() -> None:
    placement = conductor(admission="early", slo_ttft=1.0, retry_after=4.0).place(
        request(2000), 0.0
    )
    assert not placement.accepted and placement.retry_after == 4.0
    assert "TTFT" in placement.reason


def test_rejected_requests_book_nothing() -> None:
    core = conductor(admission="early", slo_ttft=1.0)
    core.place(request(2000), 0.0)
    assert not core.state.pending and not core.ledger.bookings


def test_admitted_requests_are_booked_from_their_predicted_first_token() -> None:
    core = conductor(admission="predictive", decode_time=5.0)
    placement = core.place(request(1000), 2.0)
    [booking] = core.ledger.bookings["d0"]
    assert (booking.start, booking.end, booking.context_tokens) == (
        pytest.approx(2.0 + placement.predicted_ttft),
        pytest.approx(7.0 + placement.predicted_ttft),
        1000,
    )


def test_ended_bookings_are_pruned_when_placing() -> None:
    core = conductor(admission="predictive", decode_time=1.0)
    core.place(request(1000, "old"), 0.0)
    core.observe(beat("p0", "prefill", 2.5))
    core.observe(beat("d0", "decode", 2.5))
    core.place(request(1000, "new"), 2.5)
    assert len(core.ledger.bookings["d0"]) == 1


def test_heartbeats_of_other_services_are_ignored() -> None:
    core = conductor()
    core.observe(beat("g0", "gateway"))
    assert set(core.state.heartbeats) == {"p0", "d0"}


def test_a_worker_that_stops_cleanly_is_forgotten_at_once() -> None:
    core = conductor(prefill=("p0", "p1"), decode=("d0",))
    core.apply(KVEvent("p1", "prefill", stored=(11, 12)))
    core.observe(replace(beat("p1", "prefill", 0.5, draining=True), stopped=True))
    assert [hb.worker_id for hb in core.state.live("prefill", 0.6)] == ["p0"]
    assert "p1" not in core.state.heartbeats and len(core.index) == 0


def test_a_restarted_worker_keeps_its_place_but_not_its_old_cache() -> None:
    core = conductor(prefill=(), decode=("d0",))
    core.observe(replace(beat("p0", "prefill", 0.0), instance="first"))
    core.apply(KVEvent("p0", "prefill", stored=(11, 12)))
    core.observe(replace(beat("p0", "prefill", 0.5), instance="first"))
    assert len(core.index) == 2
    core.observe(replace(beat("p0", "prefill", 5.0), instance="second"))
    assert len(core.index) == 0
    assert [hb.worker_id for hb in core.state.live("prefill", 5.1)] == ["p0"]


def test_a_second_process_cannot_take_the_id_of_a_worker_that_beats() -> None:
    core = conductor(prefill=(), decode=("d0",))
    core.observe(replace(beat("p0", "prefill", 0.0), instance="real"))
    core.apply(KVEvent("p0", "prefill", stored=(11, 12)))
    core.observe(replace(beat("p0", "prefill", 0.5), instance="impostor"))
    core.observe(replace(beat("p0", "prefill", 0.6), instance="impostor", stopped=True))
    assert core.state.heartbeats["p0"].instance == "real" and len(core.index) == 2
    assert core.counters.impostor_beats == 2
    # once the holder went quiet (a crash), a new process may take the id
    core.observe(replace(beat("p0", "prefill", 2.0), instance="restarted"))
    assert core.state.heartbeats["p0"].instance == "restarted" and len(core.index) == 0


def test_kv_events_count_only_from_registered_workers() -> None:
    core = conductor(prefill=("p0",), decode=("d0",))
    core.apply(KVEvent("stranger", "prefill", stored=(21, 22)))
    assert len(core.index) == 0
    # an event that arrives just before its source's first beat is applied on that beat
    core.observe(beat("stranger", "prefill", 0.1))
    assert len(core.index) == 2
    core.apply(KVEvent("ghost", "kvstore", stored=tuple(range(100, 200))))
    core.place(request(1600, hashes=tuple(range(100, 200))), 0.2)
    assert core.counters.replications == 0  # never placed on blocks nobody vouched for


def test_waiting_events_are_bounded() -> None:
    core = conductor(prefill=("p0",), decode=("d0",))
    for i in range(500):
        core.apply(KVEvent(f"s{i}", "prefill", stored=(i,)))
    for i in range(500):
        core.apply(KVEvent("s499", "prefill", stored=(1000 + i,)))
    waiting = core.unregistered.by_source
    assert len(waiting) <= core.unregistered.max_sources
    assert len(waiting["s499"]) == core.unregistered.max_events


def test_round_robin_takes_its_turn_from_the_conductor() -> None:
    """Turns are the conductor's: a second conductor starts again at the first worker."""
    first, second = (conductor(prefill=("p0", "p1", "p2"), policy="round-robin") for _ in range(2))
    picks = [first.place(request(request_id=f"r{i}"), 0.1).prefill_id for i in range(4)]
    assert picks == ["p0", "p1", "p2", "p0"]
    assert second.place(request(), 0.1).prefill_id == "p0"


def test_a_request_no_worker_can_take_takes_no_turn() -> None:
    core = conductor(prefill=("p0", "p1"), decode=("d0",), policy="round-robin")
    assert not core.place(request(request_id="a", exclude=("d0",)), 0.1).accepted
    assert core.place(request(request_id="b"), 0.1).prefill_id == "p0"
    assert core.turns == 1
