from loadgen.sim.cache import BlockCache, BlockPool


def test_lru_evicts_the_tails_of_old_prompts_first():
    cache = BlockCache(4)
    cache.touch([1, 2, 3])
    cache.touch([7, 8])  # one over: the old prompt's last block goes
    assert 3 not in cache and cache.leading([1, 2, 3], 3) == 2
    cache.touch([1])  # used again: now the most recent
    cache.touch([9])
    assert list(cache.blocks) == [8, 7, 1, 9]  # least recently used first


def test_events_are_netted_until_taken():
    cache = BlockCache(2)
    cache.touch([1, 2])
    cache.touch([3])  # evicts 2 (the tail), never published as stored
    stored, removed = cache.take_events()
    assert (stored, removed) == ([1, 3], [2])
    assert cache.take_events() == ([], [])


def test_the_pool_holds_what_any_cache_holds():
    pool = BlockPool()
    a, b = BlockCache(2, pool), BlockCache(2, pool)
    a.touch([1, 2])
    b.touch([1, 5])
    assert pool.leading([1, 2, 9], 0, 3) == 2
    b.touch([6, 7])  # b drops 1 and 5; a still holds 1
    assert pool.leading([1, 5], 0, 2) == 1
    assert pool.leading([4, 1, 2], 1, 3) == 2


def test_leading_stops_at_the_first_miss():
    cache = BlockCache(10)
    cache.touch([1, 2, 4])
    assert cache.leading([1, 2, 3, 4], 4) == 2
    assert cache.leading([1, 2, 3, 4], 1) == 1
    assert cache.holds_all([2, 4]) and not cache.holds_all([2, 3])
