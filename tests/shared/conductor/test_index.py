"""The prefix index, kept from KV events, and what the conductor does with dead workers."""

from __future__ import annotations

from shared.conductor.index import PrefixIndex
from shared.messages import KVEvent
from tests.shared.conductor.builders import beat, conductor, request

PROMPT = (1, 2, 3, 4)


def index_of(*events: KVEvent) -> PrefixIndex:
    index = PrefixIndex()
    for event in events:
        index.apply(event)
    return index


def stored(source: str, *hashes: int, service: str = "prefill") -> KVEvent:
    return KVEvent(source, service, stored=hashes)


def test_match_counts_leading_blocks_per_worker_and_in_the_pool() -> None:
    index = index_of(stored("p0", 1, 2, 3), stored("p1", 1, 2), stored("s0", 1, service="kvstore"))
    match = index.match(PROMPT, ["p0", "p1"])
    assert (match.by_worker, match.pool_blocks) == ({"p0": 3, "p1": 2}, 1)


def test_walk_stops_at_the_first_missing_block() -> None:
    index = index_of(stored("p0", 1, 2, 4, 5))  # block 3 evicted on its own
    assert index.walk((1, 2, 3, 4, 5, 6), ["p0"]).by_worker == {"p0": 2}


def test_match_agrees_with_walk_on_leading_runs() -> None:
    prompt = tuple(range(1, 40))
    index = index_of(
        *(stored(f"p{n}", *prompt[:n]) for n in (0, 1, 2, 17, 38, 39)),
        stored("s0", *prompt[:23], service="kvstore"),
    )
    workers = [f"p{n}" for n in (0, 1, 2, 17, 38, 39)]
    assert index.match(prompt, workers) == index.walk(prompt, workers)
    assert index.match(prompt, workers).by_worker["p17"] == 17


def test_the_pool_is_every_kvstore_node_together() -> None:
    index = index_of(stored("s0", 1, 3, service="kvstore"), stored("s1", 2, service="kvstore"))
    assert index.match(PROMPT, []).pool_blocks == 3


def test_a_prefill_worker_holding_a_block_does_not_put_it_in_the_pool() -> None:
    assert index_of(stored("p0", 1, 2)).match(PROMPT, ["p0"]).pool_blocks == 0


def test_the_pooled_count_is_the_distinct_blocks_some_kvstore_holds() -> None:
    index = index_of(
        stored("p0", 1, 2, 5),
        stored("s0", 1, 3, service="kvstore"),
        stored("s1", 3, 4, service="kvstore"),
    )
    assert (len(index), index.num_pooled) == (5, 3)
    index.apply(KVEvent("s1", "kvstore", removed=(3, 4)))
    assert (len(index), index.num_pooled) == (4, 2)  # s0 still holds 3; 4 is gone
    index.forget("s0")
    assert (len(index), index.num_pooled) == (3, 0)


def test_only_the_workers_asked_for_are_matched() -> None:
    match = index_of(stored("p0", 1, 2), stored("p1", 1)).match(PROMPT, ["p1", "p9"])
    assert match.by_worker == {"p1": 1}  # p9 holds none: left out


def test_removed_blocks_end_the_match_there() -> None:
    index = index_of(stored("p0", 1, 2, 3), KVEvent("p0", "prefill", removed=(2,)))
    assert index.match(PROMPT, ["p0"]).by_worker == {"p0": 1}


def test_forget_drops_a_workers_blocks_and_keeps_the_others() -> None:
    index = index_of(stored("p0", 1, 2, 3), stored("p1", 1))
    index.forget("p0")
    assert len(index) == 1 and index.match(PROMPT, ["p0", "p1"]).by_worker == {"p1": 1}


def test_the_conductor_ignores_decode_kv_events() -> None:
    core = conductor()
    core.apply(stored("d0", 1, 2, service="decode"))
    assert len(core.index) == 0


def test_a_snapshot_event_replaces_what_the_conductor_knew() -> None:
    core = conductor()
    core.apply(stored("p0", 1, 2, 3))
    core.apply(KVEvent("p0", "prefill", stored=(7,), snapshot=True))
    assert len(core.index) == 1 and core.index.match(PROMPT, ["p0"]).by_worker == {}


def test_a_dead_workers_blocks_leave_the_index() -> None:
    core = conductor(prefill=("p0", "p1"), decode=("d0",))
    core.apply(stored("p0", *PROMPT))
    for worker, service in (("p1", "prefill"), ("d0", "decode")):
        core.observe(beat(worker, service, time=3.0))
    assert core.forget_dead(now=3.5) == ["p0"]
    assert core.index.match(PROMPT, ["p0"]).by_worker == {}


def test_a_dead_worker_gets_no_work_and_no_one_fetches_from_it() -> None:
    core = conductor(prefill=("p0", "p1"), decode=("d0",))
    core.apply(stored("p0", *PROMPT))
    for worker, service in (("p1", "prefill"), ("d0", "decode")):
        core.observe(beat(worker, service, time=3.0))
    placement = core.place(request(64, hashes=PROMPT), 3.5)
    assert (placement.prefill_id, placement.prefix_peer) == ("p1", "")
    assert len(core.index) == 0


def test_a_dead_decode_workers_bookings_are_forgotten() -> None:
    core = conductor(decode=("d0", "d1"), admission="predictive")
    assert core.place(request(1000), 0.0).decode_id == "d0"
    for worker, service in (("p0", "prefill"), ("d1", "decode")):
        core.observe(beat(worker, service, time=3.0))
    core.forget_dead(now=3.5)
    assert "d0" not in core.ledger.bookings
