"""KV events split into messages NATS accepts, snapshots marked on their first part."""

from __future__ import annotations

from shared import codec
from shared.kvpool.events import HASHES_PER_EVENT, kv_events


def test_a_quiet_interval_publishes_nothing() -> None:
    assert kv_events("p0", "prefill", [], []) == []


def test_an_empty_snapshot_is_still_sent_so_the_index_forgets() -> None:
    [event] = kv_events("p0", "prefill", [], snapshot=True)
    assert event.snapshot and event.stored == ()


def test_a_large_snapshot_is_chunked_and_only_the_first_part_resets() -> None:
    hashes = [(1 << 64) - 1 - i for i in range(2 * HASHES_PER_EVENT + 5)]  # xxh3_64 sized
    events = kv_events("k0", "kvstore", hashes, [7, 8], snapshot=True)
    assert [e.snapshot for e in events] == [True, False, False, False]
    assert [h for e in events for h in e.stored] == hashes
    assert events[-1].removed == (7, 8)
    assert all(len(codec.encode(e)) < 1 << 20 for e in events)  # NATS' default max payload
