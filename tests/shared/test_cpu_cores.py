"""The plan of which cores each model worker computes on: disjoint runs when there are
enough cores, else one core each dealt round-robin; never more threads than cores
when it can be helped."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.cpu_cores import format_cores, parse_cores, plan_cores
from shared.errors import KvstackError


def test_two_cores_give_prefill_and_decode_one_each() -> None:
    assert plan_cores([0, 1], ["prefill-0", "decode-0"]) == {
        "prefill-0": (0,),
        "decode-0": (1,),
    }


def test_one_worker_gets_every_core() -> None:
    assert plan_cores([3, 1, 2, 0], ["serve"]) == {"serve": (0, 1, 2, 3)}


def test_uneven_cores_go_to_the_first_workers_in_contiguous_runs() -> None:
    plan = plan_cores([0, 1, 2, 3, 4, 8, 9], ["prefill-0", "decode-0", "decode-1"])
    assert plan == {"prefill-0": (0, 1, 2), "decode-0": (3, 4), "decode-1": (8, 9)}


def test_more_workers_than_cores_share_one_core_each_round_robin() -> None:
    plan = plan_cores([0, 1], ["p0", "p1", "d0", "d1", "a0"])
    assert plan == {"p0": (0,), "p1": (1,), "d0": (0,), "d1": (1,), "a0": (0,)}


@given(
    cores=st.sets(st.integers(0, 255), min_size=1, max_size=64),
    num_workers=st.integers(1, 80),
)
def test_no_core_is_oversubscribed_beyond_what_the_counts_force(cores, num_workers) -> None:
    workers = [f"w{i}" for i in range(num_workers)]
    plan = plan_cores(sorted(cores), workers)
    assert set(plan) == set(workers)
    load = Counter(core for assigned in plan.values() for core in assigned)
    assert set(load) <= cores
    assert all(assigned for assigned in plan.values())
    assert max(load.values()) == -(-num_workers // len(cores)) if num_workers > len(cores) else 1
    if num_workers <= len(cores):  # disjoint and all used: threads == cores in total
        assert sum(len(a) for a in plan.values()) == len(cores)
        sizes = [len(a) for a in plan.values()]
        assert max(sizes) - min(sizes) <= 1


def test_a_plan_needs_cores_and_unique_workers() -> None:
    with pytest.raises(KvstackError, match="no CPU core"):
        plan_cores([], ["serve"])
    with pytest.raises(KvstackError, match="unique"):
        plan_cores([0, 1], ["decode-0", "decode-0"])


def test_core_lists_read_and_write_as_taskset_does() -> None:
    assert parse_cores("0-3,8") == (0, 1, 2, 3, 8)
    assert parse_cores(" 5 , 2-3 ") == (2, 3, 5)
    assert format_cores((8, 0, 1, 2, 3)) == "0-3,8"
    assert format_cores((1, 3)) == "1,3"
    for bad in ("", "a", "3-1", "-1", "1-", "0,,2"):
        with pytest.raises(KvstackError, match="--cores"):
            parse_cores(bad)
