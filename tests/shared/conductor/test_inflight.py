"""Prefixes on their way into a worker's cache."""

from __future__ import annotations

import itertools

from shared.conductor.inflight import InflightPrefixes, _common_run
from shared.conductor.snapshot import PrefixMatch


def test_the_shared_run_of_two_chained_prompts_is_found_by_halving() -> None:
    base = tuple(range(1, 41))
    for cut, extra in itertools.product(range(41), (0, 3)):
        other = base[:cut] + tuple(range(1000, 1000 + extra))
        assert _common_run(base, other) == cut  # chained: they part once, for good


def test_an_entry_lengthens_only_its_workers_run_and_expires() -> None:
    inflight = InflightPrefixes()
    inflight.placed("p1", (1, 2, 3, 4), prefill_end=5.0)
    index_match = PrefixMatch({"p0": 2}, pool_blocks=1)
    longer = inflight.extend(index_match, (1, 2, 3, 4, 5), now=1.0)
    assert (longer.local("p1"), longer.local("p0"), longer.pool_blocks) == (4, 2, 1)
    assert longer.sender_blocks() == {"p0": 2}  # p1 has nothing to send yet
    assert inflight.extend(index_match, (1, 2, 3, 4, 5), now=6.5) is index_match  # expired
    assert inflight.by_first == {}


def test_entries_go_when_their_time_is_up_whatever_prompts_come_later() -> None:
    """A long-lived conductor must not keep every prompt it ever placed: entries expire by
    time, also under first blocks no later prompt shares."""
    inflight = InflightPrefixes()
    for first in range(100):
        inflight.placed("p0", (first, first + 1000), prefill_end=float(first))
    inflight.extend(PrefixMatch({}), (5000,), now=49.5)  # another first block
    assert sorted(inflight.by_first) == list(range(49, 100))
    inflight.extend(PrefixMatch({}), (), now=200.0)
    assert inflight.by_first == {}
