"""Where a prompt's prefix comes from: the rules live and simulated prefill share."""

from shared.prefill.prefix import (
    KVSTORE,
    PrefixPlan,
    after_fetch,
    after_reserve,
    load_failure,
    plan_prefix,
    source_kind,
    usable_blocks,
)


def test_one_prompt_token_is_always_computed():
    assert usable_blocks(num_prompt_tokens=64, num_hashes=4, block_size=16) == 3
    assert usable_blocks(num_prompt_tokens=65, num_hashes=4, block_size=16) == 4
    assert usable_blocks(num_prompt_tokens=100, num_hashes=2, block_size=16) == 2


def test_the_pool_extends_the_local_run():
    assert plan_prefix(usable=6, local=2, pool_blocks=3) == PrefixPlan(2, 3, KVSTORE)


def test_nothing_beyond_the_local_cache_keeps_it_local():
    assert plan_prefix(usable=6, local=2, pool_blocks=0) == PrefixPlan(2)
    assert plan_prefix(usable=6, local=4, pool_blocks=0, peer="p1", peer_blocks=3) == (
        PrefixPlan(4)
    )


def test_the_named_peer_wins_only_when_it_holds_more():
    assert plan_prefix(6, 1, 2, peer="p1", peer_blocks=5) == PrefixPlan(1, 4, "p1")
    assert plan_prefix(6, 1, 2, peer="p1", peer_blocks=3) == PrefixPlan(1, 2, KVSTORE)


def test_a_peer_is_asked_for_no_more_than_the_usable_blocks():
    assert plan_prefix(3, 0, 0, peer="p1", peer_blocks=10) == PrefixPlan(0, 3, "p1")


def test_a_reservation_may_find_more_local_blocks():
    plan = PrefixPlan(1, 4, "p1")
    assert after_reserve(plan, 3) == PrefixPlan(3, 2, "p1")


def test_a_fetch_that_does_not_start_is_computed_instead():
    plan = PrefixPlan(1, 4, "p1")
    assert after_fetch(plan, started=True) is plan
    assert after_fetch(plan, started=False) == PrefixPlan(1)
    assert after_fetch(plan, started=False).blocks == 1


def test_loads_count_as_kvstore_or_peer():
    assert source_kind(KVSTORE) == "kvstore" and source_kind("prefill-03") == "peer"


def test_a_failed_layer_says_why():
    assert load_failure("connection reset", 2) == "loading the prefix failed: connection reset"
    assert "layer 2 did not arrive in time" in load_failure("", 2)
