"""Placement policies on constructed snapshots: each decision and each predicted time is
checked against numbers computed by hand from the builders' cost model."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from shared.conductor.loads import Pending
from shared.conductor.policies import (
    POLICIES,
    Choice,
    Rejection,
    cache_aware,
    kvcentric,
    load_balance,
    random,
    round_robin,
)
from shared.conductor.snapshot import PrefixMatch
from tests.shared.conductor.builders import (
    COST,
    OVERHEAD,
    decode_worker,
    inputs,
    prefill_s,
    prefill_worker,
    request,
    step_s,
    transfer_s,
)

PREFILL3 = [prefill_worker("p0"), prefill_worker("p1"), prefill_worker("p2")]
DECODE2 = [decode_worker("d0"), decode_worker("d1")]


def chosen(choice: Choice | Rejection) -> tuple[str, str]:
    assert isinstance(choice, Choice), choice
    return choice.prefill_id, choice.decode_id


# random and round-robin


def test_random_is_repeatable_for_one_request_id() -> None:
    same = inputs(PREFILL3, DECODE2, request(request_id="req-7"))
    assert chosen(random(same)) == chosen(random(same))


def test_random_spreads_over_all_workers_across_request_ids() -> None:
    picks = [
        chosen(random(inputs(PREFILL3, DECODE2, request(request_id=f"req-{i}")))) for i in range(40)
    ]
    assert {p for p, _ in picks} == {"p0", "p1", "p2"}
    assert {d for _, d in picks} == {"d0", "d1"}


def test_round_robin_cycles_through_prefill_workers_by_id() -> None:
    busy_p0 = [
        prefill_worker("p2"),
        prefill_worker("p0", waiting=9, queued=9000),
        prefill_worker("p1"),
    ]
    seq = [chosen(round_robin(inputs(busy_p0, DECODE2, turn=turn)))[0] for turn in range(6)]
    assert seq == ["p0", "p1", "p2", "p0", "p1", "p2"]


def test_round_robin_is_a_function_of_its_turn() -> None:
    once, again = (round_robin(inputs(PREFILL3, DECODE2, turn=4)) for _ in range(2))
    assert chosen(once) == chosen(again) == ("p1", "d1")


def test_random_draws_from_the_seed_it_is_given() -> None:
    same_request = [inputs(PREFILL3, DECODE2, request(request_id="req-7")) for _ in range(2)]
    reseeded = [replace(i, seed=seed) for i in same_request for seed in range(20)]
    assert len({chosen(random(i)) for i in reseeded}) > 1


# load-balance


def test_load_balance_picks_least_queued_prefill_and_most_free_decode() -> None:
    choice = load_balance(
        inputs(
            [
                prefill_worker("p0", waiting=1, queued=500),
                prefill_worker("p1", waiting=1, queued=20),
            ],
            [decode_worker("d0", free=10), decode_worker("d1", free=900)],
        )
    )
    assert chosen(choice) == ("p1", "d1")


def test_load_balance_counts_pending_tokens_as_queued() -> None:
    assigned = prefill_worker("p0", pending=Pending(800, 1, 0.8))
    reported = prefill_worker("p1", waiting=1, queued=500)
    assert load_balance(inputs([assigned, reported], DECODE2)).prefill_id == "p1"


# cache-aware


def test_cache_aware_prefers_the_longest_local_prefix_and_recomputes_the_rest() -> None:
    prefix = PrefixMatch({"p0": 50, "p1": 0})
    choice = cache_aware(
        inputs([prefill_worker("p0"), prefill_worker("p1")], DECODE2, prefix=prefix)
    )
    assert choice.prefill_id == "p0" and choice.prefix_tokens == 800
    assert choice.ttft == pytest.approx(OVERHEAD + prefill_s(800, 800))
    assert not choice.load_prefix and choice.fetch_from == "" and choice.fetch_blocks == 0


def test_cache_aware_ignores_prefixes_it_would_have_to_fetch() -> None:
    prefix = PrefixMatch({"p0": 10}, pool_blocks=100)
    choice = cache_aware(inputs([prefill_worker("p0")], DECODE2, prefix=prefix))
    assert choice.prefix_tokens == 160 and choice.fetch_from == "" and not choice.load_prefix


def test_cache_aware_leaves_the_holder_when_its_queue_makes_ttft_worse() -> None:
    holder = prefill_worker("p0", waiting=2, queued=2000)  # 2 x prefill(1000) queued
    prefix = PrefixMatch({"p0": 50, "p1": 0})
    choice = cache_aware(inputs([holder, prefill_worker("p1")], DECODE2, prefix=prefix))
    assert OVERHEAD + 2 * prefill_s(1000) + prefill_s(800, 800) > OVERHEAD + prefill_s(1600)
    assert choice.prefill_id == "p1"
    assert choice.ttft == pytest.approx(OVERHEAD + prefill_s(1600))


# kvcentric: the balancing threshold (Algorithm 1)


def kv_alone(local: int, pool: int, cost=COST, **config) -> Choice:
    made = inputs(
        [prefill_worker("p0")],
        DECODE2,
        prefix=PrefixMatch({"p0": local}, pool_blocks=pool),
        **config,
    )
    return kvcentric(dataclasses.replace(made, cost=cost))


# loading a block takes 16 ms on it, computing one 14.4 ms: below the balancing threshold,
# kvcentric recomputes as Algorithm 1 does
SLOW_LINK = dataclasses.replace(COST, link_bw=1e8)


def test_kvcentric_recomputes_below_the_threshold_when_loading_is_slower() -> None:
    choice = kv_alone(local=4, pool=5, cost=SLOW_LINK)  # 5/4 = 1.25 <= 1.5
    assert (choice.fetch_from, choice.fetch_blocks, choice.load_prefix) == ("", 0, False)
    assert choice.prefix_tokens == 64
    assert choice.ttft == pytest.approx(OVERHEAD + prefill_s(1600 - 64, 64))


def test_kvcentric_loads_below_the_threshold_when_that_is_faster() -> None:
    choice = kv_alone(local=4, pool=5)  # 5/4 = 1.25 <= 1.5, but a block loads in 2.6 ms
    assert (choice.fetch_from, choice.fetch_blocks, choice.load_prefix) == ("kvstore", 1, True)
    assert choice.ttft == pytest.approx(OVERHEAD + transfer_s(1) + prefill_s(1600 - 80, 80))


def test_kvcentric_leaves_loading_on_when_no_remote_prefix_is_known() -> None:
    # the index may not have heard of blocks written a moment ago: let the worker look
    choice = kv_alone(local=4, pool=0)
    assert (choice.fetch_from, choice.fetch_blocks, choice.load_prefix) == ("", 0, True)
    assert kv_alone(local=0, pool=0).load_prefix


def test_kvcentric_threshold_is_strict() -> None:
    assert kv_alone(local=4, pool=6, cost=SLOW_LINK).fetch_blocks == 0  # 6/4 = 1.5, not above


def test_kvcentric_fetches_when_remote_is_above_the_threshold() -> None:
    choice = kv_alone(local=4, pool=8)  # 8/4 = 2 > 1.5
    assert (choice.fetch_from, choice.fetch_blocks, choice.source_blocks) == ("kvstore", 4, 8)
    assert choice.load_prefix and choice.prefix_tokens == 128
    assert choice.ttft == pytest.approx(OVERHEAD + transfer_s(4) + prefill_s(1600 - 128, 128))


def test_kvcentric_threshold_comes_from_the_config() -> None:
    assert kv_alone(local=4, pool=8, cost=SLOW_LINK, balancing_threshold=3.0).fetch_blocks == 0


def test_kvcentric_nothing_local_counts_as_an_infinite_ratio() -> None:
    choice = kv_alone(local=0, pool=1)
    assert (choice.fetch_from, choice.fetch_blocks, choice.prefix_tokens) == ("kvstore", 1, 16)


def test_kvcentric_fetches_from_a_peer_that_holds_more_than_the_pool() -> None:
    workers = [prefill_worker("p0"), prefill_worker("p1", waiting=9, queued=9000)]
    prefix = PrefixMatch({"p0": 4, "p1": 8}, pool_blocks=2)
    choice = kvcentric(inputs(workers, DECODE2, prefix=prefix))
    assert (choice.prefill_id, choice.fetch_from, choice.fetch_blocks) == ("p0", "p1", 4)


def test_kvcentric_hot_holder_with_long_queue_loses_to_an_idle_fetcher() -> None:
    hot = prefill_worker("p0", waiting=5, queued=5000)  # 5 x prefill(1000) queued
    prefix = PrefixMatch({"p0": 100, "p1": 0})
    choice = kvcentric(inputs([hot, prefill_worker("p1")], DECODE2, prefix=prefix))
    assert (choice.prefill_id, choice.fetch_from, choice.fetch_blocks) == ("p1", "p0", 100)
    # all 100 blocks cached: one token is still computed, for the first output token
    assert choice.prefix_tokens == 1599
    assert choice.ttft == pytest.approx(OVERHEAD + transfer_s(100) + prefill_s(1, 1599))


def test_kvcentric_ttft_is_overhead_transfer_queue_and_prefill() -> None:
    worker = prefill_worker("p0", waiting=1, queued=500, pending=Pending(300, 1, 0.2))
    choice = kvcentric(inputs([worker], DECODE2, prefix=PrefixMatch({"p0": 2}, pool_blocks=8)))
    own = transfer_s(6) + prefill_s(1600 - 128, 128)
    assert choice.busy_seconds == pytest.approx(own)
    assert choice.ttft == pytest.approx(OVERHEAD + prefill_s(500) + 0.2 + own)


# decode selection


def test_decode_is_the_least_predicted_tbt() -> None:
    decode = [
        decode_worker("d0", running=10, context=10_000),
        decode_worker("d1", running=2, context=2000),
    ]
    choice = kvcentric(inputs([prefill_worker("p0")], decode))
    assert choice.decode_id == "d1" and choice.tbt == pytest.approx(step_s(3, 2000 + 1600))


def test_decode_prefers_a_worker_with_room_for_the_prompt() -> None:
    decode = [
        decode_worker("d0", running=10, context=10_000),
        decode_worker("d1", running=2, context=2000, free=100),
    ]  # 1601 tokens: 101
    choice = kvcentric(inputs([prefill_worker("p0")], decode))
    assert choice.decode_id == "d0" and choice.tbt == pytest.approx(step_s(11, 11_600))


def test_decode_without_room_anywhere_is_still_the_least_tbt() -> None:
    decode = [decode_worker("d0", running=10, free=5), decode_worker("d1", running=2, free=5)]
    assert kvcentric(inputs([prefill_worker("p0")], decode)).decode_id == "d1"


# exclusions and rejections, for every policy


@pytest.mark.parametrize("name", list(POLICIES))
def test_excluded_workers_are_skipped(name: str) -> None:
    req = request(exclude=("p0", "d1"))
    for _ in range(3):
        assert chosen(
            POLICIES[name](inputs([prefill_worker("p0"), prefill_worker("p1")], DECODE2, req))
        ) == ("p1", "d0")


@pytest.mark.parametrize("name", list(POLICIES))
def test_no_prefill_worker_is_a_rejection_with_retry_after(name: str) -> None:
    rejection = POLICIES[name](inputs([], DECODE2, retry_after=3.5))
    assert isinstance(rejection, Rejection) and "prefill" in rejection.reason
    assert rejection.retry_after == 3.5


@pytest.mark.parametrize("name", list(POLICIES))
def test_all_workers_excluded_is_a_rejection(name: str) -> None:
    rejection = POLICIES[name](
        inputs([prefill_worker("p0")], DECODE2, request(exclude=("d0", "d1")))
    )
    assert isinstance(rejection, Rejection) and "decode" in rejection.reason


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_prompt_larger_than_any_decode_pool_is_rejected(name: str) -> None:
    small = [decode_worker("d0", free=4, total=4)]  # 64 tokens
    rejection = POLICIES[name](inputs([prefill_worker("p0")], small, request(num_tokens=64)))
    assert isinstance(rejection, Rejection) and "decode" in rejection.reason


def test_a_prompt_that_just_fits_the_decode_pool_is_placed() -> None:
    small = [decode_worker("d0", free=4, total=4)]
    assert chosen(kvcentric(inputs([prefill_worker("p0")], small, request(num_tokens=63)))) == (
        "p0",
        "d0",
    )
