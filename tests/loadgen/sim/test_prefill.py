import pytest

from loadgen.sim.cache import BlockCache, BlockPool
from loadgen.sim.job import Job
from loadgen.sim.prefill import PrefillNode, full_blocks, job_prefix_plan, job_usable_blocks
from shared.messages import Placement
from shared.prefill.prefix import PrefixPlan
from tests.loadgen.sim.builders import COST, row

HASHES = (1, 2, 3, 4, 5)


def job(load_prefix: bool = True, peer: str = "", peer_blocks: int = 0, tokens: int = 2200) -> Job:
    j = Job(0, "r", row(0.0, tokens, 2, prefix=HASHES), 0.0)
    j.placement = Placement(
        "r",
        True,
        "p0",
        "d0",
        prefix_peer=peer,
        prefix_peer_blocks=peer_blocks,
        load_prefix=load_prefix,
    )
    return j


@pytest.fixture
def caches():
    pool = BlockPool()
    mine, other = BlockCache(100, pool), BlockCache(100, pool)
    mine.touch([1])
    other.touch([1, 2, 3])
    return mine, pool, {"p0": mine, "p1": other}


def test_one_token_is_always_computed_and_partial_blocks_are_not_named():
    assert job_usable_blocks(job(tokens=2048)) == 3  # 4 full blocks, the last token computed
    assert full_blocks(job(tokens=2200)) == (1, 2, 3, 4)


def test_loads_the_longest_run_the_pool_holds_beyond_its_own(caches):
    mine, pool, peers = caches
    assert job_prefix_plan(job(), mine, pool, peers) == PrefixPlan(1, 2, "kvstore")


def test_recomputes_when_told_not_to_load(caches):
    mine, pool, peers = caches
    assert job_prefix_plan(job(load_prefix=False), mine, pool, peers) == PrefixPlan(1)


def test_a_peer_that_lacks_a_block_sends_none(caches):
    mine, pool, peers = caches
    assert job_prefix_plan(job(peer="p1", peer_blocks=4), mine, pool, peers) == PrefixPlan(1)
    peers["p1"].touch([1, 2, 3, 4])
    assert job_prefix_plan(job(peer="p1", peer_blocks=4), mine, None, peers) == PrefixPlan(
        1, 3, "p1"
    )


def test_a_node_runs_its_queue_in_order_and_caches_what_it_prefilled():
    node = PrefillNode("p0", COST, BlockCache(100))
    first, second = job(), job()
    node.enqueue(first, PrefixPlan())
    node.enqueue(second, PrefixPlan(2))
    assert node.heartbeat(0.0, 1.0).num_waiting == 2
    node.start_next(0.0, PrefixPlan())
    second_seconds = COST.prefill_time(2200 - 1024, 1024)
    assert node.queue_seconds(0.5) == pytest.approx(node.busy_until - 0.5 + second_seconds)
    assert node.finish() is first and 4 in node.cache and 5 not in node.cache
    assert node.kv_landed(first) == pytest.approx(COST.prefill_time(2200, 0))


def test_with_a_cost_model_a_prefix_loads_only_where_loading_beats_computing(caches):
    """The worker's rule (shared/prefill/worth.py) with the node's cost model: the same
    fetch on a link a million times slower is computed instead."""
    import dataclasses

    mine, pool, peers = caches
    assert job_prefix_plan(job(), mine, pool, peers, COST) == PrefixPlan(1, 2, "kvstore")
    slow = dataclasses.replace(COST, link_bw=1e3)
    assert job_prefix_plan(job(), mine, pool, peers, slow) == PrefixPlan(1)
